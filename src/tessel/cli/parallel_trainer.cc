// The hybrid-parallel training loop.
#include "tessel/cli/parallel_trainer.h"

#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <fstream>
#include <mutex>
#include <optional>
#include <set>

#include "tessel/autograd/engine.h"
#include "tessel/ckpt/checkpoint.h"
#include "tessel/comm/thread_backend.h"
#include "tessel/comm/world.h"
#include "tessel/core/context.h"
#include "tessel/core/log.h"
#include "tessel/core/storage.h"
#include "tessel/core/thread_pool.h"
#include "tessel/dist/dtensor.h"
#include "tessel/ops/ops.h"
#include "tessel/parallel/data.h"
#include "tessel/parallel/param_gather.h"
#include "tessel/parallel/parallelize.h"
#include "tessel/parallel/pipeline.h"
#include "tessel/parallel/sharded_optimizer.h"

namespace tessel {

namespace {

using Clock = std::chrono::steady_clock;
using namespace parallel;

double micros_since_epoch(Clock::time_point t) {
  return std::chrono::duration<double, std::micro>(t.time_since_epoch()).count();
}

// One timeline slice.
struct TraceEvent {
  std::string name, category;
  double start_us = 0, dur_us = 0;
};

// Every rank's events to rank 0 (as JSON text), which writes the Chrome-trace file: one row
// (pid) per rank.
void write_trace(const std::string& path, const std::vector<TraceEvent>& events, const std::string& label) {
  auto world = world_group();
  Json mine = Json::Array{};
  for (const TraceEvent& e : events) {
    Json j = Json::Object{};
    j["name"] = e.name;
    j["cat"] = e.category;
    j["ph"] = "X";
    j["ts"] = e.start_us;
    j["dur"] = e.dur_us;
    j["pid"] = world->rank();
    j["tid"] = 0;
    mine.push_back(j);
  }
  std::string text = mine.dump();
  const int n = world->size();
  std::vector<int64_t> sizes(static_cast<size_t>(n));
  int64_t my_size = static_cast<int64_t>(text.size());
  world->all_gather(&my_size, sizes.data(), 1, DType::i64);
  int64_t total = 0;
  for (int64_t s : sizes) total += s;
  std::string all(static_cast<size_t>(total), ' ');
  world->all_gather_v(text.data(), all.data(), sizes, DType::b8);
  if (world->rank() != 0) return;
  std::ofstream out(path);
  TESSEL_CHECK(out.good(), "cannot write trace file '{}'", path);
  out << "{\"displayTimeUnit\":\"ms\",\"otherData\":{\"layout\":" << Json(label).dump() << "},\"traceEvents\":[";
  int64_t at = 0;
  bool first = true;
  for (int r = 0; r < n; ++r) {
    std::string part = all.substr(static_cast<size_t>(at), static_cast<size_t>(sizes[static_cast<size_t>(r)]));
    at += sizes[static_cast<size_t>(r)];
    Json meta = Json::Object{};
    meta["name"] = "process_name";
    meta["ph"] = "M";
    meta["pid"] = r;
    Json args = Json::Object{};
    args["name"] = fmt::format("rank {}", r);
    meta["args"] = args;
    out << (first ? "" : ",") << meta.dump();
    first = false;
    if (part.size() > 2) out << "," << part.substr(1, part.size() - 2);
  }
  out << "]}\n";
  TESSEL_CHECK(out.good(), "failed writing trace file '{}'", path);
}

std::string bytes_str(int64_t b) {
  if (b >= (int64_t{1} << 30)) return fmt::format("{:.2f} GiB", static_cast<double>(b) / (1 << 30));
  if (b >= (int64_t{1} << 20)) return fmt::format("{:.2f} MiB", static_cast<double>(b) / (1 << 20));
  return fmt::format("{:.1f} KiB", static_cast<double>(b) / 1024);
}

}  // namespace

void check_parallel_supports(const ParallelTrainOptions& options) {
  TESSEL_CHECK(options.base.save_dir.empty() && options.base.resume_dir.empty(),
               "--save/--resume are not supported with parallel layouts yet (train on one rank to checkpoint)");
}

ParallelTrainResult train_parallel_rank(const RunConfig& cfg, const ParallelTrainOptions& options) {
  const TrainSection& t = cfg.train;
  const ParallelConfig& pc = cfg.parallel;
  auto world = world_group();
  TESSEL_CHECK(world->size() == pc.world_size(),
               "the config's parallel section needs dp·tp·pp = {}·{}·{} = {} ranks, but {} were started", pc.dp, pc.tp,
               pc.pp, pc.world_size(), world->size());
  // Thread ranks get their intra-op threads from spawn; a process rank sets its own.
  if (t.threads > 0 && world->backend() != "thread") set_default_num_threads(static_cast<int>(t.threads));
  check_parallel_supports(options);
  const bool lead = world->rank() == 0;
  auto say = [&](const std::string& m) {
    if (lead && !options.base.quiet) log_info("{}", m);
  };

  std::unique_ptr<nn::LanguageModel> model = build_model(cfg);
  const TrainingData td = open_training_data(cfg, model->vocab_size());
  pc.validate(model->num_blocks(), t.global_batch);
  // Tensor parallelism gives each tp rank whole heads of GPT-2's attention (c_attn's columns).
  if (const auto* gpt2 = dynamic_cast<const nn::Gpt2*>(model.get()))
    TESSEL_CHECK(gpt2->config().n_head % pc.tp == 0,
                 "model.n_head {} is not a multiple of parallel.tp {}: tensor parallelism gives each tp rank whole "
                 "attention heads", gpt2->config().n_head, pc.tp);
  Layout layout(pc, world->rank());
  const ProcessMesh mesh = layout.stage_mesh();

  // This rank's virtual stages and their parameters.
  const Schedule schedule = make_schedule(pc.pp == 1 && pc.schedule == "VPP" ? "1F1B" : pc.schedule,
                                          static_cast<int>(pc.pp), static_cast<int>(pc.micro_batches),
                                          static_cast<int>(pc.vpp));
  const int V = schedule.virtual_stages();
  const auto blocks = stage_blocks(pc, model->num_blocks());
  using Part = nn::LanguageModel::Part;
  std::vector<nn::Parameter*> params;
  std::set<nn::Parameter*> seen;
  auto take = [&](const std::vector<nn::Parameter*>& ps) {
    for (nn::Parameter* p : ps)
      if (seen.insert(p).second) params.push_back(p);
  };
  bool first_stage = false, last_stage = false;
  for (int c = 0; c < schedule.chunks; ++c) {
    const int vs = schedule.virtual_stage(static_cast<int>(layout.coord("pp")), c);
    if (vs == 0) {
      take(model->part_parameters(Part::embed));
      first_stage = true;
    }
    for (int64_t b = blocks[static_cast<size_t>(vs)].first; b < blocks[static_cast<size_t>(vs)].second; ++b)
      take(model->part_parameters(Part::block, b));
    if (vs == V - 1) {
      take(model->part_parameters(Part::head));
      last_stage = true;
    }
  }
  parallelize(*model, params, mesh, plan_for(model->arch()), layout, t.seed);
  if (!cfg.model.init_from.empty()) {  // every rank reads its pieces from the one file
    load_model(cfg.model.init_from, *model);
    say(fmt::format("loaded weights from {}", cfg.model.init_from));
  }
  model->train(true);

  // GPT-2's token embedding is also its head: with several pipeline ranks the first and the
  // last hold a copy each, kept equal by summing their gradients.
  std::vector<nn::Parameter*> tied;
  std::shared_ptr<ProcessGroup> tied_group;
  if (model->arch() == "gpt2" && pc.pp > 1 && (first_stage || last_stage)) {
    tied.push_back(model->part_parameters(Part::embed)[0]);
    tied_group = world->new_group({static_cast<int>(layout.peer("pp", 0)), static_cast<int>(layout.peer("pp", pc.pp - 1))});
  }
  OptimizerOptions oo{.kind = t.optimizer,
                      .adamw = {.lr = t.lr, .beta1 = t.beta1, .beta2 = t.beta2, .eps = t.eps, .weight_decay = t.weight_decay},
                      .sgd = {.lr = t.lr, .momentum = t.momentum, .weight_decay = t.weight_decay, .nesterov = t.nesterov},
                      .bucket_bytes = static_cast<int64_t>(pc.bucket_mb * (1 << 20))};
  ShardedOptimizer optimizer(params, layout, oo, tied, tied_group, first_stage);
  optim::LrSchedule lr_schedule{.kind = optim::LrSchedule::parse_kind(t.schedule),
                                .lr = t.lr,
                                .min_lr = t.min_lr,
                                .warmup = t.warmup,
                                .total = t.steps};
  Sampler sampler(td.train->size(), t.seq_len, t.global_batch, cfg.data.order, t.seed);
  ShardedLoader loader(td.train, sampler, layout, t.global_batch, first_stage, last_stage);
  const int64_t M = pc.micro_batches, mb = t.global_batch / M;
  const int64_t width = cfg.model.arch == "gpt2" ? cfg.model.gpt2.n_embd : cfg.model.llama.hidden_size;
  // What crosses a stage boundary: the hidden states.
  PipelineRuntime runtime(schedule, layout, {Payload{{mb, t.seq_len, width}, DType::f32, layout.activation_placements()}});
  say(fmt::format("{} model, {:.3f}M parameters; {} ranks: {}; {} step{} of {} x {} tokens{}", model->arch(),
                  static_cast<double>(model->num_parameters()) / 1e6, pc.world_size(), pc.str(), t.steps,
                  t.steps == 1 ? "" : "s", t.global_batch, t.seq_len, t.warmup_note()));
  if (pc.pp > 1 && lead && !options.base.quiet) log_info("pipeline schedule (unit-time view):\n{}", schedule.grid());

  std::ofstream metrics;
  const std::string metrics_path = options.base.metrics_path.empty() ? cfg.log.metrics : options.base.metrics_path;
  if (lead && !metrics_path.empty()) {
    metrics.open(metrics_path, std::ios::trunc);
    TESSEL_CHECK(metrics.good(), "cannot write metrics file '{}'", metrics_path);
  }

  // ZeRO-3 gathers each unit's parameters (embedding, block, head) just around its use.
  std::unique_ptr<ParamGather> gather;
  if (pc.sharding_stage == 3 && pc.dp > 1) {
    std::vector<std::vector<std::vector<nn::Parameter*>>> units;
    for (int c = 0; c < schedule.chunks; ++c) {
      const int vs = schedule.virtual_stage(static_cast<int>(layout.coord("pp")), c);
      units.emplace_back();
      if (vs == 0) units.back().push_back(model->part_parameters(Part::embed));
      for (int64_t b = blocks[static_cast<size_t>(vs)].first; b < blocks[static_cast<size_t>(vs)].second; ++b)
        units.back().push_back(model->part_parameters(Part::block, b));
      if (vs == V - 1) units.back().push_back(model->part_parameters(Part::head));
    }
    gather = std::make_unique<ParamGather>(layout, std::move(units));
  }
  // Model chunk `chunk` of micro-batch `m` of `batches` (training step `step`).
  auto chunk_forward = [&](const std::vector<MicroBatch>& batches, int64_t step, int chunk, int m,
                           const std::vector<Tensor>& inputs) -> std::vector<Tensor> {
    const int vs = schedule.virtual_stage(static_cast<int>(layout.coord("pp")), chunk);
    const nn::DropoutState ds{.seed = t.seed, .step = static_cast<uint64_t>(step), .global_rows = t.global_batch,
                              .row_offset = batches[static_cast<size_t>(m)].first_row};
    nn::dropout_state() = ds;
    // Unit `u` of this chunk applied to `h` (by value: recompute runs it again in the backward).
    auto in_unit = [g = gather.get(), chunk](size_t u, std::function<Tensor(const Tensor&)> fn) {
      return [g, chunk, u, fn](const Tensor& h) { return g ? g->run(chunk, u, h, fn) : fn(h); };
    };
    size_t unit = 0;  // the next unit of this chunk
    const MicroBatch& batch = batches[static_cast<size_t>(m)];
    Tensor x = vs == 0 ? in_unit(unit++, [&](const Tensor&) { return model->embed(batch.inputs); })(Tensor())
                       : inputs.at(0);
    for (int64_t b = blocks[static_cast<size_t>(vs)].first; b < blocks[static_cast<size_t>(vs)].second; ++b, ++unit) {
      auto block = in_unit(unit, [&model, b](const Tensor& h) { return model->block(b, h); });
      if (pc.recompute == "full" && grad_enabled())
        x = recompute(block, x, [ds] { nn::dropout_state() = ds; });
      else
        x = block(x);
    }
    if (vs == V - 1)
      return {cross_entropy(in_unit(unit, [&model](const Tensor& h) { return model->head(h); })(x), batch.targets)};
    return {x};
  };
  // The loss lives on the last stage's ranks: the first of them tells everyone.
  auto share_loss = [&](double here) {
    double v = layout.coord("pp") == pc.pp - 1 && layout.first_along_all_but({"pp"}) ? here : 0.0;
    world->all_reduce(&v, 1, DType::f64, ReduceOp::sum);
    return v;
  };
  // The validation loss: the mean over the fixed batches' micro-batches, forward only, no
  // dropout — the single-rank trainer's figure.
  std::optional<ShardedLoader> val_loader;
  if (td.validation)
    val_loader.emplace(td.validation, *td.validation_order, layout, t.global_batch, first_stage, last_stage);
  auto validation_loss = [&] {
    nn::EvalModeGuard eval_mode(*model);
    double sum = 0;
    for (int64_t b = 0; b < td.validation_batches; ++b) {
      const std::vector<MicroBatch> batches = val_loader->batch(b);
      sum += runtime.evaluate([&](int chunk, int m, const std::vector<Tensor>& inputs) {
        return chunk_forward(batches, 0, chunk, m, inputs);
      });
    }
    if (gather) gather->finish_step();  // free what the last forward prefetched
    return share_loss(sum) / static_cast<double>(td.validation_batches * M);
  };

  std::vector<TraceEvent> trace;
  ParallelTrainResult result;
  MemoryStats& mem = *rank_context().memory;
  if (td.validation) {
    const double v = validation_loss();
    result.train.validation.emplace_back(0, v);
    say(initial_validation_line(v, cfg));
  }
  const auto run_start = Clock::now();
  double recent = 0;  // smoothed seconds per step for the ETA
  for (int64_t step = 0; step < t.steps; ++step) {
    const auto t0 = Clock::now();
    const int64_t base_bytes = mem.current.load();
    mem.reset_peak();
    auto note_peaks = [&] {
      RankMemory& m = result.memory;
      m.params = std::max(m.params, mem.peak_of(MemoryKind::params));
      m.grads = std::max(m.grads, mem.peak_of(MemoryKind::grads));
      m.optimizer = std::max(m.optimizer, mem.peak_of(MemoryKind::optimizer));
      m.other = std::max(m.other, mem.peak_of(MemoryKind::other));
      m.total = std::max(m.total, mem.peak.load());
    };
    std::vector<MicroBatch> batches = loader.batch(step);
    const double lr = lr_schedule.at(step);
    const double loss_here = runtime.run([&](int chunk, int m, const std::vector<Tensor>& inputs) {
      return chunk_forward(batches, step, chunk, m, inputs);
    });
    if (gather) gather->finish_step();
    const auto t_opt = Clock::now();
    const int64_t peak_activations = mem.peak.load() - base_bytes;
    const double norm = optimizer.step(lr, t.grad_clip);
    note_peaks();
    if (options.trace_path.empty()) optimizer.take_waits();
    const double loss = share_loss(loss_here) / static_cast<double>(M);
    TESSEL_CHECK(std::isfinite(loss),
                 "training diverged: the loss is {} at step {} (try a lower train.lr or train.grad_clip)", loss, step);
    const auto t1 = Clock::now();
    const double secs = std::chrono::duration<double>(t1 - t0).count();
    StepRecord rec{step, loss, lr, norm, static_cast<double>(t.global_batch * t.seq_len) / secs, secs};
    if (td.validation && t.evaluates_after(step)) {
      rec.val_loss = validation_loss();
      result.train.validation.emplace_back(step + 1, *rec.val_loss);
    }
    result.train.steps.push_back(rec);
    result.idle_shares.push_back(runtime.idle_share());

    if (!options.trace_path.empty()) {
      const double base_us = micros_since_epoch(t0);
      for (const ActionTiming& a : runtime.timings()) {
        const bool compute = a.kind == ActionKind::F || a.kind == ActionKind::B || a.kind == ActionKind::W;
        if (!compute && a.end - a.start < 1e-6) continue;
        trace.push_back({a.name, compute ? "compute" : "communication", base_us + a.start * 1e6, (a.end - a.start) * 1e6});
      }
      trace.push_back({"optimizer step", "compute", micros_since_epoch(t_opt),
                       std::chrono::duration<double, std::micro>(t1 - t_opt).count()});
      // Where the rank waited on gradient sync (in the backward or the step): the exposed part.
      for (const ShardedOptimizer::Wait& w : optimizer.take_waits())
        trace.push_back({w.what, "grad sync", micros_since_epoch(w.start),
                         std::chrono::duration<double, std::micro>(w.end - w.start).count()});
    }
    if (step == 0 && !options.base.quiet) {
      // Per-rank memory as the allocator saw it in the first step: every rank logs its own line.
      const RankMemory& m = result.memory;
      log_info("rank {} memory: parameters {}, gradients {} at most, optimizer states {}, peak activations {}",
               world->rank(), bytes_str(m.params), bytes_str(m.grads), bytes_str(m.optimizer),
               bytes_str(peak_activations));
    }
    if (lead && metrics.is_open()) {
      metrics << step_metrics(rec, std::chrono::duration<double>(Clock::now() - run_start).count()).dump() << '\n';
      metrics.flush();
    }
    recent = recent == 0 ? secs : 0.9 * recent + 0.1 * secs;
    if (lead && !options.base.quiet &&
        (step == 0 || (step + 1) % cfg.log.every == 0 || step + 1 == t.steps || rec.val_loss))
      log_info("{}", step_line(rec, t.steps, recent * static_cast<double>(t.steps - step - 1)));
  }
  result.train.seconds = std::chrono::duration<double>(Clock::now() - run_start).count();
  if (!options.base.quiet) {
    const RankMemory& m = result.memory;
    std::string os;
    if (world->backend() != "thread") {  // one process per rank: the OS's figure is this rank's
      struct rusage usage {};
      getrusage(RUSAGE_SELF, &usage);
      os = fmt::format("; peak resident {} (the OS's)", bytes_str(static_cast<int64_t>(usage.ru_maxrss) * 1024));
    }
    log_info("rank {} peak memory over the run: parameters {}, gradients {}, optimizer states {}, all {}{}",
             world->rank(), bytes_str(m.params), bytes_str(m.grads), bytes_str(m.optimizer), bytes_str(m.total), os);
  }
  if (!options.trace_path.empty()) {
    write_trace(options.trace_path, trace, pc.str());
    say(fmt::format("timeline written to {} (open it in https://ui.perfetto.dev or chrome://tracing)", options.trace_path));
  }
  if (options.base.collect_params)
    for (nn::Parameter* p : params) result.final_params[p->name] = full_tensor(p->value);
  return result;
}

ParallelTrainResult train_parallel_threads(const RunConfig& cfg, int nproc, const ParallelTrainOptions& options) {
  ParallelTrainResult out;
  std::mutex mu;
  // The cores are split among the ranks unless the config gives threads per rank.
  SpawnOptions so;
  so.threads_per_rank = static_cast<int>(cfg.train.threads);
  spawn(nproc, [&](int rank) {
    ParallelTrainResult r = train_parallel_rank(cfg, options);
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
