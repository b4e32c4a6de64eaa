// Training checkpoint folders.
#include "tessel/ckpt/checkpoint.h"

#include <unistd.h>

#include <charconv>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "tessel/ckpt/safetensors.h"
#include "tessel/core/view.h"
#include "tessel/dist/dtensor.h"
#include "tessel/ops/inplace.h"
#include "tessel/ops/shape.h"

namespace tessel {

namespace fs = std::filesystem;

namespace {

// `t` — a tensor of `from`'s elements (a parameter or an optimizer state of one) — viewed with
// the shape `to`: the same row-major bytes. The one place where a parameter's shape and its
// checkpoint-file shape (nn::Parameter::file_shape, e.g. GPT-2's c_attn [C, 3, C] vs Hugging
// Face's [C, 3C]) meet.
Tensor reshaped(const Tensor& t, const Shape& to) {
  if (t.shape() == to) return t;
  return is_dist(t) ? reshape(t, to) : view::reshape(t, to);
}

// Optimizer states are named "<parameter>.<slot>": those of parameters with a file shape are
// converted between it and the parameter's shape (`to_file`: towards the file).
std::map<std::string, Tensor> optimizer_file_layout(nn::Module& model, std::map<std::string, Tensor> state,
                                                    bool to_file) {
  for (nn::Parameter* p : model.parameters()) {
    if (p->file_shape.empty()) continue;
    const std::string prefix = p->name + ".";
    for (auto it = state.lower_bound(prefix); it != state.end() && it->first.rfind(prefix, 0) == 0; ++it)
      if (it->first.find('.', prefix.size()) == std::string::npos && it->second.numel() == shape_numel(p->shape))
        it->second = reshaped(it->second, to_file ? p->file_shape : p->shape);
  }
  return state;
}

}  // namespace

std::map<std::string, Tensor> model_state(nn::Module& model) {
  std::map<std::string, Tensor> out;
  for (nn::Parameter* p : model.parameters()) {
    TESSEL_CHECK_AS(CheckpointError, p->value.defined(), "save: parameter '{}' is not materialised", p->name);
    out[p->name] = reshaped(p->value, p->stored_shape());
  }
  return out;
}

void save_model(const std::string& path, nn::Module& model, const std::map<std::string, std::string>& metadata) {
  std::map<std::string, std::string> meta = metadata;
  meta.emplace("format", "pt");  // what transformers expects of a PyTorch-style safetensors file
  save_safetensors(path, model_state(model), meta);
}

void load_model(const std::string& path, nn::LanguageModel& model) {
  SafetensorsFile f = SafetensorsFile::open(path);
  std::map<std::string, bool> used;
  for (const SafetensorsEntry& e : f.entries()) used[e.name] = false;
  for (nn::Parameter* p : model.parameters()) {
    std::string key = p->name;
    if (!f.contains(key) && key.rfind("transformer.", 0) == 0 && f.contains(key.substr(12))) key = key.substr(12);
    TESSEL_CHECK_AS(CheckpointError, f.contains(key), "checkpoint '{}' has no tensor for parameter '{}'", path, p->name);
    const SafetensorsEntry& entry = f.entry(key);
    const Shape& shape = entry.shape;
    TESSEL_CHECK_AS(CheckpointError,
                    entry.dtype == "F32" || entry.dtype == "F64" || entry.dtype == "BF16" || entry.dtype == "F16",
                    "checkpoint '{}': tensor \"{}\" is {}, but parameter '{}' takes floating-point weights", path, key,
                    entry.dtype, p->name);
    TESSEL_CHECK_AS(CheckpointError, shape == p->stored_shape(),
                    "checkpoint '{}': tensor \"{}\" has shape {} but parameter '{}' has {}", path, key,
                    shape_str(shape), p->name, shape_str(p->stored_shape()));
    used[key] = true;
    if (!p->value.defined()) continue;  // held by another rank
    Tensor t = reshaped(f.load(key), p->shape);
    if (is_dist(p->value)) {
      const DistAttr& a = dist_attr(p->value);
      copy_(local_piece(p->value), local_piece(shard_tensor(t, a.mesh, a.placements)));
    } else {
      copy_(p->value, t);
    }
  }
  for (const auto& [name, u] : used)
    TESSEL_CHECK_AS(CheckpointError, u || model.ignorable_checkpoint_key(name),
                    "checkpoint '{}' holds \"{}\", which is not a parameter of this {} model", path, name, model.arch());
}

void check_checkpoint_dir(const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  TESSEL_CHECK_AS(CheckpointError, !ec, "checkpoint folder '{}' cannot be created: {}", dir, ec.message());
  fs::path probe = fs::path(dir) / fmt::format(".write-test.{}", ::getpid());
  bool ok = std::ofstream(probe).good();
  fs::remove(probe, ec);
  TESSEL_CHECK_AS(CheckpointError, ok, "checkpoint folder '{}' is not writable", dir);
}

std::string save_checkpoint(const std::string& dir, nn::LanguageModel& model, const optim::Optimizer* optimizer,
                            const TrainerState& state) {
  fs::path final_dir = fs::path(dir) / fmt::format("step-{:06d}", state.step);
  fs::path tmp = fs::path(dir) / fmt::format(".step-{:06d}.tmp{}", state.step, ::getpid());
  std::error_code ec;
  fs::remove_all(tmp, ec);
  fs::create_directories(tmp, ec);
  TESSEL_CHECK_AS(CheckpointWriteError, !ec, "checkpoint: cannot create '{}': {}", tmp.string(), ec.message());
  save_model((tmp / "model.safetensors").string(), model, {{"step", std::to_string(state.step)}});
  if (optimizer != nullptr)
    save_safetensors((tmp / "optimizer.safetensors").string(),
                     optimizer_file_layout(model, optimizer->state_dict(), /*to_file=*/true));
  Json meta = Json::Object{};
  meta["step"] = state.step;
  meta["seed"] = static_cast<int64_t>(state.seed);
  meta["arch"] = model.arch();
  meta["config"] = state.config;
  if (state.settings.is_object()) meta["settings"] = state.settings;
  {
    std::ofstream out(tmp / "trainer.json");
    out << meta.dump() << "\n";
    TESSEL_CHECK_AS(CheckpointWriteError, out.good(), "checkpoint: writing '{}' failed", (tmp / "trainer.json").string());
  }
  fs::remove_all(final_dir, ec);
  fs::rename(tmp, final_dir, ec);
  TESSEL_CHECK_AS(CheckpointWriteError, !ec, "checkpoint: cannot move '{}' to '{}': {}", tmp.string(), final_dir.string(),
                  ec.message());
  return final_dir.string();
}

namespace {

// N of a folder named step-N (digits only), or -1.
int64_t step_of_folder(const std::string& name) {
  if (name.rfind("step-", 0) != 0 || name.size() == 5) return -1;
  int64_t step = 0;
  auto [end, ec] = std::from_chars(name.data() + 5, name.data() + name.size(), step);
  return ec == std::errc() && end == name.data() + name.size() ? step : -1;
}

}  // namespace

std::string resolve_checkpoint(const std::string& path) {
  fs::path p(path);
  TESSEL_CHECK_AS(CheckpointError, fs::exists(p), "checkpoint path '{}' does not exist", path);
  if (fs::exists(p / "trainer.json")) return p.string();
  std::string best;
  int64_t best_step = -1;  // by number: step-1000000 is newer than step-999999
  for (const auto& entry : fs::directory_iterator(p)) {
    const int64_t step = step_of_folder(entry.path().filename().string());
    if (entry.is_directory() && step > best_step && fs::exists(entry.path() / "trainer.json")) {
      best = entry.path().string();
      best_step = step;
    }
  }
  TESSEL_CHECK_AS(CheckpointError, !best.empty(), "no checkpoint (step-NNNNNN folder with trainer.json) under '{}'", path);
  return best;
}

TrainerState load_checkpoint(const std::string& path, nn::LanguageModel& model, optim::Optimizer* optimizer) {
  fs::path dir = resolve_checkpoint(path);
  std::ifstream in(dir / "trainer.json");
  std::stringstream text;
  text << in.rdbuf();
  const std::string trainer_json = (dir / "trainer.json").string();
  TrainerState state;
  std::string arch;
  try {
    Json meta = Json::parse(text.str());
    state.step = meta.at("step").as_int();
    state.seed = static_cast<uint64_t>(meta.at("seed").as_int());
    if (const Json* c = meta.find("config")) state.config = *c;
    if (const Json* s = meta.find("settings")) {
      TESSEL_CHECK(s->is_object(), "\"settings\" is not an object");
      state.settings = *s;
    }
    arch = meta.at("arch").as_string();
  } catch (const CheckpointError&) {
    throw;
  } catch (const Error& e) {
    throw CheckpointError(fmt::format("checkpoint '{}': bad trainer.json: {}", trainer_json, e.what()));
  }
  TESSEL_CHECK_AS(CheckpointError, state.step >= 0, "checkpoint '{}': step {} is negative", trainer_json, state.step);
  TESSEL_CHECK_AS(CheckpointError, arch == model.arch(), "checkpoint '{}' holds a {} model but the config builds {}",
                  dir.string(), arch, model.arch());
  const std::string model_file = (dir / "model.safetensors").string();
  const std::map<std::string, std::string> model_meta = SafetensorsFile::open(model_file).metadata();
  if (auto it = model_meta.find("step"); it != model_meta.end())
    TESSEL_CHECK_AS(CheckpointError, it->second == std::to_string(state.step),
                    "checkpoint '{}': model.safetensors was saved at step {} but trainer.json says {}", dir.string(),
                    it->second, state.step);
  load_model(model_file, model);
  if (optimizer != nullptr) {
    fs::path opt = dir / "optimizer.safetensors";
    TESSEL_CHECK_AS(CheckpointError, fs::exists(opt), "checkpoint '{}' has no optimizer.safetensors", dir.string());
    std::map<std::string, Tensor> st =
        optimizer_file_layout(model, SafetensorsFile::open(opt.string()).load_all(), /*to_file=*/false);
    try {
      optimizer->load_state_dict(st);
    } catch (const Error& e) {
      throw CheckpointError(fmt::format("checkpoint '{}': {}", opt.string(), e.what()));
    }
    TESSEL_CHECK_AS(CheckpointError, optimizer->steps() == state.step,
                    "checkpoint '{}': optimizer is at step {} but trainer.json says {}", dir.string(), optimizer->steps(),
                    state.step);
  }
  return state;
}

}  // namespace tessel
