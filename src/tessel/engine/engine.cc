// The engine's step loop.
#include "tessel/engine/engine.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <chrono>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <condition_variable>
#include <thread>
#include <atomic>
#include <optional>
#include <set>

#include "tessel/autograd/engine.h"
#include "tessel/ckpt/checkpoint.h"
#include "tessel/ckpt/peer_copies.h"
#include "tessel/engine/memory_copies.h"
#include "tessel/comm/thread_backend.h"
#include "tessel/comm/world.h"
#include "tessel/launch/signals.h"
#include "tessel/core/context.h"
#include "tessel/core/fault.h"
#include "tessel/core/log.h"
#include "tessel/core/storage.h"
#include "tessel/core/thread_pool.h"
#include "tessel/core/view.h"
#include "tessel/dist/dtensor.h"
#include "tessel/ops/ops.h"
#include "tessel/parallel/data.h"
#include "tessel/parallel/param_gather.h"
#include "tessel/engine/moe_metrics.h"
#include "tessel/engine/run_files.h"
#include "tessel/parallel/parallelize.h"
#include "tessel/parallel/pipeline.h"
#include "tessel/parallel/sharded_optimizer.h"

namespace tessel {

namespace {

// This rank's device for train.device: the CPU; for cuda each local rank its own GPU
// (LOCAL_RANK under `tessel launch`, else the rank); for the guarded test device one of its
// indices by rank. Collectives stage device memory through host copies (dist/comm_buffers.h)
// until the device has a backend of its own (NCCL).
Device rank_device(const std::string& name, int rank) {
  if (name == "cpu") return Device{};
  Device d = Device::parse(name);
  const int count = device_backend(Device{d.type, 0}).device_count();
  int local = rank;
  if (const char* lr = std::getenv("LOCAL_RANK"); lr != nullptr && *lr != '\0') local = std::atoi(lr);
  d.index = d.type == DeviceType::guarded ? local % count : local;
  TESSEL_CHECK(d.index < count, "train.device {}: local rank {} has no device of its own ({} present)", name, local,
               count);
  return d;
}

using Clock = std::chrono::steady_clock;
using namespace parallel;

}  // namespace

// Everything a rank sets up once: its model pieces, layout, schedule, optimizer shard, loaders.
struct Engine::State {
  RunConfig cfg;
  std::shared_ptr<ProcessGroup> world;
  std::unique_ptr<nn::LanguageModel> model;
  TrainingData data;
  std::unique_ptr<Layout> layout;
  Schedule schedule;
  int V = 1;
  std::vector<std::pair<int64_t, int64_t>> blocks;
  std::vector<nn::Parameter*> params;  // this rank's, in stage order
  bool first_stage = false, last_stage = false;
  std::unique_ptr<ShardedOptimizer> optimizer;
  optim::LrSchedule lr_schedule;
  std::optional<Sampler> sampler;
  std::optional<ShardedLoader> loader, val_loader;
  std::unique_ptr<PipelineRuntime> runtime;
  std::unique_ptr<ParamGather> gather;  // ZeRO-3: each unit's parameters gathered around its use
  int64_t next_step = 0;                // the step a fit starts from
  int64_t bytes_read = 0;               // by the last load
  MemoryCheckpoints in_memory;          // the in-memory checkpoints' folder and the ranks' machines

  bool lead() const { return world->rank() == 0; }
  // train.precision: bf16 mixed precision (the step's forward under AutocastScope).
  bool bf16() const { return cfg.train.precision == "bf16"; }
  int pp_rank() const { return static_cast<int>(layout->coord("pp")); }

  // Model chunk `chunk` on token ids `ids` (its first virtual stage) or on the hidden states
  // `x` (the others): the hidden states it passes on, or the logits on the last virtual stage.
  // Each unit runs through ZeRO-3's gathers when there are any; `ds` is restored before a
  // block's rerun under full recompute.
  Tensor run_chunk(int chunk, const Tensor& ids, Tensor x, const nn::DropoutState& ds) {
    const int vs = schedule.virtual_stage(pp_rank(), chunk);
    // Unit `u` of this chunk applied to `h` (by value: recompute runs it again in the backward).
    auto in_unit = [g = gather.get(), chunk](size_t u, std::function<Tensor(const Tensor&)> fn) {
      return [g, chunk, u, fn](const Tensor& h) { return g ? g->run(chunk, u, h, fn) : fn(h); };
    };
    nn::LanguageModel* lm = model.get();
    const nn::SequenceState ss = nn::sequence_state();  // restored with ds for a recompute
    size_t unit = 0;  // the next unit of this chunk
    if (vs == 0) {
      x = in_unit(unit++, [lm, &ids](const Tensor&) { return lm->embed(ids); })(Tensor());
      // The blocks start from the layout's activation placements (what a pipeline stage
      // receives, too): the embedding's rule may have split the hidden dim instead, a choice
      // that would otherwise carry into every block.
      const Placements want = layout->activation_placements();
      if (is_dist(x) && dist_attr(x).placements != want) x = reshard(x, dist_attr(x).mesh, want);
    }
    for (int64_t b = blocks[static_cast<size_t>(vs)].first; b < blocks[static_cast<size_t>(vs)].second; ++b, ++unit) {
      auto block = in_unit(unit, [lm, b](const Tensor& h) { return lm->block(b, h); });
      if (cfg.parallel.recompute == "full" && grad_enabled())
        x = recompute(block, x, [ds, ss] {
          nn::dropout_state() = ds;
          nn::sequence_state() = ss;
        });
      else
        x = block(x);
    }
    if (vs == V - 1) x = in_unit(unit, [lm](const Tensor& h) { return lm->head(h); })(x);
    return x;
  }

  // Model chunk `chunk` of micro-batch `m` of `batches` (training step `step`): the payload for
  // the next stage, or {the loss} on the last virtual stage.
  std::vector<Tensor> chunk_forward(const std::vector<MicroBatch>& batches, int64_t step, int chunk, int m,
                                    const std::vector<Tensor>& inputs) {
    const TrainSection& t = cfg.train;
    const MicroBatch& batch = batches[static_cast<size_t>(m)];
    const nn::DropoutState ds{.seed = t.seed, .step = static_cast<uint64_t>(step), .global_rows = t.global_batch,
                              .row_offset = batch.first_row};
    nn::dropout_state() = ds;
    nn::sequence_state() = nn::SequenceState{
        .positions = batch.positions, .doc_starts = batch.doc_starts, .cp_method = cfg.parallel.cp_method};
    AutocastScope precision(bf16());
    Tensor y = run_chunk(chunk, batch.inputs, inputs.empty() ? Tensor() : inputs[0], ds);
    if (schedule.virtual_stage(pp_rank(), chunk) == V - 1) return {cross_entropy(y, batch.targets)};
    // What crosses a stage boundary travels in f32 (the payload's dtype) whatever the precision.
    return {y.dtype() == DType::f32 ? y : cast(y, DType::f32)};
  }

  // This rank's part of a checkpoint at the step the engine stands at.
  CheckpointContent checkpoint_content() {
    CheckpointContent c;
    c.step = next_step;
    c.groups["model"] = model_checkpoint_tensors(params);
    c.groups["optimizer"] = optimizer_checkpoint_tensors(*model, optimizer->state());
    Json layout_record = Json::Object{};
    layout_record["world_size"] = world->size();
    layout_record["backend"] = world->backend();
    layout_record["parallel"] = cfg.parallel.str();
    c.trainer = trainer_json(*model, TrainerState{.step = next_step, .seed = cfg.train.seed, .config = cfg.resolved,
                                                  .settings = trajectory_settings(cfg), .layout = layout_record});
    return c;
  }

  std::string save(const std::string& dir, int64_t keep_last = -1, std::vector<int> machines = {}) {
    finish_save(true);
    return save_sharded_checkpoint(dir, checkpoint_content(), world.get(),
                                   {.keep_last = static_cast<int>(keep_last >= 0 ? keep_last : cfg.train.keep_last),
                                    .machines = std::move(machines)});
  }

  // A save written by a background thread from the live tensors: it plans at the step
  // boundary and writes while the next step's forward and backward run, which read the
  // parameters and optimizer states but do not change them. Before the step's update, what the
  // writer has not reached yet is copied and what it is writing is waited for
  // (release_tensors). finish_save publishes it once every rank has written and synced its part.
  std::optional<PendingCheckpoint> pending;
  std::thread writer;
  std::atomic<bool> written{false};
  bool released = true;  // the live tensors are no longer the writer's

  void start_save(const std::string& dir) {
    finish_save(true);
    pending.emplace(dir, checkpoint_content(), world.get(),
                    CheckpointSaveOptions{.keep_last = static_cast<int>(cfg.train.keep_last)}, /*snapshot=*/false);
    written = false;
    released = false;
    writer = std::thread([this] {
      pending->write(/*stage_first=*/true);
      written = true;
    });
  }

  // Before anything changes the parameters or optimizer states: the seconds it took to take
  // them back from the writer (0 when none is writing).
  double release_tensors() {
    if (!pending || released) return 0;
    const auto t0 = Clock::now();
    pending->release_tensors();
    released = true;
    return std::chrono::duration<double>(Clock::now() - t0).count();
  }

  // Publishes the background save when every rank has written (or, with `wait`, after waiting
  // for them): the folder, or "" when none was published now. Collective while a save is
  // pending; every rank calls it at the same steps.
  std::string finish_save(bool wait) {
    if (!pending) return "";
    int64_t done = wait || written ? 1 : 0;
    world->all_reduce(&done, 1, DType::i64, ReduceOp::min);
    if (done == 0) return "";
    writer.join();
    released = true;
    std::optional<PendingCheckpoint> p = std::move(pending);
    pending.reset();
    return p->publish();
  }

  // `optional`: no checkpoint anywhere is not an error; the run starts at step 0.
  int64_t load(const std::string& path, bool quiet, const std::string& memory = "", bool optional = false) {
    finish_save(true);
    // The newest complete step folder whose pieces match their checksums, checked while they are
    // read (each rank checks what it reads, so nothing is read twice); a damaged one is skipped
    // for the next older one. With a memory folder, its steps come first when newer (or equal).
    std::vector<std::string> dirs;
    try {
      dirs = checkpoint_candidates(path, world.get());
    } catch (const CheckpointError&) {
      if (memory.empty() && !optional) throw;  // (alike on every rank: they see the same folder)
    }
    if (!memory.empty()) {
      // The newest step the machines' memory holds whole, own pieces and peer copies together,
      // copied first to any machine that lacks some — unless it is older than the newest on disk.
      const int64_t newest_on_disk =
          dirs.empty() ? -1 : checkpoint_step_of(std::filesystem::path(dirs.front()).filename().string());
      const std::vector<int> machines =
          in_memory.machines.empty() ? std::vector<int>(static_cast<size_t>(world->size()), 0) : in_memory.machines;
      std::vector<std::pair<int64_t, std::string>> merged =
          memory_steps_held(memory, world.get(), machines, lead() && !quiet, newest_on_disk);
      for (const std::string& d : dirs) merged.emplace_back(checkpoint_step_of(std::filesystem::path(d).filename().string()), d);
      std::stable_sort(merged.begin(), merged.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
      dirs.clear();
      for (auto& [step, d] : merged)
        if (std::find(dirs.begin(), dirs.end(), d) == dirs.end()) dirs.push_back(std::move(d));
      if (lead() && !quiet && !dirs.empty() && dirs.front().rfind(memory, 0) == 0)
        log_info("resuming from the in-memory checkpoint {} (nothing newer in {})", dirs.front(), path);
      else if (lead() && !quiet && !dirs.empty())
        log_info("resuming from {} on disk: memory holds no newer step whole", dirs.front());
    }
    if (dirs.empty()) {
      TESSEL_CHECK_AS(CheckpointError, optional, "no complete checkpoint (step-NNNNNN folder) under '{}'{}", path,
                      memory.empty() ? std::string() : fmt::format(" or '{}'", memory));
      return 0;
    }
    for (size_t i = 0;; ++i) {
      CheckpointReader reader(dirs[i]);
      std::map<std::string, Tensor> state = optimizer->state();
      const std::string damaged = read_checkpoint(reader, state);
      if (damaged.empty()) return finish_load(reader, state, quiet);
      const bool one_step = dirs.size() == 1 && dirs.front() == std::filesystem::path(path).string();
      TESSEL_CHECK_AS(CheckpointError, !one_step, "checkpoint '{}' cannot be resumed from: {}", path, damaged);
      TESSEL_CHECK_AS(CheckpointError, i + 1 < dirs.size(), "no undamaged checkpoint under '{}' (the oldest, {}: {})",
                      path, dirs[i], damaged);
      if (lead()) log_warn("skipping checkpoint {}: {}; trying an older one", dirs[i], damaged);
    }
  }

  // Reads the model's parameters and the optimizer's states from `reader`'s step folder into
  // this rank's pieces (`state`: the optimizer's), checking checksums as it goes: "" or what
  // was damaged.
  std::string read_checkpoint(CheckpointReader& reader, const std::map<std::string, Tensor>& state) {
    const TrainerState st = parse_trainer_json(reader, *model);
    TESSEL_CHECK_AS(CheckpointError, st.step <= cfg.train.steps, "checkpoint '{}' is at step {}, past train.steps = {}",
                    reader.dir(), st.step, cfg.train.steps);
    check_model_tensors(reader, *model);
    std::vector<CheckpointTensor> targets = model_checkpoint_tensors(params);
    for (const CheckpointTensor& t : optimizer_checkpoint_tensors(*model, state))
      TESSEL_CHECK_AS(CheckpointError, reader.contains(t.name),
                      "checkpoint '{}' has no optimizer state \"{}\" (was it saved with another train.optimizer than "
                      "{}?)", reader.dir(), t.name, cfg.train.optimizer);
    for (CheckpointTensor& t : optimizer_checkpoint_tensors(*model, state)) targets.push_back(std::move(t));
    return reader.read_verified(targets, world.get());
  }

  int64_t finish_load(const CheckpointReader& reader, const std::map<std::string, Tensor>& state, bool quiet) {
    const TrainerState st = parse_trainer_json(reader, *model);
    const int64_t saved_steps = static_cast<int64_t>(state.at("step").item());
    TESSEL_CHECK_AS(CheckpointError, saved_steps == st.step,
                    "checkpoint '{}': the optimizer is at step {} but trainer.json says {}", reader.dir(), saved_steps,
                    st.step);
    optimizer->restore_steps(saved_steps);
    next_step = st.step;
    bytes_read = reader.bytes_read();
    if (lead() && st.settings.is_object()) {  // a warning, even when quiet
      const std::vector<std::string> changed = changed_settings(st.settings, trajectory_settings(cfg));
      if (!changed.empty())
        log_warn("resuming with settings that differ from the checkpoint's, so the run will not continue its "
                 "trajectory exactly: {}", fmt::join(changed, ", "));
    }
    if (lead() && !quiet) {
      const Json* from = st.layout.is_object() ? st.layout.find("parallel") : nullptr;
      log_info("resumed from {} at step {}{} (read {} of this rank's pieces)", reader.dir(), st.step,
               from ? fmt::format(", saved by {}", from->as_string()) : std::string(),
               bytes_str(reader.bytes_read()));
    }
    return st.step;
  }

  // The loss lives on the last stage's ranks: the first of them tells everyone.
  double share_loss(double here) const {
    double v = pp_rank() == cfg.parallel.pp - 1 && layout->first_along_all_but({"pp"}) ? here : 0.0;
    world->all_reduce(&v, 1, DType::f64, ReduceOp::sum);
    return v;
  }

  double validation_loss() {
    TESSEL_CHECK(val_loader.has_value(), "evaluate: the config has no validation data (data.val_path or "
                 "data.val_fraction)");
    nn::EvalModeGuard eval_mode(*model);
    double sum = 0;
    for (int64_t b = 0; b < data.validation_batches; ++b) {
      const std::vector<MicroBatch> batches = val_loader->batch(b);
      sum += runtime->evaluate([&](int chunk, int m, const std::vector<Tensor>& inputs) {
        return chunk_forward(batches, 0, chunk, m, inputs);
      });
    }
    if (gather) gather->finish_step();  // free what the last forward prefetched
    return share_loss(sum) / static_cast<double>(data.validation_batches * cfg.parallel.micro_batches);
  }
};

Engine::~Engine() {
  // A save still being written when the engine is dropped (an error ended the run): let the
  // writer finish its files; without every rank's word the step is not published.
  if (s_ && s_->writer.joinable()) s_->writer.join();
}

Engine::Engine(RunConfig config, std::unique_ptr<nn::LanguageModel> model) : s_(std::make_unique<State>()) {
  State& s = *s_;
  s.cfg = std::move(config);
  const TrainSection& t = s.cfg.train;
  const ParallelConfig& pc = s.cfg.parallel;
  s.world = world_group();
  TESSEL_CHECK(s.world->size() == pc.world_size(),
               "the config's parallel section needs dp·ep·cp·tp·pp = {}·{}·{}·{}·{} = {} ranks, but {} were started",
               pc.dp, pc.ep, pc.cp, pc.tp, pc.pp, pc.world_size(), s.world->size());
  // Thread ranks get their intra-op threads from spawn; a process rank sets its own.
  if (t.threads > 0 && s.world->backend() != "thread") set_default_num_threads(static_cast<int>(t.threads));
  // The rank's device becomes its current one: the model, its states and every step's tensors
  // are made there (docs/devices.md).
  rank_context().device = rank_device(t.device, s.world->rank());
  s.model = model ? std::move(model) : build_model(s.cfg);
  s.model->set_selective_recompute(pc.recompute == "selective");
  s.data = open_training_data(s.cfg, s.model->vocab_size());
  pc.validate(s.model->num_blocks(), t.global_batch);
  // Tensor parallelism gives each tp rank whole heads of GPT-2's attention (c_attn's columns).
  if (const auto* gpt2 = dynamic_cast<const nn::Gpt2*>(s.model.get()))
    TESSEL_CHECK(gpt2->config().n_head % pc.tp == 0,
                 "model.n_head {} is not a multiple of parallel.tp {}: tensor parallelism gives each tp rank whole "
                 "attention heads", gpt2->config().n_head, pc.tp);
  {
    const auto* gpt2 = dynamic_cast<const nn::Gpt2*>(s.model.get());
    const auto* llama = dynamic_cast<const nn::Llama*>(s.model.get());
    const int64_t heads = gpt2 ? gpt2->config().n_head : llama ? llama->config().num_attention_heads : 1;
    const int64_t kv_heads = gpt2 ? heads : llama ? llama->config().num_key_value_heads : 1;
    pc.validate_cp(t.seq_len, heads, kv_heads);
  }
  s.layout = std::make_unique<Layout>(pc, s.world->rank());
  const Layout& layout = *s.layout;
  const ProcessMesh mesh = layout.stage_mesh();

  // This rank's virtual stages and their parameters.
  s.schedule = make_schedule(pc.pp == 1 && pc.schedule == "VPP" ? "1F1B" : pc.schedule, static_cast<int>(pc.pp),
                             static_cast<int>(pc.micro_batches), static_cast<int>(pc.vpp));
  s.V = s.schedule.virtual_stages();
  s.blocks = stage_blocks(pc, s.model->num_blocks());
  using Part = nn::LanguageModel::Part;
  std::set<nn::Parameter*> seen;
  auto take = [&](const std::vector<nn::Parameter*>& ps) {
    for (nn::Parameter* p : ps)
      if (seen.insert(p).second) s.params.push_back(p);
  };
  std::vector<std::vector<std::vector<nn::Parameter*>>> units;  // per chunk, per unit
  for (int c = 0; c < s.schedule.chunks; ++c) {
    const int vs = s.schedule.virtual_stage(s.pp_rank(), c);
    units.emplace_back();
    if (vs == 0) {
      take(s.model->part_parameters(Part::embed));
      units.back().push_back(s.model->part_parameters(Part::embed));
      s.first_stage = true;
    }
    for (int64_t b = s.blocks[static_cast<size_t>(vs)].first; b < s.blocks[static_cast<size_t>(vs)].second; ++b) {
      take(s.model->part_parameters(Part::block, b));
      units.back().push_back(s.model->part_parameters(Part::block, b));
    }
    if (vs == s.V - 1) {
      take(s.model->part_parameters(Part::head));
      units.back().push_back(s.model->part_parameters(Part::head));
      s.last_stage = true;
    }
  }
  parallelize(*s.model, s.params, mesh, plan_for(s.model->arch()), layout, t.seed);
  if (!s.cfg.model.init_from.empty()) {  // every rank reads its pieces from the one file
    load_model(s.cfg.model.init_from, *s.model);
    if (s.lead()) log_info("loaded weights from {}", s.cfg.model.init_from);
  }
  s.model->train(true);

  // GPT-2's token embedding is also its head: with several pipeline ranks the first and the
  // last hold a copy each, kept equal by summing their gradients.
  std::vector<nn::Parameter*> tied;
  std::shared_ptr<ProcessGroup> tied_group;
  if (s.model->arch() == "gpt2" && pc.pp > 1 && (s.first_stage || s.last_stage)) {
    tied.push_back(s.model->part_parameters(Part::embed)[0]);
    tied_group = s.world->new_group({static_cast<int>(layout.peer("pp", 0)), static_cast<int>(layout.peer("pp", pc.pp - 1))});
  }
  OptimizerOptions oo{.kind = t.optimizer,
                      .adamw = {.lr = t.lr, .beta1 = t.beta1, .beta2 = t.beta2, .eps = t.eps, .weight_decay = t.weight_decay},
                      .sgd = {.lr = t.lr, .momentum = t.momentum, .weight_decay = t.weight_decay, .nesterov = t.nesterov},
                      .bucket_bytes = static_cast<int64_t>(pc.bucket_mb * (1 << 20)),
                      .reduce_dtype = t.grad_reduce == "bf16" ? DType::bf16 : DType::f32};
  s.optimizer = std::make_unique<ShardedOptimizer>(s.params, layout, oo, tied, tied_group, s.first_stage);
  s.lr_schedule = optim::LrSchedule{.kind = optim::LrSchedule::parse_kind(t.schedule),
                                    .lr = t.lr,
                                    .min_lr = t.min_lr,
                                    .warmup = t.warmup,
                                    .total = t.steps};
  s.sampler.emplace(s.data.train->size(), t.seq_len, t.global_batch, s.cfg.data.order, t.seed);
  s.loader.emplace(s.data.train, *s.sampler, layout, t.global_batch, s.first_stage, s.last_stage);
  if (s.data.validation)
    s.val_loader.emplace(s.data.validation, *s.data.validation_order, layout, t.global_batch, s.first_stage,
                         s.last_stage);
  if (s.cfg.data.pack_documents) {
    s.loader->set_pack_documents(s.cfg.data.eot_token);
    if (s.val_loader) s.val_loader->set_pack_documents(s.cfg.data.eot_token);
  }
  const int64_t mb = t.global_batch / pc.micro_batches;
  const int64_t width = s.cfg.model.arch == "gpt2" ? s.cfg.model.gpt2.n_embd : s.cfg.model.llama.hidden_size;
  // What crosses a stage boundary: the hidden states.
  s.runtime = std::make_unique<PipelineRuntime>(
      s.schedule, layout, std::vector<Payload>{{{mb, t.seq_len, width}, DType::f32, layout.activation_placements()}});
  if (pc.sharding_stage == 3 && pc.dp > 1) {
    s.gather = std::make_unique<ParamGather>(layout, std::move(units));
    // The gathered weights' gradients are reduce-scattered bucket by bucket during the backward.
    s.gather->set_grad_sink([opt = s.optimizer.get()](const nn::Parameter* p, const Tensor& g) {
      return opt->accept_gathered_grad(p, g);
    });
  }
}

double Engine::evaluate() { return s_->validation_loss(); }

std::string Engine::save(const std::string& dir) { return s_->save(dir); }

int64_t Engine::load(const std::string& path) { return s_->load(path, false); }

int64_t Engine::step() const { return s_->next_step; }

int64_t Engine::resume_bytes_read() const { return s_->bytes_read; }

Tensor Engine::predict(const Tensor& ids) {
  State& s = *s_;
  TESSEL_CHECK(s.cfg.parallel.pp == 1, "predict: layouts with pipeline stages (parallel.pp = {}) are not supported "
               "yet; use a layout without pp", s.cfg.parallel.pp);
  TESSEL_CHECK(ids.dim() == 2, "predict: token ids must be [batch, seq], got {}", shape_str(ids.shape()));
  nn::EvalModeGuard eval_mode(*s.model);
  NoGradGuard no_grad;
  const Layout& layout = *s.layout;
  // The batch over dp (and the sequence over cp, in the order its attention holds it), as
  // training reads it; the logits come back whole, in order.
  const ParallelConfig& pc = s.cfg.parallel;
  const std::vector<int64_t> order = cp_order(ids.size(1), pc.cp, pc.cp_method);
  const bool reordered = !std::is_sorted(order.begin(), order.end());
  nn::SequenceState ss{.cp_method = pc.cp_method};
  Tensor in = ids;
  if (reordered) {
    in = take_columns(ids, order);
    std::vector<int64_t> rows_of_order;
    for (int64_t r = 0; r < in.size(0); ++r) rows_of_order.insert(rows_of_order.end(), order.begin(), order.end());
    DeviceScope on(in.device());
    Tensor pos = Tensor::from_vector(rows_of_order, in.shape());
    ss.positions = shard_tensor(pos, layout.stage_mesh(), layout.ids_placements());
  }
  nn::sequence_state() = ss;
  const Tensor x = shard_tensor(in, layout.stage_mesh(), layout.ids_placements());
  Tensor logits;
  {
    AutocastScope precision(s.bf16());
    logits = s.run_chunk(0, x, Tensor(), nn::dropout_state());  // one stage: the whole model
  }
  if (logits.dtype() != DType::f32) logits = cast(logits, DType::f32);  // bf16 logits come back as f32
  if (s.gather) s.gather->finish_step();
  nn::sequence_state() = nn::SequenceState{};
  Tensor whole = full_tensor(logits);
  if (!reordered) return whole;
  Tensor back = Tensor::empty(whole.shape(), whole.dtype());
  for (size_t i = 0; i < order.size(); ++i)
    view::copy(view::select(back, 1, order[i]), view::select(whole, 1, static_cast<int64_t>(i)));
  return back;
}

ParallelTrainResult Engine::fit(const ParallelTrainOptions& options) {
  State& s = *s_;
  const RunConfig& cfg = s.cfg;
  const TrainSection& t = cfg.train;
  const ParallelConfig& pc = cfg.parallel;
  auto say = [&](const std::string& m) {
    if (s.lead() && !options.base.quiet) log_info("{}", m);
  };
  const int64_t M = pc.micro_batches;
  // Where the intra-op thread count came from, so a run that sets the usual variables sees them taken.
  const EnvThreads env = env_num_threads();
  const std::string threads_from = t.threads > 0 ? "train.threads"
                                   : env.count > 0 ? env.variable
                                                   : "the cores";
  say(fmt::format("{} model, {:.3f}M parameters; {} ranks: {}; {} intra-op thread{} per rank ({}); {} step{} of {} x {} "
                  "tokens{}{}",
                  s.model->arch(), static_cast<double>(s.model->num_parameters()) / 1e6, pc.world_size(), pc.str(),
                  current_num_threads(), current_num_threads() == 1 ? "" : "s", threads_from, t.steps,
                  t.steps == 1 ? "" : "s", t.global_batch, t.seq_len, t.precision == "bf16" ? "; bf16 mixed precision" : "",
                  t.warmup_note()));
  if (!t.dropout_note.empty() && s.lead() && !options.base.quiet) log_warn("{}", t.dropout_note);
  if (!t.optimizer_note.empty() && s.lead() && !options.base.quiet) log_warn("{}", t.optimizer_note);
  if (pc.pp > 1 && s.lead() && !options.base.quiet) log_info("pipeline schedule (unit-time view):\n{}", s.schedule.grid());

  const TrainOptions& base = options.base;
  // A folder it cannot write fails the run before its first step, not at its first save.
  if (!base.save_dir.empty()) {
    check_checkpoint_dir(base.save_dir);
    if (s.lead()) remove_unfinished_saves(base.save_dir);  // a killed save's folder, before any step
  }
  // The in-memory checkpoints' folder: one machine's tmpfs, or each machine's own with peer copies.
  s.in_memory = setup_memory_checkpoints(base.memory_dir, t.memory_save_every, s.world.get(), s.lead() && !base.quiet);
  const std::string memory = s.in_memory.dir;
  if (!base.resume_dir.empty() && s.next_step == 0) s.load(base.resume_dir, base.quiet, memory, base.resume_optional);
  const int64_t start = s.next_step;
  ParallelTrainResult result;
  result.resume_bytes_read = s.bytes_read;
  int64_t saved_at = -1;
  const bool live = base.progress && !base.quiet && s.lead() && ::isatty(::fileno(stderr));
  auto saved = [&](const std::string& path, const std::string& note) {
    result.train.last_checkpoint = path;
    if (live) std::fputs("\r\033[K", stderr);
    say(fmt::format("saved {}{}", path, note));
  };
  bool holding = false;  // a background save started and the next update has not waited for it yet
  auto published = [&](bool wait) {
    const std::string path = s.finish_save(wait);
    if (!path.empty())
      saved(path, fmt::format(" (written in the background; the steps were held {:.3f} s in all)",
                              result.save_block_seconds.back()));
  };
  // `background`: write the state while training goes on.
  auto save = [&](bool background) {
    // The background save before this one is published and announced first: were this save to
    // fail, the user still learns which checkpoint is complete.
    published(true);
    saved_at = s.next_step;
    const auto t0 = Clock::now();
    if (!background) {
      saved(s.save(base.save_dir), "");
      return;
    }
    s.start_save(base.save_dir);
    // The step is held for the plan now and, at the next update, for what is left to write.
    result.save_block_seconds.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
    holding = true;
  };
  if (!base.save_dir.empty() && t.save_init && start == 0) save(false);
  // A signal stops every rank after the same step: the first rank's thread backend process, or
  // each process of a gloo job, listens; the ranks agree each step.
  std::optional<StopSignals> stop;
  const bool stoppable = base.stop_on_signal && !base.save_dir.empty();  // alike on every rank
  if (stoppable && (s.world->backend() != "thread" || s.lead()))
    stop.emplace(fmt::format("stopping after this step with a checkpoint in {} (send it again to stop at once)",
                             base.save_dir));

  std::ofstream metrics;
  const std::string metrics_path = base.metrics_path.empty() ? cfg.log.metrics : base.metrics_path;
  if (s.lead() && !metrics_path.empty()) {
    // A resumed run appends, after dropping lines of the steps it runs again (a run that
    // crashed after its last checkpoint logged them): the file holds each step once.
    if (start > 0) keep_metrics_before(metrics_path, start);
    metrics.open(metrics_path, start > 0 ? std::ios::app : std::ios::trunc);
    TESSEL_CHECK_AS(InputError, metrics.good(), "cannot write metrics file '{}': {}", metrics_path, std::strerror(errno));
  }

  std::vector<TraceEvent> trace;
  MemoryStats& mem = *rank_context().memory;
  if (s.data.validation && s.next_step == 0) {
    const double v = s.validation_loss();
    result.train.validation.emplace_back(0, v);
    say(initial_validation_line(v, cfg));
  }
  const auto run_start = Clock::now();
  double recent = 0;  // smoothed seconds per step for the ETA
  for (int64_t step = s.next_step; step < t.steps; ++step) {
    if (auto f = armed_fault("step", s.world->rank(), step)) inject_fault(*f);
    const auto t0 = Clock::now();
    const int64_t base_bytes = mem.current.load();
    mem.reset_peak();
    std::vector<MicroBatch> batches = s.loader->batch(step);
    const double lr = s.lr_schedule.at(step);
    begin_moe_step(M);
    const double loss_here = s.runtime->run([&](int chunk, int m, const std::vector<Tensor>& inputs) {
      return s.chunk_forward(batches, step, chunk, m, inputs);
    });
    const Json moe = end_moe_step(*s.model, *s.world);
    if (s.gather) s.gather->finish_step();
    const auto t_opt = Clock::now();
    const int64_t peak_activations = mem.peak.load() - base_bytes;
    if (holding) {
      result.save_block_seconds.back() += s.release_tensors();
      holding = false;
    }
    const double norm = s.optimizer->step(lr, t.grad_clip);
    RankMemory& peaks = result.memory;
    peaks.params = std::max(peaks.params, mem.peak_of(MemoryKind::params));
    peaks.grads = std::max(peaks.grads, mem.peak_of(MemoryKind::grads));
    peaks.optimizer = std::max(peaks.optimizer, mem.peak_of(MemoryKind::optimizer));
    peaks.other = std::max(peaks.other, mem.peak_of(MemoryKind::other));
    peaks.total = std::max(peaks.total, mem.peak.load());
    if (options.trace_path.empty()) s.optimizer->take_waits();
    const double loss = s.share_loss(loss_here) / static_cast<double>(M);
    TESSEL_CHECK(std::isfinite(loss),
                 "training diverged: the loss is {} at step {} (try a lower train.lr or train.grad_clip)", loss, step);
    s.next_step = step + 1;
    const auto t1 = Clock::now();
    const double secs = std::chrono::duration<double>(t1 - t0).count();
    StepRecord rec{step, loss, lr, norm, static_cast<double>(t.global_batch * t.seq_len) / secs, secs};
    rec.moe = moe;
    if (s.data.validation && t.evaluates_after(step)) {
      rec.val_loss = s.validation_loss();
      result.train.validation.emplace_back(step + 1, *rec.val_loss);
    }
    result.train.steps.push_back(rec);
    result.idle_shares.push_back(s.runtime->idle_share());

    if (!options.trace_path.empty()) {
      const double base_us = micros_since_epoch(t0);
      for (const ActionTiming& a : s.runtime->timings()) {
        const bool compute = a.kind == ActionKind::F || a.kind == ActionKind::B || a.kind == ActionKind::W;
        if (!compute && a.end - a.start < 1e-6) continue;
        trace.push_back({a.name, compute ? "compute" : "communication", base_us + a.start * 1e6, (a.end - a.start) * 1e6});
      }
      trace.push_back({"optimizer step", "compute", micros_since_epoch(t_opt),
                       std::chrono::duration<double, std::micro>(t1 - t_opt).count()});
      // Where the rank waited on gradient sync (in the backward or the step): the exposed part.
      for (const ShardedOptimizer::Wait& w : s.optimizer->take_waits())
        trace.push_back({w.what, "grad sync", micros_since_epoch(w.start),
                         std::chrono::duration<double, std::micro>(w.end - w.start).count()});
    }
    if (step == 0 && !options.base.quiet) {
      // Per-rank memory as the allocator saw it in the first step: every rank logs its own line.
      log_info("rank {} memory: parameters {}, gradients {} at most, optimizer states {}, peak activations {}",
               s.world->rank(), bytes_str(peaks.params), bytes_str(peaks.grads), bytes_str(peaks.optimizer),
               bytes_str(peak_activations));
    }
    if (s.lead() && metrics.is_open()) {
      metrics << step_metrics(rec, std::chrono::duration<double>(Clock::now() - run_start).count()).dump() << '\n';
      metrics.flush();
    }
    if (options.on_step) options.on_step(rec);
    recent = recent == 0 ? secs : 0.9 * recent + 0.1 * secs;
    const bool permanent = step == start || (step + 1) % cfg.log.every == 0 || step + 1 == t.steps || rec.val_loss;
    const std::string line = step_line(rec, t.steps, recent * static_cast<double>(t.steps - step - 1));
    if (live) {
      std::fprintf(stderr, "\r\033[K%s%s", line.c_str(), permanent ? "\n" : "");
      std::fflush(stderr);
    } else if (s.lead() && !base.quiet && permanent) {
      log_info("{}", line);
    }
    published(false);
    const bool disk_save = !base.save_dir.empty() && t.save_every > 0 && (step + 1) % t.save_every == 0;
    if (disk_save && step + 1 != t.steps) save(t.async_save);
    // The in-memory copy: synchronous (a copy into RAM), kept once, skipped while a disk save is
    // being written (which is as new) — alike on every rank.
    if (!memory.empty() && (step + 1) % t.memory_save_every == 0 && !disk_save && step + 1 != t.steps && !s.pending) {
      const auto t0 = Clock::now();
      s.save(memory, 1, s.in_memory.save_machines());
      result.memory_save_seconds.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
    }
    if (stoppable) {
      int64_t signal = stop ? stop->requested() : 0;
      s.world->all_reduce(&signal, 1, DType::i64, ReduceOp::max);
      if (signal != 0 && step + 1 < t.steps) {
        result.train.stopped_by = static_cast<int>(signal);
        published(true);
        if (saved_at != step + 1) save(false);
        say(fmt::format("stopped by {} after step {} of {}; continue with --resume {} --save {}",
                        signal_name(result.train.stopped_by), step + 1, t.steps, base.save_dir, base.save_dir));
        break;
      }
    }
  }
  published(true);
  if (!base.save_dir.empty() && start < t.steps && result.train.stopped_by == 0 && saved_at != s.next_step) save(false);
  result.train.seconds = std::chrono::duration<double>(Clock::now() - run_start).count();
  if (!options.base.quiet) {
    const RankMemory& m = result.memory;
    std::string os;
    if (s.world->backend() != "thread") {  // one process per rank: the OS's figure is this rank's
      struct rusage usage {};
      getrusage(RUSAGE_SELF, &usage);
      os = fmt::format("; peak resident {} (the OS's)", bytes_str(static_cast<int64_t>(usage.ru_maxrss) * 1024));
    }
    log_info("rank {} peak memory over the run: parameters {}, gradients {}, optimizer states {}, all {}{}",
             s.world->rank(), bytes_str(m.params), bytes_str(m.grads), bytes_str(m.optimizer), bytes_str(m.total), os);
  }
  if (!options.trace_path.empty()) {
    write_trace(options.trace_path, trace, pc.str());
    say(fmt::format("timeline written to {} (open it in https://ui.perfetto.dev or chrome://tracing)", options.trace_path));
  }
  if (options.base.collect_params)
    for (nn::Parameter* p : s.params) result.final_params[p->name] = full_tensor(p->value);
  return result;
}

ParallelTrainResult train_parallel_threads(const RunConfig& cfg, int nproc, const ParallelTrainOptions& options) {
  ParallelTrainResult out;
  std::mutex mu;
  // The cores are split among the ranks unless the config gives threads per rank.
  SpawnOptions so;
  so.threads_per_rank = static_cast<int>(cfg.train.threads);
  spawn(nproc, [&](int rank) {
    Engine engine(cfg);
    ParallelTrainResult r = engine.fit(options);
    std::lock_guard<std::mutex> lock(mu);
    out.rank_idle_shares.resize(static_cast<size_t>(nproc));
    std::vector<std::vector<double>> idle = std::move(out.rank_idle_shares);
    idle[static_cast<size_t>(rank)] = r.idle_shares;
    std::map<std::string, Tensor> params = std::move(r.final_params);
    if (rank == 0) {
      params.merge(out.final_params);
      out = std::move(r);
      out.final_params = std::move(params);
    } else {
      out.final_params.merge(params);
    }
    out.rank_idle_shares = std::move(idle);
  }, so);
  return out;
}

}  // namespace tessel
