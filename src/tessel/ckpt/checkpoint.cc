// Training checkpoint folders.
#include "tessel/ckpt/checkpoint.h"

#include <unistd.h>

#include <charconv>
#include <filesystem>
#include <fstream>
#include <set>
#include <thread>
#include <sstream>

#include "tessel/ckpt/safetensors.h"
#include "tessel/ckpt/sharded.h"
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

}  // namespace

void split_stacked(std::map<std::string, Tensor>& tensors, const std::string& name) {
  auto it = tensors.find(name);
  TESSEL_ASSERT(it != tensors.end() && it->second.dim() >= 1, "split_stacked: no stacked tensor '{}'", name);
  const Tensor whole = is_dist(it->second) ? full_tensor(it->second) : it->second;
  tensors.erase(it);
  for (int64_t i = 0; i < whole.size(0); ++i)
    tensors[nn::stacked_file_name(name, i)] = view::contiguous(view::select(whole, 0, i));
}

std::map<std::string, Tensor> model_state(nn::Module& model) {
  std::map<std::string, Tensor> out;
  for (nn::Parameter* p : model.parameters()) {
    TESSEL_CHECK_AS(CheckpointError, p->value.defined(), "save: parameter '{}' is not materialised", p->name);
    out[p->name] = reshaped(p->value, p->stored_shape());
    if (p->file_stack) split_stacked(out, p->name);
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
  // The file's tensor `key` for (a slice of) parameter p, of `shape`: checked and marked used.
  auto find = [&](const nn::Parameter* p, std::string key, const Shape& shape) {
    if (!f.contains(key) && key.rfind("transformer.", 0) == 0 && f.contains(key.substr(12))) key = key.substr(12);
    TESSEL_CHECK_AS(CheckpointError, f.contains(key), "checkpoint '{}' has no tensor \"{}\" for parameter '{}'", path,
                    key, p->name);
    const SafetensorsEntry& entry = f.entry(key);
    TESSEL_CHECK_AS(CheckpointError,
                    entry.dtype == "F32" || entry.dtype == "F64" || entry.dtype == "BF16" || entry.dtype == "F16",
                    "checkpoint '{}': tensor \"{}\" is {}, but parameter '{}' takes floating-point weights", path, key,
                    entry.dtype, p->name);
    TESSEL_CHECK_AS(CheckpointError, entry.shape == shape,
                    "checkpoint '{}': tensor \"{}\" has shape {} but parameter '{}' has {}", path, key,
                    shape_str(entry.shape), p->name, shape_str(shape));
    used[key] = true;
    return key;
  };
  for (nn::Parameter* p : model.parameters()) {
    std::vector<std::string> keys;  // one, or one per index of a stacked parameter's dim 0
    if (p->file_stack) {
      const Shape each(p->stored_shape().begin() + 1, p->stored_shape().end());
      for (int64_t i = 0; i < p->shape[0]; ++i) keys.push_back(find(p, nn::stacked_file_name(p->name, i), each));
    } else {
      keys.push_back(find(p, p->name, p->stored_shape()));
    }
    if (!p->value.defined()) continue;  // held by another rank
    Tensor t;
    if (p->file_stack) {
      t = Tensor::empty(p->shape, p->value.dtype());
      for (size_t i = 0; i < keys.size(); ++i) copy_(view::select(t, 0, static_cast<int64_t>(i)), f.load(keys[i]));
    } else {
      t = reshaped(f.load(keys[0]), p->shape);
    }
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
  // Named per process and thread: the thread ranks of one process check at once.
  fs::path probe = fs::path(dir) / fmt::format(".write-test.{}.{}", ::getpid(),
                                               std::hash<std::thread::id>{}(std::this_thread::get_id()));
  bool ok = std::ofstream(probe).good();
  fs::remove(probe, ec);
  TESSEL_CHECK_AS(CheckpointError, ok, "checkpoint folder '{}' is not writable", dir);
}

Json trainer_json(const nn::LanguageModel& model, const TrainerState& state) {
  Json meta = Json::Object{};
  meta["step"] = state.step;
  meta["seed"] = static_cast<int64_t>(state.seed);
  meta["arch"] = model.arch();
  meta["config"] = state.config;
  if (state.settings.is_object()) meta["settings"] = state.settings;
  if (state.layout.is_object()) meta["layout"] = state.layout;
  return meta;
}

TrainerState parse_trainer_json(const CheckpointReader& reader, const nn::LanguageModel& model) {
  const std::string file = (fs::path(reader.dir()) / "trainer.json").string();
  const Json& meta = reader.trainer();
  TrainerState state;
  std::string arch;
  try {
    state.step = meta.at("step").as_int();
    state.seed = static_cast<uint64_t>(meta.at("seed").as_int());
    if (const Json* c = meta.find("config")) state.config = *c;
    if (const Json* s = meta.find("settings")) {
      TESSEL_CHECK(s->is_object(), "\"settings\" is not an object");
      state.settings = *s;
    }
    if (const Json* l = meta.find("layout")) state.layout = *l;
    arch = meta.at("arch").as_string();
  } catch (const CheckpointError&) {
    throw;
  } catch (const Error& e) {
    throw CheckpointError(fmt::format("checkpoint '{}': bad trainer.json: {}", file, e.what()));
  }
  TESSEL_CHECK_AS(CheckpointError, state.step >= 0, "checkpoint '{}': step {} is negative", file, state.step);
  TESSEL_CHECK_AS(CheckpointError, arch == model.arch(), "checkpoint '{}' holds a {} model but the config builds {}",
                  reader.dir(), arch, model.arch());
  state.dir = reader.dir();
  return state;
}

std::vector<CheckpointTensor> model_checkpoint_tensors(const std::vector<nn::Parameter*>& params) {
  std::vector<CheckpointTensor> out;
  for (nn::Parameter* p : params)
    if (p->value.defined()) out.push_back({p->name, p->value, p->stored_shape()});
  return out;
}

std::vector<CheckpointTensor> optimizer_checkpoint_tensors(nn::Module& model, const std::map<std::string, Tensor>& state) {
  std::map<std::string, Shape> file_shapes;  // "<parameter>.<slot>" of parameters with a file shape
  for (nn::Parameter* p : model.parameters())
    if (!p->file_shape.empty()) file_shapes[p->name] = p->file_shape;
  std::vector<CheckpointTensor> out;
  for (const auto& [name, t] : state) {
    const size_t dot = name.rfind('.');
    auto it = dot == std::string::npos ? file_shapes.end() : file_shapes.find(name.substr(0, dot));
    out.push_back({name, t, it != file_shapes.end() && shape_numel(it->second) == t.numel() ? it->second : Shape{}});
  }
  return out;
}

void check_model_tensors(const CheckpointReader& reader, nn::LanguageModel& model) {
  std::set<std::string> params;
  for (nn::Parameter* p : model.parameters()) {
    params.insert(p->name);
    TESSEL_CHECK_AS(CheckpointError, reader.contains(p->name), "checkpoint '{}' has no tensor for parameter '{}'",
                    reader.dir(), p->name);
  }
  for (const std::string& name : reader.names())
    TESSEL_CHECK_AS(CheckpointError, reader.group(name) != "model" || params.count(name) || model.ignorable_checkpoint_key(name),
                    "checkpoint '{}' holds \"{}\", which is not a parameter of this {} model", reader.dir(), name,
                    model.arch());
}

std::string save_checkpoint(const std::string& dir, nn::LanguageModel& model, const optim::Optimizer* optimizer,
                            const TrainerState& state, int keep_last) {
  CheckpointContent content;
  content.step = state.step;
  content.groups["model"] = model_checkpoint_tensors(model.parameters());
  if (optimizer != nullptr) content.groups["optimizer"] = optimizer_checkpoint_tensors(model, optimizer->state_dict());
  content.trainer = trainer_json(model, state);
  return save_sharded_checkpoint(dir, content, nullptr, {.keep_last = keep_last});
}

std::string resolve_checkpoint(const std::string& path) { return choose_checkpoint(path, nullptr, /*verify=*/false); }

TrainerState load_checkpoint(const std::string& path, nn::LanguageModel& model, optim::Optimizer* optimizer) {
  CheckpointReader reader(choose_checkpoint(path, nullptr));
  TrainerState state = parse_trainer_json(reader, model);
  check_model_tensors(reader, model);
  std::vector<CheckpointTensor> targets = model_checkpoint_tensors(model.parameters());
  if (optimizer != nullptr) {
    // The optimizer's slots may not exist yet: read each state tensor into a new one.
    std::map<std::string, Tensor> st;
    std::map<std::string, nn::Parameter*> by_name;
    for (nn::Parameter* p : model.parameters()) by_name[p->name] = p;
    for (const std::string& name : reader.names()) {
      if (reader.group(name) != "optimizer") continue;
      const size_t dot = name.rfind('.');
      auto it = dot == std::string::npos ? by_name.end() : by_name.find(name.substr(0, dot));
      const bool of_param = it != by_name.end() && shape_numel(it->second->shape) == shape_numel(reader.shape(name));
      const Shape shape = of_param ? it->second->shape : reader.shape(name);
      const DType dtype = reader.dtype(name) == "I64" ? DType::i64 : DType::f32;
      st[name] = Tensor::empty(shape, dtype);
      targets.push_back({name, st[name], of_param ? it->second->stored_shape() : Shape{}});
    }
    TESSEL_CHECK_AS(CheckpointError, !st.empty(), "checkpoint '{}' has no optimizer state", reader.dir());
    reader.read(targets);
    try {
      optimizer->load_state_dict(st);
    } catch (const Error& e) {
      throw CheckpointError(fmt::format("checkpoint '{}': optimizer state: {}", reader.dir(), e.what()));
    }
    TESSEL_CHECK_AS(CheckpointError, optimizer->steps() == state.step,
                    "checkpoint '{}': optimizer is at step {} but trainer.json says {}", reader.dir(),
                    optimizer->steps(), state.step);
  } else {
    reader.read(targets);
  }
  return state;
}

}  // namespace tessel
