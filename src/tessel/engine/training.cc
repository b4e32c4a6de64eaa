// The pieces every training loop shares.
#include "tessel/engine/training.h"

#include <cmath>

#include "tessel/core/context.h"
#include "tessel/core/error.h"

namespace tessel {

std::string duration_str(double s) {
  if (!std::isfinite(s) || s < 0) return "?";
  int64_t t = static_cast<int64_t>(s + 0.5);
  if (t >= 3600) return fmt::format("{}h{:02d}m", t / 3600, (t % 3600) / 60);
  if (t >= 60) return fmt::format("{}m{:02d}s", t / 60, t % 60);
  return fmt::format("{}s", t);
}

std::string rate_str(double tokens_per_s) {
  if (tokens_per_s >= 1e6) return fmt::format("{:.2f}M", tokens_per_s / 1e6);
  if (tokens_per_s >= 1e3) return fmt::format("{:.1f}k", tokens_per_s / 1e3);
  return fmt::format("{:.0f}", tokens_per_s);
}

TrainingData open_training_data(const RunConfig& cfg, int64_t vocab_size) {
  const DataSection& d = cfg.data;
  TrainingData out;
  if (d.path.empty() && meta_mode()) {  // a traced step (engine/trace.h): any tokens of the right count
    const int64_t n = cfg.train.global_batch * (cfg.train.seq_len + 1) + 1;
    out.train = std::make_shared<TokenDataset>(TokenDataset::from_tokens(std::vector<uint32_t>(static_cast<size_t>(n), 0)));
    return out;
  }
  out.train = std::make_shared<TokenDataset>(TokenDataset::open(d.path, d.format));
  // Token ids past the vocabulary, like every other fault of a data file, are the user's input
  // to fix (InputError: exit status 2).
  TESSEL_CHECK_AS(InputError, out.train->max_token() < vocab_size, "data file '{}' holds token id {} but model.vocab_size is {}",
               d.path, out.train->max_token(), vocab_size);
  if (!d.has_validation()) return out;
  std::string what;
  if (!d.val_path.empty()) {
    out.validation = std::make_shared<TokenDataset>(TokenDataset::open(d.val_path, d.format));
    what = fmt::format("data.val_path '{}'", d.val_path);
    TESSEL_CHECK_AS(InputError, out.validation->max_token() < vocab_size,
                 "validation tokens of '{}' hold token id {} but model.vocab_size is {}", d.val_path,
                 out.validation->max_token(), vocab_size);
  } else {
    const int64_t n = out.train->size(), held = static_cast<int64_t>(static_cast<double>(n) * d.val_fraction);
    TESSEL_CHECK_AS(InputError, held > 0 && held < n, "data.val_fraction {} of the {} tokens of '{}' holds out {}; nothing to "
                 "validate on or to train on", d.val_fraction, n, d.path, held);
    out.validation = std::make_shared<TokenDataset>(out.train->slice(n - held, n));
    out.train = std::make_shared<TokenDataset>(out.train->slice(0, n - held));
    what = fmt::format("data.val_fraction {} (the last {} tokens of '{}')", d.val_fraction, held, d.path);
  }
  try {
    out.validation_order.emplace(out.validation->size(), cfg.train.seq_len, cfg.train.global_batch,
                                 SampleOrder::sequential, cfg.train.seed);
  } catch (const InputError& e) {
    throw InputError(fmt::format("validation tokens from {}: {}", what, e.what()));
  }
  out.validation_batches = cfg.train.eval_batches;
  return out;
}

std::string initial_validation_line(double loss, const RunConfig& cfg) {
  const int64_t n = cfg.train.eval_batches;
  return fmt::format("validation loss before training: {:.4f} ({} batch{} of {} x {} tokens)", loss, n,
                     n == 1 ? "" : "es", cfg.train.global_batch, cfg.train.seq_len);
}

std::string step_line(const StepRecord& r, int64_t total_steps, double eta_seconds) {
  std::string line = fmt::format("step {}/{}  loss {:.4f}  lr {:.2e}  grad_norm {:.3f}  {} tok/s  ETA {}", r.step + 1,
                                 total_steps, r.loss, r.lr, r.grad_norm, rate_str(r.tokens_per_s),
                                 duration_str(eta_seconds));
  if (r.val_loss) line += fmt::format("  val_loss {:.4f}", *r.val_loss);
  if (r.moe.is_object())
    line += fmt::format("  aux {:.4f}  z {:.3f}  dropped {:.2f}%", r.moe.at("aux_loss").as_double(),
                        r.moe.at("z_loss").as_double(), 100 * r.moe.at("dropped_fraction").as_double());
  return line;
}

Json step_metrics(const StepRecord& r, double elapsed_s) {
  Json line = Json::Object{};
  line["step"] = r.step;
  line["loss"] = r.loss;
  line["lr"] = r.lr;
  line["grad_norm"] = r.grad_norm;
  line["tokens_per_s"] = r.tokens_per_s;
  line["step_time_s"] = r.seconds;
  if (r.val_loss) line["val_loss"] = *r.val_loss;
  if (r.moe.is_object()) line["moe"] = r.moe;
  line["elapsed_s"] = elapsed_s;
  return line;
}

std::vector<std::string> changed_settings(const Json& then, const Json& now) {
  const Json::Object &a = then.as_object(), &b = now.as_object();
  auto text = [](const Json::Object& o, const std::string& key) {
    auto it = o.find(key);
    return it == o.end() ? std::string("(unset)") : it->second.as_string();
  };
  std::vector<std::string> out;
  for (const auto& [key, value] : b) {
    const std::string before = text(a, key);
    if (before != value.as_string()) out.push_back(fmt::format("{} {} -> {}", key, before, value.as_string()));
  }
  for (const auto& [key, value] : a)
    if (!b.contains(key)) out.push_back(fmt::format("{} {} -> (unset)", key, value.as_string()));
  return out;
}

std::string bytes_str(int64_t b) {
  if (b >= (int64_t{1} << 30)) return fmt::format("{:.2f} GiB", static_cast<double>(b) / (1 << 30));
  if (b >= (int64_t{1} << 20)) return fmt::format("{:.2f} MiB", static_cast<double>(b) / (1 << 20));
  return fmt::format("{:.1f} KiB", static_cast<double>(b) / 1024);
}

}  // namespace tessel
