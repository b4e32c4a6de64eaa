// Strict YAML config reading.
#include "tessel/cli/config.h"

#include <fmt/ranges.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <filesystem>
#include <set>
#include <sstream>
#include <thread>
#include <type_traits>

#include "tessel/core/error.h"
#include "tessel/core/input_file.h"
#include "tessel/core/limits.h"
#include "tessel/core/yaml_guard.h"
#include "tessel/optim/optimizer.h"
#include "tessel/parallel/schedule.h"

namespace tessel {

namespace {

std::string where(const YAML::Node& n, const std::string& source) {
  YAML::Mark m = n.Mark();
  if (m.line < 0) return source;
  return fmt::format("{}:{}", source, m.line + 1);
}

// The --set arguments by the key path they set ("train.lr" -> "train.lr=3e-4").
using Overrides = std::map<std::string, std::string>;

// Where a value came from: the --set that gave it, or its line in the config file.
std::string origin(const YAML::Node& n, const std::string& key_path, const std::string& source, const Overrides& set) {
  for (std::string path = key_path;; path = path.substr(0, path.rfind('.'))) {
    if (auto it = set.find(path); it != set.end()) return fmt::format("--set '{}'", it->second);
    if (path.find('.') == std::string::npos) break;
  }
  return where(n, source);
}

// A mapping whose keys are consumed one by one; finish() rejects anything left over.
class Section {
 public:
  Section(YAML::Node node, std::string path, std::string source, const Overrides& set)
      : node_(std::move(node)), path_(std::move(path)), source_(std::move(source)), set_(set) {
    TESSEL_CHECK(!node_ || node_.IsNull() || node_.IsMap(), "{}: config section '{}' must be a mapping of keys",
                 origin(node_, path_, source_, set_), path_);
  }

  bool has(const std::string& key) const { return node_ && node_.IsMap() && node_[key]; }
  // Marks `key` as known without reading it (sub-sections read on their own).
  void mark(const std::string& key) { known_.insert(key); }

  template <typename T>
  T get(const std::string& key, T fallback) {
    known_.insert(key);
    if (!has(key)) return fallback;
    return convert<T>(node_[key], key);
  }

  template <typename T>
  T require(const std::string& key) {
    known_.insert(key);
    TESSEL_CHECK(has(key), "{}: config is missing '{}'", source_, full(key));
    return convert<T>(node_[key], key);
  }

  void finish() {
    if (!node_ || !node_.IsMap()) return;
    for (const auto& kv : node_) {
      std::string key = kv.first.as<std::string>();
      if (!known_.count(key)) {
        std::string list;
        for (const std::string& k : known_) list += (list.empty() ? "" : ", ") + k;
        TESSEL_THROW("{}: unknown config key '{}' (known keys of '{}': {})", origin(kv.first, full(key), source_, set_),
                     full(key), path_, list);
      }
    }
  }

  std::string full(const std::string& key) const { return path_.empty() ? key : path_ + "." + key; }
  // Where `key`'s value came from, for messages about it.
  std::string origin_of(const std::string& key) const {
    return origin(has(key) ? node_[key] : node_, full(key), source_, set_);
  }
  // `parse(value)` with its errors prefixed by the key and where the value came from.
  template <typename F>
  auto parsed(const std::string& key, const std::string& fallback, F parse) {
    const std::string text = get<std::string>(key, fallback);
    try {
      return parse(text);
    } catch (const Error& e) {
      TESSEL_THROW("{}: config '{}': {}", origin_of(key), full(key), e.what());
    }
  }

 private:
  template <typename T>
  static constexpr bool kIsList = std::is_same_v<T, std::vector<double>> || std::is_same_v<T, std::vector<int64_t>> ||
                                  std::is_same_v<T, std::vector<std::string>>;

  template <typename T>
  T convert(const YAML::Node& v, const std::string& key) {
    // Where the value came from, worked out only for an error message.
    auto at = [&] { return origin(v, full(key), source_, set_); };
    try {
      if constexpr (kIsList<T>) {
        TESSEL_CHECK(v.IsSequence(), "{}: config '{}' must be a list", at(), full(key));
      } else {
        TESSEL_CHECK(v.IsScalar(), "{}: config '{}' must be a single value", at(), full(key));
      }
      T value = v.as<T>();
      // Every number a config gives is finite: an infinite rate or epsilon trains silently
      // wrong, and no key has a use for one.
      if constexpr (std::is_floating_point_v<T>) {
        TESSEL_CHECK(std::isfinite(value), "{}: config '{}' must be a finite number, got '{}'", at(), full(key),
                     v.Scalar());
      } else if constexpr (std::is_same_v<T, std::vector<double>>) {
        for (double x : value)
          TESSEL_CHECK(std::isfinite(x), "{}: config '{}' must be a list of finite numbers, got {}", at(), full(key),
                       YAML::Dump(v));
      }
      return value;
    } catch (const YAML::Exception&) {
      const char* expected = std::is_same_v<T, bool>                  ? "true or false"
                             : std::is_integral_v<T>                  ? "an integer"
                             : std::is_floating_point_v<T>            ? "a number"
                             : std::is_same_v<T, std::string>         ? "a string"
                             : std::is_same_v<T, std::vector<double>> ? "a list of numbers"
                             : std::is_same_v<T, std::vector<std::string>> ? "a list of names"
                                                                           : "a list of integers";
      TESSEL_THROW("{}: config '{}' must be {}, got '{}'", at(), full(key), expected,
                   v.IsScalar() ? v.Scalar() : YAML::Dump(v));
    }
  }

  YAML::Node node_;
  std::string path_, source_;
  const Overrides& set_;
  std::set<std::string> known_;
};

void apply_override(YAML::Node& root, const std::string& text, Overrides& set) {
  size_t eq = text.find('=');
  TESSEL_CHECK(eq != std::string::npos && eq > 0, "--set '{}': expected key.path=value", text);
  std::string path = text.substr(0, eq), value = text.substr(eq + 1);
  std::vector<std::string> keys;
  std::stringstream ss(path);
  for (std::string k; std::getline(ss, k, '.');) {
    TESSEL_CHECK(!k.empty(), "--set '{}': empty key in '{}'", text, path);
    keys.push_back(k);
  }
  // Walk by value-copies of handles: yaml-cpp nodes are references into the document.
  std::vector<YAML::Node> chain{root};
  for (size_t i = 0; i + 1 < keys.size(); ++i) {
    YAML::Node next = chain.back()[keys[i]];
    if (!next || next.IsNull()) {
      chain.back()[keys[i]] = YAML::Node(YAML::NodeType::Map);
      next = chain.back()[keys[i]];
    }
    TESSEL_CHECK(next.IsMap(), "--set '{}': '{}' is not a section", text, keys[i]);
    chain.push_back(next);
  }
  YAML::Node parsed;
  check_yaml_text(value, fmt::format("--set '{}'", text), "config");
  try {
    parsed = YAML::Load(value);
  } catch (const YAML::Exception& e) {
    TESSEL_THROW("--set '{}': cannot parse the value: {}", text, e.what());
  }
  chain.back()[keys.back()] = parsed;
  set[path] = text;
}

Json to_json(const YAML::Node& n) {
  if (!n || n.IsNull()) return Json();
  if (n.IsMap()) {
    Json o = Json::Object{};
    for (const auto& kv : n) o[kv.first.as<std::string>()] = to_json(kv.second);
    return o;
  }
  if (n.IsSequence()) {
    Json a = Json::Array{};
    for (const auto& e : n) a.push_back(to_json(e));
    return a;
  }
  return Json(n.Scalar());
}

std::string resolve_path(const std::string& p, const std::string& base_dir) {
  if (p.empty() || std::filesystem::path(p).is_absolute() || base_dir.empty()) return p;
  std::filesystem::path joined = std::filesystem::path(base_dir) / p;
  // Prefer the path relative to the config file; fall back to the working directory. The
  // error_code forms: a name too long to look up is reported when the file is opened, naming
  // its key, rather than as a filesystem exception here.
  std::error_code ec;
  const bool joined_exists = std::filesystem::exists(joined, ec);
  return joined_exists || !std::filesystem::exists(p, ec) ? joined.lexically_normal().string() : p;
}

// Refuses a product of sizes past kMaxElements (docs/training.md, "Limits"), naming each key:
// sizes that multiply past int64 would wrap into small or negative element counts.
void check_elements(const std::string& source, const char* what,
                    std::initializer_list<std::pair<const char*, int64_t>> factors) {
  int64_t product = 1;
  bool fits = true;
  std::string terms;
  for (const auto& [key, v] : factors) {
    std::optional<int64_t> next = checked_mul(product, v);
    fits = fits && next && *next <= kMaxElements;
    if (fits) product = *next;
    terms += fmt::format("{}'{}' ({})", terms.empty() ? "" : " x ", key, v);
  }
  TESSEL_CHECK(fits, "{}: config {} = {} is more than {} elements, the most tessel holds in one tensor (2^48)", source,
               what, terms, kMaxElements);
}

// GPT-2's three dropout rates under their config keys (Hugging Face's names).
std::array<std::pair<const char*, double>, 3> dropout_rates(const nn::Gpt2Config& g) {
  return {{{"resid_pdrop", g.dropout}, {"embd_pdrop", g.embd_rate()}, {"attn_pdrop", g.attn_rate()}}};
}

// Sizes and constants the model could not be built or trained with, named by key path (the
// model constructors check again, in their own words, for callers that skip the config).
void check_model_sizes(const ModelSection& m, const std::string& source) {
  using Values = std::initializer_list<std::pair<const char*, double>>;
  auto positive = [&](Values keys) {
    for (const auto& [key, v] : keys)
      TESSEL_CHECK(v > 0, "{}: config 'model.{}' must be positive, got {}", source, key, v);
  };
  auto multiple = [&](const char* key, int64_t v, const char* of, int64_t d) {
    TESSEL_CHECK(v % d == 0, "{}: config 'model.{}' ({}) must be a multiple of 'model.{}' ({})", source, key, v, of, d);
  };
  const double init_range = m.arch == "gpt2" ? m.gpt2.initializer_range : m.llama.initializer_range;
  TESSEL_CHECK(init_range >= 0, "{}: config 'model.initializer_range' must be 0 or more, got {}", source, init_range);
  auto d = [](int64_t v) { return static_cast<double>(v); };
  if (m.arch == "gpt2") {
    const nn::Gpt2Config& c = m.gpt2;
    positive({{"n_layer", d(c.n_layer)}, {"n_embd", d(c.n_embd)}, {"n_head", d(c.n_head)},
              {"vocab_size", d(c.vocab_size)}, {"n_positions", d(c.n_positions)},
              {"layer_norm_epsilon", c.layer_norm_epsilon}});
    multiple("n_embd", c.n_embd, "n_head", c.n_head);
    check_elements(source, "the token embedding", {{"model.vocab_size", c.vocab_size}, {"model.n_embd", c.n_embd}});
    check_elements(source, "the position embedding",
                   {{"model.n_positions", c.n_positions}, {"model.n_embd", c.n_embd}});
    check_elements(source, "the blocks' weights",
                   {{"model.n_layer", c.n_layer}, {"12", 12}, {"model.n_embd", c.n_embd}, {"model.n_embd", c.n_embd}});
    for (const auto& [key, v] : dropout_rates(c))
      TESSEL_CHECK(v >= 0 && v < 1, "{}: config 'model.{}' must be in [0, 1), got {}", source, key, v);
    return;
  }
  const nn::LlamaConfig& c = m.llama;
  positive({{"num_hidden_layers", d(c.num_hidden_layers)}, {"hidden_size", d(c.hidden_size)},
            {"num_attention_heads", d(c.num_attention_heads)}, {"num_key_value_heads", d(c.num_key_value_heads)},
            {"intermediate_size", d(c.intermediate_size)}, {"vocab_size", d(c.vocab_size)},
            {"max_position_embeddings", d(c.max_position_embeddings)}, {"rope_theta", c.rope_theta},
            {"rms_norm_eps", c.rms_norm_eps}});
  multiple("hidden_size", c.hidden_size, "num_attention_heads", c.num_attention_heads);
  check_elements(source, "the token embedding",
                 {{"model.vocab_size", c.vocab_size}, {"model.hidden_size", c.hidden_size}});
  check_elements(source, "the blocks' MLP weights",
                 {{"model.num_hidden_layers", c.num_hidden_layers}, {"3", 3}, {"model.hidden_size", c.hidden_size},
                  {"model.intermediate_size", c.intermediate_size}});
  check_elements(source, "the blocks' attention weights",
                 {{"model.num_hidden_layers", c.num_hidden_layers}, {"4", 4}, {"model.hidden_size", c.hidden_size},
                  {"model.hidden_size", c.hidden_size}});
  check_elements(source, "the rotary table",
                 {{"model.max_position_embeddings", c.max_position_embeddings}, {"model.hidden_size", c.hidden_size}});
  multiple("num_attention_heads", c.num_attention_heads, "num_key_value_heads", c.num_key_value_heads);
  if (m.arch == "mixtral") {
    const nn::MoeConfig& e = c.moe;
    positive({{"num_local_experts", d(e.num_experts)}, {"num_experts_per_tok", d(e.top_k)},
              {"decoder_sparse_step", d(c.moe_every)}});
    TESSEL_CHECK(e.top_k <= e.num_experts,
                 "{}: config 'model.num_experts_per_tok' ({}) must be at most 'model.num_local_experts' ({})", source,
                 e.top_k, e.num_experts);
    TESSEL_CHECK(e.scores == "softmax" || e.scores == "sigmoid",
                 "{}: config 'model.router_scores' must be softmax or sigmoid, got '{}'", source, e.scores);
    for (const auto& [key, v] : {std::pair{"capacity_factor", e.capacity_factor}, {"router_aux_loss_coef", e.aux_loss_coef},
                                 {"router_z_loss_coef", e.z_loss_coef}})
      TESSEL_CHECK(v >= 0, "{}: config 'model.{}' must be 0 or more, got {}", source, key, v);
    TESSEL_CHECK(e.shared_expert_hidden >= 0, "{}: config 'model.shared_expert_intermediate_size' must be 0 or more, got {}",
                 source, e.shared_expert_hidden);
    check_elements(source, "the experts' weights",
                   {{"model.num_hidden_layers", c.num_hidden_layers}, {"model.num_local_experts", e.num_experts},
                    {"3", 3}, {"model.hidden_size", c.hidden_size}, {"model.intermediate_size", c.intermediate_size}});
  }
  const int64_t head_dim = c.hidden_size / c.num_attention_heads;
  TESSEL_CHECK(head_dim % 2 == 0,
               "{}: a head's width, 'model.hidden_size' / 'model.num_attention_heads' = {} / {} = {}, must be even "
               "(rotary embedding turns pairs of features)",
               source, c.hidden_size, c.num_attention_heads, head_dim);
}

void read_model(Section& s, ModelSection& m, const std::string& base_dir, const std::string& source) {
  m.arch = s.require<std::string>("arch");
  TESSEL_CHECK(m.arch == "gpt2" || m.arch == "llama" || m.arch == "mixtral",
               "{}: config 'model.arch' must be gpt2, llama or mixtral, got '{}'", source, m.arch);
  m.init_from = resolve_path(s.get<std::string>("init_from", ""), base_dir);
  s.mark("hf_config");  // merged into the section before reading
  if (m.arch == "gpt2") {
    nn::Gpt2Config& c = m.gpt2;
    c.n_layer = s.get("n_layer", c.n_layer);
    c.n_embd = s.get("n_embd", c.n_embd);
    c.n_head = s.get("n_head", c.n_head);
    c.vocab_size = s.get("vocab_size", c.vocab_size);
    c.n_positions = s.get("n_positions", c.n_positions);
    c.layer_norm_epsilon = s.get("layer_norm_epsilon", c.layer_norm_epsilon);
    c.initializer_range = s.get("initializer_range", c.initializer_range);
    c.dropout = s.get("resid_pdrop", c.dropout);
    // Absent, the other two rates follow resid_pdrop (tessel's single rate before they were read).
    c.embd_dropout = s.has("embd_pdrop") ? s.get("embd_pdrop", 0.0) : -1;
    c.attn_dropout = s.has("attn_pdrop") ? s.get("attn_pdrop", 0.0) : -1;
  } else {
    nn::LlamaConfig& c = m.llama;
    c.num_hidden_layers = s.get("num_hidden_layers", c.num_hidden_layers);
    c.hidden_size = s.get("hidden_size", c.hidden_size);
    c.num_attention_heads = s.get("num_attention_heads", c.num_attention_heads);
    c.num_key_value_heads = s.get("num_key_value_heads", c.num_attention_heads);
    c.intermediate_size = s.get("intermediate_size", c.intermediate_size);
    c.vocab_size = s.get("vocab_size", c.vocab_size);
    c.max_position_embeddings = s.get("max_position_embeddings", c.max_position_embeddings);
    c.rope_theta = s.get("rope_theta", c.rope_theta);
    c.rms_norm_eps = s.get("rms_norm_eps", c.rms_norm_eps);
    c.initializer_range = s.get("initializer_range", c.initializer_range);
    if (m.arch == "mixtral") {  // Hugging Face's Mixtral keys, and the MoE options it lacks
      nn::MoeConfig& e = c.moe;
      e = nn::MoeConfig{};
      e.num_experts = s.get("num_local_experts", e.num_experts);
      e.top_k = s.get("num_experts_per_tok", e.top_k);
      e.expert_hidden = c.intermediate_size;
      e.scores = s.get("router_scores", e.scores);
      e.renormalize = s.get("norm_topk_prob", e.renormalize);
      e.capacity_factor = s.get("capacity_factor", e.capacity_factor);
      e.aux_loss_coef = s.get("router_aux_loss_coef", e.aux_loss_coef);
      e.z_loss_coef = s.get("router_z_loss_coef", e.z_loss_coef);
      e.shared_expert_hidden = s.get("shared_expert_intermediate_size", e.shared_expert_hidden);
      c.moe_every = s.get("decoder_sparse_step", c.moe_every);
      s.mark("output_router_logits");  // Hugging Face's switch for returning the aux loss; tessel always adds it
    }
  }
  s.finish();
  check_model_sizes(m, source);
}

// Keys of a Hugging Face config.json that tessel reads; everything else there is ignored.
const std::set<std::string> kHfKeys = {"n_layer",
                                       "n_embd",
                                       "n_head",
                                       "vocab_size",
                                       "n_positions",
                                       "layer_norm_epsilon",
                                       "initializer_range",
                                       "resid_pdrop",
                                       "embd_pdrop",
                                       "attn_pdrop",
                                       "num_hidden_layers",
                                       "hidden_size",
                                       "num_attention_heads",
                                       "num_key_value_heads",
                                       "intermediate_size",
                                       "max_position_embeddings",
                                       "rope_theta",
                                       "rms_norm_eps",
                                       "num_local_experts",
                                       "num_experts_per_tok",
                                       "router_aux_loss_coef",
                                       "norm_topk_prob",
                                       "decoder_sparse_step",
                                       "shared_expert_intermediate_size"};

// Keys of a config.json that turn the model into something tessel does not build. Any value
// but the ones tessel implements (absent or null is always fine) is refused, rather than
// training — and saving under Hugging Face's names — a model other than the one described.
struct HfFixed {
  const char* arch;
  const char* key;
  std::vector<std::string> accepted;
  const char* why;
};
const std::vector<HfFixed> kHfFixed = {
    {"gpt2", "activation_function", {"gelu_new", "gelu_pytorch_tanh"}, "the MLP uses the tanh-approximated GELU"},
    {"gpt2", "scale_attn_weights", {"true"}, "attention scores are scaled by 1/sqrt(head width)"},
    {"gpt2", "scale_attn_by_inverse_layer_idx", {"false"}, "attention scores are not scaled by layer"},
    {"gpt2", "add_cross_attention", {"false"}, "the blocks have no cross-attention"},
    {"gpt2", "tie_word_embeddings", {"true"}, "the LM head is the token embedding"},
    {"llama", "hidden_act", {"silu"}, "the MLP is SwiGLU with SiLU"},
    {"llama", "tie_word_embeddings", {"false"}, "the LM head is a matrix of its own"},
    {"llama", "attention_bias", {"false"}, "the attention projections have no biases"},
    {"llama", "mlp_bias", {"false"}, "the MLP projections have no biases"},
    {"llama", "rope_scaling", {}, "RoPE is unscaled"},
    {"llama", "attention_dropout", {"0", "0.0"}, "attention has no dropout (llama has no dropout layers)"},
    {"mixtral", "hidden_act", {"silu"}, "the experts are SwiGLU with SiLU"},
    {"mixtral", "tie_word_embeddings", {"false"}, "the LM head is a matrix of its own"},
    {"mixtral", "rope_scaling", {}, "RoPE is unscaled"},
    {"mixtral", "sliding_window", {}, "attention is not windowed"},
    {"mixtral", "router_jitter_noise", {"0", "0.0"}, "the router adds no jitter noise"},
    {"mixtral", "attention_dropout", {"0", "0.0"}, "attention has no dropout (mixtral has no dropout layers)"},
};

void check_hf_architecture(const YAML::Node& hf, const std::string& arch, const std::string& where) {
  auto int_of = [&](const char* key) { return hf[key] ? hf[key].as<int64_t>() : int64_t{0}; };
  for (const HfFixed& f : kHfFixed) {
    const YAML::Node v = hf[f.key];
    if (arch != f.arch || !v || v.IsNull()) continue;
    const std::string text = v.IsScalar() ? v.as<std::string>() : YAML::Dump(v);
    TESSEL_CHECK(v.IsScalar() && std::find(f.accepted.begin(), f.accepted.end(), text) != f.accepted.end(),
                 "{}: \"{}\" is {}, which tessel's {} does not build: {} ({})", where, f.key, text, arch, f.why,
                 f.accepted.empty() ? std::string("null or absent") : fmt::format("{}", fmt::join(f.accepted, " or ")));
  }
  // Widths other than the ones tessel derives.
  if (arch == "gpt2" && hf["n_inner"] && !hf["n_inner"].IsNull())
    TESSEL_CHECK(hf["n_inner"].as<int64_t>() == 4 * int_of("n_embd"),
                 "{}: \"n_inner\" is {}, which tessel's gpt2 does not build: the MLP is 4 x n_embd = {} wide", where,
                 hf["n_inner"].as<std::string>(), 4 * int_of("n_embd"));
  if ((arch == "llama" || arch == "mixtral") && hf["head_dim"] && !hf["head_dim"].IsNull() && int_of("num_attention_heads") > 0)
    TESSEL_CHECK(hf["head_dim"].as<int64_t>() == int_of("hidden_size") / int_of("num_attention_heads"),
                 "{}: \"head_dim\" is {}, which tessel's llama does not build: a head is hidden_size / "
                 "num_attention_heads = {} wide",
                 where, hf["head_dim"].as<std::string>(), int_of("hidden_size") / int_of("num_attention_heads"));
}

void merge_hf_config(YAML::Node model, const std::string& base_dir, const std::string& source) {
  if (!model || !model.IsMap() || !model["hf_config"]) return;
  TESSEL_CHECK(model["hf_config"].IsScalar(), "{}: config 'model.hf_config' must be a file name, got {}",
               where(model["hf_config"], source), YAML::Dump(model["hf_config"]));
  std::string path = resolve_path(model["hf_config"].as<std::string>(), base_dir);
  const std::string what = fmt::format("{}: model.hf_config", source);
  const std::string text = read_input_file(path, what);
  const std::string origin = fmt::format("{}: model.hf_config {}", source, path);
  check_yaml_text(text, origin, "key");
  YAML::Node hf;
  try {
    hf = YAML::Load(text);  // JSON is YAML
  } catch (const YAML::Exception& e) {
    TESSEL_THROW("{}: model.hf_config '{}': {}", source, path, e.what());
  }
  TESSEL_CHECK(hf.IsMap(), "{}: model.hf_config '{}' is not a JSON object", source, path);
  if (!model["arch"] && hf["model_type"]) {
    TESSEL_CHECK(hf["model_type"].IsScalar(), "{}: model.hf_config '{}': \"model_type\" must be a name, got {}",
                 source, path, YAML::Dump(hf["model_type"]));
    model["arch"] = hf["model_type"].as<std::string>();
  }
  try {
    check_hf_architecture(hf, model["arch"] ? model["arch"].as<std::string>() : "",
                          fmt::format("{}: model.hf_config '{}'", source, path));
  } catch (const YAML::Exception& e) {
    TESSEL_THROW("{}: model.hf_config '{}': a value has the wrong type: {}", source, path, e.what());
  }
  // The file's values are checked as a model of their own when the YAML overrides any of them
  // (else they are the merged model's, checked with it): a file with a size of -5 is broken
  // even where the YAML replaces that size.
  YAML::Node own;
  own["arch"] = model["arch"] && model["arch"].IsScalar() ? model["arch"].as<std::string>() : std::string("gpt2");
  bool overridden = false;
  for (const auto& kv : hf) {
    std::string key = kv.first.as<std::string>();
    if (!kHfKeys.count(key)) continue;
    own[key] = kv.second;
    if (model[key]) overridden = true;
    else model[key] = kv.second;
  }
  if (!overridden) return;
  const std::string own_source = fmt::format("{}: model.hf_config '{}' (its own values, which the YAML overrides)",
                                             source, path);
  const Overrides none;
  Section section(own, "model", own_source, none);
  for (const std::string& key : kHfKeys) section.mark(key);
  ModelSection m;
  read_model(section, m, base_dir, own_source);
}

}  // namespace

static RunConfig read_run_config(const std::string& yaml_text, const std::vector<std::string>& overrides,
                                 const std::string& base_dir, const std::string& source, ConfigUse use) {
  // Aliases, duplicate and non-scalar keys are refused before a node tree is built or walked.
  check_yaml_text(yaml_text, source, "config");
  YAML::Node root;
  try {
    root = YAML::Load(yaml_text);
  } catch (const YAML::Exception& e) {
    TESSEL_THROW("{}: not valid YAML: {}", source, e.what());
  }
  if (!root || root.IsNull()) root = YAML::Node(YAML::NodeType::Map);
  TESSEL_CHECK(root.IsMap(), "{}: a config is a mapping with sections model, data, train, log", source);
  Overrides set;
  for (const std::string& o : overrides) apply_override(root, o, set);
  merge_hf_config(root["model"], base_dir, source);

  RunConfig c;
  Section top(root, "", source, set);
  TESSEL_CHECK(root["model"], "{}: config has no 'model' section", source);
  // Planning reads only the model and the train section's sizes; a config of a model alone plans.
  TESSEL_CHECK(root["data"] || use == ConfigUse::planning, "{}: config has no 'data' section", source);
  Section model(root["model"], "model", source, set);
  top.mark("model");
  read_model(model, c.model, base_dir, source);

  Section data(root["data"], "data", source, set);
  top.mark("data");
  if (root["data"] || use == ConfigUse::training) c.data.path = resolve_path(data.require<std::string>("path"), base_dir);
  c.data.format = data.parsed("format", "text", parse_token_format);
  c.data.order = data.parsed("order", "random", parse_sample_order);
  c.data.val_path = resolve_path(data.get<std::string>("val_path", ""), base_dir);
  c.data.val_fraction = data.get("val_fraction", c.data.val_fraction);
  c.data.pack_documents = data.get("pack_documents", c.data.pack_documents);
  c.data.eot_token = data.get("eot_token", c.data.eot_token);
  data.finish();

  Section train(root["train"], "train", source, set);
  top.mark("train");
  TrainSection& t = c.train;
  t.steps = train.get("steps", t.steps);
  t.global_batch = train.get("global_batch", t.global_batch);
  t.micro_batch = train.get("micro_batch", t.global_batch);
  // A config read to plan a model alone (no train section's seq_len) plans at the model's full
  // context, not at a default the model may not reach.
  if (use == ConfigUse::planning && !train.has("seq_len"))
    t.seq_len = c.model.arch == "gpt2" ? c.model.gpt2.n_positions : c.model.llama.max_position_embeddings;
  t.seq_len = train.get("seq_len", t.seq_len);
  t.lr = train.get("lr", t.lr);
  t.min_lr = train.get("min_lr", t.lr / 10);
  t.schedule = train.parsed("schedule", t.schedule, [](const std::string& text) {
    optim::LrSchedule::parse_kind(text);  // refuses an unknown kind
    return text;
  });
  t.warmup = train.get("warmup", t.warmup);
  t.weight_decay = train.get("weight_decay", t.weight_decay);
  std::vector<double> betas = train.get("betas", std::vector<double>{t.beta1, t.beta2});
  TESSEL_CHECK(betas.size() == 2, "{}: config 'train.betas' must be two numbers (beta1, beta2), got {}",
               train.origin_of("betas"), betas.size());
  for (double b : betas)
    TESSEL_CHECK(b >= 0 && b < 1, "{}: config 'train.betas' must be in [0, 1), got [{}, {}]", train.origin_of("betas"),
                 betas[0], betas[1]);
  t.beta1 = betas[0];
  t.beta2 = betas[1];
  t.eps = train.get("eps", t.eps);
  t.grad_clip = train.get("grad_clip", t.grad_clip);
  const int64_t seed = train.get<int64_t>("seed", static_cast<int64_t>(t.seed));
  TESSEL_CHECK(seed >= 0, "{}: config 'train.seed' must be 0 or more, got {}", source, seed);
  t.seed = static_cast<uint64_t>(seed);
  t.dropout = train.get("dropout", t.dropout);
  t.optimizer = train.get("optimizer", t.optimizer);
  t.momentum = train.get("momentum", t.momentum);
  t.nesterov = train.get("nesterov", t.nesterov);
  t.save_every = train.get("save_every", t.save_every);
  t.save_init = train.get("save_init", t.save_init);
  t.keep_last = train.get("keep_last", t.keep_last);
  t.async_save = train.get("async_save", t.async_save);
  t.memory_save_every = train.get("memory_save_every", t.memory_save_every);
  t.memory_dir = train.get("memory_dir", t.memory_dir);
  t.threads = train.get("threads", t.threads);
  t.device = train.get("device", t.device);
  t.precision = train.get("precision", t.precision);
  t.grad_reduce = train.get("grad_reduce", t.grad_reduce);
  t.eval_every = train.get("eval_every", t.eval_every);
  t.eval_batches = train.get("eval_batches", t.eval_batches);
  train.finish();

  Section par(root["parallel"], "parallel", source, set);
  top.mark("parallel");
  parallel::ParallelConfig& pc = c.parallel;
  pc.dp = par.get("dp", pc.dp);
  pc.tp = par.get("tp", pc.tp);
  pc.pp = par.get("pp", pc.pp);
  pc.ep = par.get("ep", pc.ep);
  pc.cp = par.get("cp", pc.cp);
  pc.cp_method = par.get("cp_method", pc.cp_method);
  pc.vpp = par.get("vpp", pc.vpp);
  pc.sharding_stage = par.get("sharding_stage", pc.sharding_stage);
  pc.sp = par.get("sp", pc.sp);
  const int64_t micro_batches = par.get("micro_batches", int64_t{0});
  // Several chunks per pipeline rank run only on the interleaved schedule: its default then.
  pc.schedule = par.parsed("schedule", pc.vpp > 1 ? "VPP" : pc.schedule, parallel::canonical_schedule_name);
  pc.recompute = par.get("recompute", pc.recompute);
  pc.stage_layers = par.get("stage_layers", pc.stage_layers);
  pc.mesh = par.get("mesh", pc.mesh);
  pc.bucket_mb = par.get("bucket_mb", pc.bucket_mb);
  c.timeout_s = par.get("timeout_s", c.timeout_s);
  TESSEL_CHECK(c.timeout_s == 0 || (c.timeout_s > 0 && c.timeout_s <= 1e6), "{}: config 'parallel.timeout_s' must be a "
               "positive number of seconds up to 1000000, got {}", par.origin_of("timeout_s"), c.timeout_s);
  try {
    pc.check_mesh();
  } catch (const Error& e) {
    TESSEL_THROW("{}: {}", par.origin_of("mesh"), e.what());
  }
  par.finish();
  // One source for the micro-batch count: parallel.micro_batches, when given, sets
  // train.micro_batch.
  if (micro_batches != 0) {
    TESSEL_CHECK(micro_batches > 0 && t.global_batch % micro_batches == 0,
                 "{}: config 'parallel.micro_batches' ({}) must divide 'train.global_batch' ({})", source,
                 micro_batches, t.global_batch);
    t.micro_batch = t.global_batch / micro_batches;
  }

  Section log(root["log"], "log", source, set);
  top.mark("log");
  c.log.every = log.get("every", c.log.every);
  c.log.metrics = log.get<std::string>("metrics", "");
  log.finish();
  top.finish();

  // Values that parse but make no sense.
  auto positive = [&](const char* key, double v) {
    TESSEL_CHECK(v > 0, "{}: config '{}' must be positive, got {}", source, key, v);
  };
  positive("train.steps", static_cast<double>(t.steps));
  positive("train.global_batch", static_cast<double>(t.global_batch));
  positive("train.micro_batch", static_cast<double>(t.micro_batch));
  positive("train.seq_len", static_cast<double>(t.seq_len));
  positive("train.lr", t.lr);
  positive("log.every", static_cast<double>(c.log.every));
  // Sizes that multiply into element counts: past 2^48 they would wrap (docs/training.md, "Limits").
  const int64_t width = c.model.arch == "gpt2" ? c.model.gpt2.n_embd : c.model.llama.hidden_size;
  const int64_t vocab = c.model.arch == "gpt2" ? c.model.gpt2.vocab_size : c.model.llama.vocab_size;
  const int64_t heads = c.model.arch == "gpt2" ? c.model.gpt2.n_head : c.model.llama.num_attention_heads;
  check_elements(source, "a step's activations",
                 {{"train.global_batch", t.global_batch}, {"train.seq_len", t.seq_len}, {"model width", width}});
  check_elements(source, "a micro-batch's logits",
                 {{"train.micro_batch", t.micro_batch}, {"train.seq_len", t.seq_len}, {"model.vocab_size", vocab}});
  check_elements(source, "a micro-batch's attention scores",
                 {{"train.micro_batch", t.micro_batch}, {"attention heads", heads}, {"train.seq_len", t.seq_len},
                  {"train.seq_len", t.seq_len}});
  // The run's tokens are a count, never a tensor: only a 64-bit overflow bounds them.
  TESSEL_CHECK(checked_product({t.steps, t.global_batch, t.seq_len}, std::numeric_limits<int64_t>::max()),
               "{}: config 'train.steps' x 'train.global_batch' x 'train.seq_len' = {} x {} x {} tokens overflow the "
               "run's 64-bit token counter", source, t.steps, t.global_batch, t.seq_len);
  TESSEL_CHECK(t.global_batch % t.micro_batch == 0,
               "{}: config 'train.global_batch' ({}) must be a multiple of 'train.micro_batch' ({})", source,
               t.global_batch, t.micro_batch);
  TESSEL_CHECK(t.optimizer == "adamw" || t.optimizer == "sgd", "{}: config 'train.optimizer' must be adamw or sgd, got '{}'",
               source, t.optimizer);
  pc.micro_batches = t.global_batch / t.micro_batch;
  TESSEL_CHECK(t.dropout < 1.0 && (t.dropout >= 0 || !train.has("dropout")),
               "{}: config 'train.dropout' must be in [0, 1), got {}", source, t.dropout);
  // A warm-up longer than the run is allowed (a short trial of a long run's config): the rate
  // then rises the whole way, and the run's first log line says so (warmup_note).
  auto not_negative = [&](const char* key, double v) {
    TESSEL_CHECK(v >= 0, "{}: config '{}' must be 0 or more, got {}", source, key, v);
  };
  not_negative("train.warmup", static_cast<double>(t.warmup));
  not_negative("train.weight_decay", t.weight_decay);
  not_negative("train.grad_clip", t.grad_clip);  // 0 turns clipping off
  not_negative("train.save_every", static_cast<double>(t.save_every));
  not_negative("train.keep_last", static_cast<double>(t.keep_last));
  not_negative("train.memory_save_every", static_cast<double>(t.memory_save_every));
  not_negative("train.threads", static_cast<double>(t.threads));
  TESSEL_CHECK(t.device == "cpu" || t.device == "cuda" || t.device == "guarded",
               "{}: config 'train.device' is '{}'; expected cpu, cuda or guarded", source, t.device);
  for (const auto& [key, value] : {std::pair{"precision", &t.precision}, std::pair{"grad_reduce", &t.grad_reduce}}) {
    if (*value == "float32") *value = "f32";
    if (*value == "bfloat16") *value = "bf16";
    TESSEL_CHECK(*value == "f32" || *value == "bf16", "{}: config 'train.{}' is '{}'; expected f32 or bf16", source,
                 key, *value);
  }
  not_negative("train.eval_every", static_cast<double>(t.eval_every));
  positive("train.eval_batches", static_cast<double>(t.eval_batches));
  TESSEL_CHECK(c.data.val_fraction >= 0 && c.data.val_fraction <= 0.5,
               "{}: config 'data.val_fraction' must be in [0, 0.5], got {}", source, c.data.val_fraction);
  TESSEL_CHECK(!c.data.pack_documents || (c.data.eot_token >= 0 && c.data.eot_token < vocab),
               "{}: config 'data.pack_documents' needs 'data.eot_token', the end-of-text token id that separates the "
               "documents, in [0, model vocab {}); got {}", source, vocab, c.data.eot_token);
  TESSEL_CHECK(c.data.val_path.empty() || c.data.val_fraction == 0,
               "{}: config 'data.val_path' and 'data.val_fraction' are two sources of validation tokens; give one",
               source);
  for (const char* key : {"eval_every", "eval_batches"})
    TESSEL_CHECK(c.data.has_validation() || !train.has(key),
                 "{}: config 'train.{}' needs validation tokens: 'data.val_path' or 'data.val_fraction'", source, key);
  // A mixture-of-experts block routes each sequence as a group (docs/moe.md); under cp its
  // ranks add up the group's counts, which serves dropless routing, not a capacity (that ranks
  // the group's assignments together).
  TESSEL_CHECK(c.model.arch != "mixtral" || pc.cp == 1 || c.model.llama.moe.capacity_factor == 0,
               "{}: config 'parallel.cp' is {} with 'model.capacity_factor' {}: a capacity ranks each sequence's "
               "assignments together, and context parallel splits the sequence over ranks; use dropless routing "
               "(capacity_factor 0) with cp",
               source, pc.cp, c.model.llama.moe.capacity_factor);
  if (pc.ep > 1) {
    TESSEL_CHECK(c.model.arch == "mixtral", "{}: config 'parallel.ep' is {}, but a {} model has no experts to split",
                 source, pc.ep, c.model.arch);
    TESSEL_CHECK(c.model.llama.moe.num_experts % pc.ep == 0,
                 "{}: config 'parallel.ep' ({}) must divide 'model.num_local_experts' ({})", source, pc.ep,
                 c.model.llama.moe.num_experts);
  }
  TESSEL_CHECK(c.model.arch == "gpt2" || !train.has("dropout") || t.dropout == 0,
               "{}: config 'train.dropout' is {}, but llama has no dropout layers (gpt2 does)", source, t.dropout);
  TESSEL_CHECK(t.threads <= 1024, "{}: config 'train.threads' is {}; this machine has {} hardware threads", source,
               t.threads, std::thread::hardware_concurrency());
  TESSEL_CHECK(t.min_lr >= 0 && t.min_lr <= t.lr,
               "{}: config 'train.min_lr' ({}) must be in [0, 'train.lr' ({})]: the schedule decays towards it", source,
               t.min_lr, t.lr);
  // Each optimizer's own keys are checked for that optimizer only. A zero epsilon would divide
  // 0 by 0 for every parameter whose gradient is still 0 (unused vocabulary rows).
  if (t.optimizer == "adamw") positive("train.eps", t.eps);
  // Another optimizer's keys are ignored, and the run says so: a config written for one optimizer
  // is still run with the other by --set train.optimizer=..., but not in silence.
  for (const auto& [key, owner] : {std::pair{"momentum", "sgd"}, std::pair{"nesterov", "sgd"},
                                   std::pair{"betas", "adamw"}, std::pair{"eps", "adamw"}})
    if (t.optimizer != owner && train.has(key))
      t.optimizer_note += fmt::format("{}{}: config 'train.{}' is a setting of train.optimizer {}; this run's optimizer "
                                      "is {}, which ignores it{}",
                                      t.optimizer_note.empty() ? "" : "\n", train.origin_of(key), key, owner,
                                      t.optimizer, t.optimizer == "adamw" ? " (AdamW's momentum is train.betas[0])" : "");
  if (t.optimizer == "sgd") {
    TESSEL_CHECK(t.momentum >= 0 && t.momentum < 1, "{}: config 'train.momentum' must be in [0, 1), got {}", source,
                 t.momentum);
    TESSEL_CHECK(!t.nesterov || t.momentum > 0, "{}: config 'train.nesterov' needs 'train.momentum' above 0", source);
  }
  // The parallel section is checked for every run, not only when it asks for several ranks:
  // a degree of 0 or -1 would otherwise fall back to one rank without a word.
  if (pc.dp > 0 && pc.tp > 0 && pc.pp > 0 && pc.cp > 0)
    TESSEL_CHECK(checked_product({pc.dp, pc.tp, pc.pp, pc.cp}, kMaxDevices),
                 "{}: config 'parallel.dp' x 'parallel.tp' x 'parallel.pp' x 'parallel.cp' = {} x {} x {} x {} is more "
                 "than {} ranks, the most tessel runs (2^20)", source, pc.dp, pc.tp, pc.pp, pc.cp, kMaxDevices);
  try {
    pc.validate(c.model.arch == "gpt2" ? c.model.gpt2.n_layer : c.model.llama.num_hidden_layers, t.global_batch);
  } catch (const Error& e) {
    TESSEL_THROW("{}: config {}", source, e.what());
  }
  try {
    pc.validate_cp(t.seq_len, heads,
                   c.model.arch == "gpt2" ? c.model.gpt2.n_head : c.model.llama.num_key_value_heads);
  } catch (const Error& e) {
    TESSEL_THROW("{}: config {}", source, e.what());
  }
  // GPT-2's attention is sharded by heads over tp (the parallel trainer checks again).
  TESSEL_CHECK(c.model.arch != "gpt2" || pc.tp < 1 || c.model.gpt2.n_head % pc.tp == 0,
               "{}: config 'model.n_head' ({}) must be a multiple of 'parallel.tp' ({}): tensor parallelism gives "
               "each tp rank whole attention heads", source, c.model.gpt2.n_head, pc.tp);
  if (t.dropout >= 0 && c.model.arch == "gpt2") {  // every rate: residual, embedding and attention
    nn::Gpt2Config& g = c.model.gpt2;
    std::vector<std::string> replaced;
    for (const auto& [key, v] : dropout_rates(g))
      if (v != t.dropout) replaced.push_back(fmt::format("model.{} {}", key, v));
    if (!replaced.empty())
      t.dropout_note = fmt::format(
          "train.dropout ({}) replaces the model's dropout rates ({}); leave train.dropout "
          "out to train with those",
          t.dropout, fmt::join(replaced, ", "));
    g.dropout = t.dropout;
    g.embd_dropout = g.attn_dropout = -1;
  }
  int64_t max_len = c.model.arch == "gpt2" ? c.model.gpt2.n_positions : c.model.llama.max_position_embeddings;
  TESSEL_CHECK(t.seq_len <= max_len, "{}: config 'train.seq_len' ({}) exceeds the model's {} ({})", source, t.seq_len,
               c.model.arch == "gpt2" ? "n_positions" : "max_position_embeddings", max_len);
  c.resolved = to_json(root);
  return c;
}

RunConfig parse_run_config(const std::string& yaml_text, const std::vector<std::string>& overrides,
                           const std::string& base_dir, const std::string& source, ConfigUse use) {
  // Every error of a config is the user's to fix (exit 2) and names the file: the library's own
  // exceptions (yaml-cpp's, the file system's) are turned into such errors here.
  try {
    return read_run_config(yaml_text, overrides, base_dir, source, use);
  } catch (const InputError&) {
    throw;
  } catch (const Error& e) {
    throw InputError(e.what());
  } catch (const YAML::Exception& e) {
    throw InputError(fmt::format("{}: {}", source, e.what()));
  } catch (const std::filesystem::filesystem_error& e) {
    throw InputError(fmt::format("{}: {}", source, e.what()));
  }
}

RunConfig load_run_config(const std::string& path, const std::vector<std::string>& overrides, ConfigUse use) {
  const std::string text = read_input_file(path, "config");
  return parse_run_config(text, overrides, std::filesystem::path(path).parent_path().string(), path, use);
}

}  // namespace tessel
