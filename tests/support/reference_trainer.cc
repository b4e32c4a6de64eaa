// The plain single-rank training loop: the oracle the parallel layouts and the engine are
// checked against (it shares no step code with the engine).
#include "support/reference_trainer.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <optional>

#include "tessel/autograd/engine.h"
#include "tessel/ckpt/checkpoint.h"
#include "tessel/core/context.h"
#include "tessel/core/fault.h"
#include "tessel/core/log.h"
#include "tessel/nn/moe.h"
#include "tessel/core/profile.h"
#include "tessel/core/thread_pool.h"
#include "tessel/core/view.h"
#include "tessel/data/loader.h"
#include "tessel/launch/signals.h"
#include "tessel/ops/ops.h"

namespace tessel {

namespace {

using Clock = std::chrono::steady_clock;

std::unique_ptr<optim::Optimizer> make_optimizer(const RunConfig& c, std::vector<optim::ParamRef> params) {
  const TrainSection& t = c.train;
  if (t.optimizer == "sgd")
    return std::make_unique<optim::Sgd>(std::move(params), optim::SgdOptions{.lr = t.lr,
                                                                             .momentum = t.momentum,
                                                                             .weight_decay = t.weight_decay,
                                                                             .nesterov = t.nesterov});
  return std::make_unique<optim::AdamW>(std::move(params), optim::AdamWOptions{.lr = t.lr,
                                                                                .beta1 = t.beta1,
                                                                                .beta2 = t.beta2,
                                                                                .eps = t.eps,
                                                                                .weight_decay = t.weight_decay});
}

// The mean loss over the validation batches, in micro-batches as training runs them: no
// gradients, no dropout; the model is back in training mode afterwards, also on an error.
// The sequence state of a micro-batch with packed documents (eot >= 0): its document starts and
// positions; the defaults otherwise.
nn::SequenceState sequence_of(const Tensor& inputs, int64_t eot) {
  if (eot < 0) return nn::SequenceState{};
  PackedDocuments packed = pack_documents(inputs, eot);
  return nn::SequenceState{.positions = packed.positions, .doc_starts = packed.doc_starts};
}

double validation_loss(nn::LanguageModel& model, const TrainingData& data, int64_t micro_batch, int64_t eot) {
  nn::EvalModeGuard eval_mode(model);
  NoGradGuard no_grad;
  ProfileScope scope("(validation)");
  const int64_t rows = data.validation_order->global_batch();
  double sum = 0;
  int64_t count = 0;
  for (int64_t b = 0; b < data.validation_batches; ++b) {
    Batch batch = make_batch(*data.validation, *data.validation_order, b, 0, rows);
    for (int64_t r = 0; r < rows; r += micro_batch) {
      const int64_t end = std::min(rows, r + micro_batch);
      nn::sequence_state() = sequence_of(view::slice(batch.inputs, 0, r, end), eot);
      sum += nn::lm_loss(model, view::slice(batch.inputs, 0, r, end), view::slice(batch.targets, 0, r, end)).item();
      ++count;
    }
  }
  return sum / static_cast<double>(count);
}

}  // namespace

TrainResult reference_train(const RunConfig& cfg, const TrainOptions& options,
                            const std::function<void(const StepRecord&)>& on_step) {
  const TrainSection& t = cfg.train;
  if (!options.save_dir.empty()) check_checkpoint_dir(options.save_dir);
  if (t.threads > 0) set_default_num_threads(static_cast<int>(t.threads));
  auto say = [&](const std::string& message) {
    if (!options.quiet) log_info("{}", message);
  };

  std::unique_ptr<nn::LanguageModel> model = build_model(cfg);
  const TrainingData td = open_training_data(cfg, model->vocab_size());
  const std::shared_ptr<TokenDataset>& data = td.train;
  model->materialize(t.seed);
  if (!cfg.model.init_from.empty()) {
    load_model(cfg.model.init_from, *model);
    say(fmt::format("loaded weights from {}", cfg.model.init_from));
  }
  std::vector<optim::ParamRef> refs;
  std::vector<Tensor> params;
  for (nn::Parameter* p : model->parameters()) {
    refs.push_back({p->name, p->value, p->stored_shape().size() >= 2});  // c_attn's bias [3, C] is a vector
    params.push_back(p->value);
  }
  std::unique_ptr<optim::Optimizer> optimizer = make_optimizer(cfg, refs);
  optim::LrSchedule schedule{.kind = optim::LrSchedule::parse_kind(t.schedule),
                             .lr = t.lr,
                             .min_lr = t.min_lr,
                             .warmup = t.warmup,
                             .total = t.steps};

  const Json settings = trajectory_settings(cfg);
  int64_t start = 0;
  if (!options.resume_dir.empty()) {
    TrainerState st = load_checkpoint(options.resume_dir, *model, optimizer.get());
    start = st.step;
    if (st.settings.is_object()) {
      std::vector<std::string> changed = changed_settings(st.settings, settings);
      if (!changed.empty())
        log_warn("resuming with settings that differ from the checkpoint's, so the run will not continue its "
                 "trajectory exactly: {}", fmt::join(changed, ", "));
    } else if (st.seed != t.seed) {
      log_warn("resuming with seed {} but the checkpoint was trained with seed {}", t.seed, st.seed);
    }
    say(fmt::format("resumed from {} at step {}", st.dir, start));
  }
  TESSEL_CHECK(start <= t.steps, "the checkpoint is at step {}, past train.steps = {}", start, t.steps);

  Sampler sampler(data->size(), t.seq_len, t.global_batch, cfg.data.order, t.seed);
  const int64_t eot = cfg.data.pack_documents ? cfg.data.eot_token : -1;
  DataLoader loader(data, sampler, LoaderOptions{.start_step = start});
  const int64_t M = cfg.micro_batches(), mb = t.micro_batch;
  const double tokens_per_step = static_cast<double>(t.global_batch * t.seq_len);
  const int threads = current_num_threads();
  say(fmt::format("{} model, {:.3f}M parameters; data {} ({} tokens); {} step{} of {} x {} tokens ({} micro-batch{} "
                  "of {}); {} thread{}{}",
                  model->arch(), static_cast<double>(model->num_parameters()) / 1e6, cfg.data.path, data->size(),
                  t.steps, t.steps == 1 ? "" : "s", t.global_batch, t.seq_len, M, M == 1 ? "" : "es", mb, threads,
                  threads == 1 ? "" : "s", t.warmup_note()));

  std::string metrics_path = options.metrics_path.empty() ? cfg.log.metrics : options.metrics_path;
  std::ofstream metrics;
  if (!metrics_path.empty()) {
    metrics.open(metrics_path, start > 0 ? std::ios::app : std::ios::trunc);
    TESSEL_CHECK(metrics.good(), "cannot write metrics file '{}'", metrics_path);
  }
  const bool live = options.progress && !options.quiet && ::isatty(::fileno(stderr));

  TrainResult result;
  TrainerState state{.step = start, .seed = t.seed, .config = cfg.resolved, .settings = settings};
  int64_t saved_at = -1;
  auto save = [&](int64_t step) {
    saved_at = step;
    state.step = step;
    result.last_checkpoint = save_checkpoint(options.save_dir, *model, optimizer.get(), state, static_cast<int>(t.keep_last));
    if (live) std::fputs("\r\033[K", stderr);
    say(fmt::format("saved {}", result.last_checkpoint));
  };
  if (!options.save_dir.empty() && t.save_init && start == 0) save(0);

  std::optional<StopSignals> stop;
  if (options.stop_on_signal && !options.save_dir.empty())
    stop.emplace(fmt::format("stopping after this step with a checkpoint in {} (send it again to stop at once)",
                             options.save_dir));

  if (td.validation && start == 0) {
    const double v = validation_loss(*model, td, t.micro_batch, eot);
    result.validation.emplace_back(0, v);
    say(initial_validation_line(v, cfg));
  }
  auto run_start = Clock::now();
  double recent = 0;  // smoothed seconds per step for the ETA
  for (int64_t step = start; step < t.steps; ++step) {
    if (auto f = armed_fault("step", 0, step)) inject_fault(*f);
    ProfileScope profile_step("(train step)");
    auto t0 = Clock::now();
    Batch batch = [&] {
      ProfileScope scope("(data wait)");
      return loader.next();
    }();
    double lr = schedule.at(step);
    optimizer->set_lr(lr);
    double loss_sum = 0;
    nn::moe_step().loss_scale = 1.0 / static_cast<double>(M);  // the MoE losses' share, as the main loss's
    for (int64_t m = 0; m < M; ++m) {
      Tensor in = view::slice(batch.inputs, 0, m * mb, (m + 1) * mb);
      Tensor tg = view::slice(batch.targets, 0, m * mb, (m + 1) * mb);
      nn::sequence_state() = sequence_of(in, eot);
      nn::dropout_state() = nn::DropoutState{.seed = t.seed, .step = static_cast<uint64_t>(step),
                                             .global_rows = t.global_batch, .row_offset = m * mb};
      Tensor loss;
      {
        ProfileScope scope("(forward)");
        loss = nn::lm_loss(*model, in, tg);
      }
      loss_sum += loss.item();
      backward(M == 1 ? loss : scale(loss, 1.0 / static_cast<double>(M)));
    }
    double loss = loss_sum / static_cast<double>(M);
    TESSEL_CHECK(std::isfinite(loss), "training diverged: the loss is {} at step {} (try a lower train.lr or train.grad_clip)",
                 loss, step);
    // The clip coefficient scales each gradient inside the update (no separate pass over them).
    const double norm = std::sqrt(optim::grad_sum_squares(params));
    {
      ProfileScope scope("(optimizer step + zero_grad)");
      optimizer->step(optim::clip_coefficient(norm, t.grad_clip));
      optimizer->zero_grad();
    }
    double secs = std::chrono::duration<double>(Clock::now() - t0).count();

    StepRecord rec{step, loss, lr, norm, tokens_per_step / secs, secs};
    if (td.validation && t.evaluates_after(step)) {
      rec.val_loss = validation_loss(*model, td, t.micro_batch, eot);
      result.validation.emplace_back(step + 1, *rec.val_loss);
    }
    result.steps.push_back(rec);
    if (on_step) on_step(rec);
    if (metrics.is_open()) {
      metrics << step_metrics(rec, std::chrono::duration<double>(Clock::now() - run_start).count()).dump() << '\n';
      metrics.flush();
    }
    recent = recent == 0 ? secs : 0.9 * recent + 0.1 * secs;
    std::string line = step_line(rec, t.steps, recent * static_cast<double>(t.steps - step - 1));
    bool permanent = step == start || (step + 1) % cfg.log.every == 0 || step + 1 == t.steps || rec.val_loss;
    if (live) {
      std::fprintf(stderr, "\r\033[K%s%s", line.c_str(), permanent ? "\n" : "");
      std::fflush(stderr);
    } else if (permanent && !options.quiet) {
      log_info("{}", line);
    }
    if (!options.save_dir.empty() && t.save_every > 0 && (step + 1) % t.save_every == 0 && step + 1 != t.steps) save(step + 1);
    if (stop && stop->requested() != 0 && step + 1 < t.steps) {
      result.stopped_by = stop->requested();
      if (saved_at != step + 1) save(step + 1);  // either save cleared the live line
      say(fmt::format("stopped by {} after step {} of {}; continue with --resume {} --save {}",
                      signal_name(result.stopped_by), step + 1, t.steps, options.save_dir, options.save_dir));
      break;
    }
  }
  if (!options.save_dir.empty() && start < t.steps && result.stopped_by == 0) save(t.steps);
  result.seconds = std::chrono::duration<double>(Clock::now() - run_start).count();
  if (options.collect_params)
    for (nn::Parameter* p : model->parameters()) result.final_params[p->name] = p->value;
  return result;
}

}  // namespace tessel
