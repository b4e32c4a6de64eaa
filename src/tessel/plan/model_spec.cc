#include "tessel/plan/model_spec.h"

#include <utility>

#include "tessel/core/error.h"

namespace tessel::plan {

double ModelSpec::layer_parameters() const {
  const double h = static_cast<double>(hidden), f = static_cast<double>(ffn);
  const double kv = static_cast<double>(kv_heads * head_dim());
  if (swiglu()) return h * (h + 2 * kv) + h * h + 3 * h * f + 2 * h;  // q,k,v,o; gate,up,down; 2 norms
  return h * 3 * h + 3 * h + h * h + h + 2 * h * f + f + h + 4 * h;  // c_attn, c_proj, mlp, 2 LayerNorms
}

double ModelSpec::expert_parameters() const {
  return static_cast<double>(experts) * 3 * static_cast<double>(hidden) * static_cast<double>(ffn);
}

double ModelSpec::moe_layer_parameters() const {
  const double h = static_cast<double>(hidden);
  // The dense block less its MLP, plus the router [E, h], the experts and the shared experts.
  return layer_parameters() - 3 * h * static_cast<double>(ffn) + h * static_cast<double>(experts) +
         expert_parameters() + 3 * h * static_cast<double>(shared_ffn);
}

int64_t ModelSpec::moe_layers(int64_t first, int64_t last) const {
  if (!is_moe() || last <= first) return 0;
  // Blocks i with (i + 1) % moe_every == 0: multiples of moe_every among [first + 1, last].
  return last / moe_every - first / moe_every;
}

double ModelSpec::parameters() const {
  const double h = static_cast<double>(hidden), v = static_cast<double>(vocab);
  const double sparse = static_cast<double>(moe_layers(0, layers));
  double p = (static_cast<double>(layers) - sparse) * layer_parameters() + sparse * moe_layer_parameters() + v * h +
             (swiglu() ? h : 2 * h);
  if (!tied_embedding) p += v * h;
  if (position_embedding) p += static_cast<double>(seq) * h;
  return p;
}

ModelSpec gpt_spec(std::string name, int64_t layers, int64_t hidden, int64_t heads, int64_t vocab, int64_t seq) {
  ModelSpec m;
  m.name = std::move(name);
  m.arch = "gpt";
  m.layers = layers;
  m.hidden = hidden;
  m.heads = m.kv_heads = heads;
  m.ffn = 4 * hidden;
  m.vocab = vocab;
  m.seq = seq;
  return m;
}

ModelSpec llama_spec(std::string name, int64_t layers, int64_t hidden, int64_t heads, int64_t kv_heads, int64_t ffn,
                     int64_t vocab, int64_t seq) {
  ModelSpec m;
  m.name = std::move(name);
  m.arch = "llama";
  m.layers = layers;
  m.hidden = hidden;
  m.heads = heads;
  m.kv_heads = kv_heads;
  m.ffn = ffn;
  m.vocab = vocab;
  m.seq = seq;
  m.tied_embedding = false;
  m.position_embedding = false;
  return m;
}

ModelSpec mixtral_spec(std::string name, int64_t layers, int64_t hidden, int64_t heads, int64_t kv_heads, int64_t ffn,
                       int64_t vocab, int64_t seq, int64_t experts, int64_t top_k) {
  ModelSpec m = llama_spec(std::move(name), layers, hidden, heads, kv_heads, ffn, vocab, seq);
  m.arch = "mixtral";
  m.experts = experts;
  m.top_k = top_k;
  return m;
}

namespace {

// Narayanan et al. 2021 (Megatron-LM on GPU clusters), Table 1: layers, hidden, heads; every
// model with sequence length 2048 and vocabulary 51,200.
ModelSpec gpt(const char* name, int64_t layers, int64_t hidden, int64_t heads) {
  ModelSpec m = gpt_spec(name, layers, hidden, heads, 51200, 2048);
  m.dropout = 0.1;  // Megatron-LM's default hidden and attention dropout
  return m;
}

// The Megatron-LM README's H100 weak-scaling models (Megatron-Core r0.8; README.md at tag
// core_v0.8.0, "Training Speed and Scalability", images/model_table.png): heads, hidden,
// layers as the table prints them; "All models use a vocabulary size of 131,072 and a sequence
// length of 4096". GPT blocks (4h MLP); the embedding and output layer untied, as the sizes
// say: 24 x 12 x 2048^2 + 2 x 131072 x 2048 = 1.75B is the 1.7B row (tied, 1.48B would not
// be), and so for 7.1B, 16B and 462B.
ModelSpec mcore_gpt(const char* name, int64_t layers, int64_t hidden, int64_t heads) {
  ModelSpec m = gpt(name, layers, hidden, heads);
  m.vocab = 131072;
  m.seq = 4096;
  m.tied_embedding = false;
  return m;
}

// BigScience's BLOOM (train/tr11-176B-ml/tr11-176B-ml.slurm in
// github.com/bigscience-workshop/bigscience): 70 layers, hidden 14336, 112 heads, sequence 2048,
// the vocabulary padded to 250,880 (--pad-vocab-size-to); ALiBi positions, so no learned position
// table; the output layer tied to the embedding (its README: "the tied embedding layers"); the
// script sets no dropout, so Megatron's default 0.1 applies. Left out: the LayerNorm after the
// embedding (--embed-layernorm: 2h parameters and one streaming pass over the embedding).
ModelSpec bloom(const char* name, int64_t layers, int64_t hidden, int64_t heads) {
  ModelSpec m = gpt_spec(name, layers, hidden, heads, 250880, 2048);
  m.position_embedding = false;
  m.dropout = 0.1;
  return m;
}

const ModelSpec kPresets[] = {
    gpt("gpt-1.7b", 24, 2304, 24),
    gpt("gpt-3.6b", 30, 3072, 32),
    gpt("gpt-7.5b", 36, 4096, 32),
    gpt("gpt-18b", 40, 6144, 48),
    gpt("gpt-39b", 48, 8192, 64),
    gpt("gpt-76b", 60, 10240, 80),
    gpt("gpt-146b", 80, 12288, 96),
    gpt("gpt-310b", 96, 16384, 128),
    gpt("gpt-530b", 105, 20480, 128),
    gpt("gpt-1t", 128, 25600, 160),
    mcore_gpt("mcore-gpt-1.7b", 24, 2048, 16),
    mcore_gpt("mcore-gpt-7.1b", 30, 4096, 32),
    mcore_gpt("mcore-gpt-16b", 32, 6144, 48),
    mcore_gpt("mcore-gpt-32b", 48, 7168, 56),
    mcore_gpt("mcore-gpt-70b", 84, 8192, 64),
    mcore_gpt("mcore-gpt-119b", 92, 10240, 80),
    mcore_gpt("mcore-gpt-177b", 96, 12288, 96),
    mcore_gpt("mcore-gpt-314b", 96, 16384, 128),
    mcore_gpt("mcore-gpt-462b", 112, 18432, 144),
    // Smith et al. 2022 (MT-NLG), §3.2: 105 layers, hidden 20480, 128 heads, sequence 2048
    // (the same shape as Narayanan et al.'s 530B row); the GPT-2 BPE vocabulary (50,257)
    // padded by Megatron to a multiple of 128 x tp = 1024, i.e. 51,200.
    gpt("mt-nlg-530b", 105, 20480, 128),
    bloom("bloom-176b", 70, 14336, 112),
    // Touvron et al. 2023 (Llama 2) and Meta's Llama 3 model cards / config.json files.
    llama_spec("llama2-7b", 32, 4096, 32, 32, 11008, 32000, 4096),
    llama_spec("llama2-13b", 40, 5120, 40, 40, 13824, 32000, 4096),
    llama_spec("llama2-70b", 80, 8192, 64, 8, 28672, 32000, 4096),
    llama_spec("llama3-8b", 32, 4096, 32, 8, 14336, 128256, 8192),
    llama_spec("llama3-70b", 80, 8192, 64, 8, 28672, 128256, 8192),
    llama_spec("llama3-405b", 126, 16384, 128, 8, 53248, 128256, 8192),
    // Mistral AI's Hugging Face config.json files (mistralai/Mixtral-8x7B-v0.1: hidden_size
    // 4096, intermediate_size 14336, num_hidden_layers 32, num_attention_heads 32,
    // num_key_value_heads 8, num_local_experts 8, num_experts_per_tok 2, vocab_size 32000;
    // mistralai/Mixtral-8x22B-v0.1: 6144, 16384, 56, 48, 8, 8, 2, 32000 — the sizes
    // Megatron-MoE-ModelZoo's model_configs/benchmarking/Mixtral-8x22B.yaml trains). Every block
    // sparse (decoder_sparse_step 1), no shared expert, dropless. Sequence 4096, the length
    // Megatron-Core's MoE README trains both at (its positions go to 32768 and 65536).
    mixtral_spec("mixtral-8x7b", 32, 4096, 32, 8, 14336, 32000, 4096, 8, 2),
    mixtral_spec("mixtral-8x22b", 56, 6144, 48, 8, 16384, 32000, 4096, 8, 2),
};

}  // namespace

std::vector<std::string> model_preset_names() {
  std::vector<std::string> names;
  for (const ModelSpec& m : kPresets) names.push_back(m.name);
  return names;
}

bool is_model_preset(std::string_view name) {
  for (const ModelSpec& m : kPresets)
    if (m.name == name) return true;
  return false;
}

ModelSpec model_preset(std::string_view name) {
  for (const ModelSpec& m : kPresets)
    if (m.name == name) return m;
  std::string known;
  for (const ModelSpec& m : kPresets) known += (known.empty() ? "" : ", ") + m.name;
  TESSEL_THROW("unknown model preset '{}' (known: {}; or a training config file)", name, known);
}

void validate(const ModelSpec& m) {
  auto positive = [&](int64_t v, const char* field) {
    TESSEL_CHECK(v > 0, "model '{}': {} must be positive, got {}", m.name, field, v);
  };
  positive(m.layers, "layers");
  positive(m.hidden, "hidden");
  positive(m.heads, "heads");
  positive(m.kv_heads, "kv_heads");
  positive(m.ffn, "ffn");
  positive(m.vocab, "vocab");
  positive(m.seq, "seq");
  TESSEL_CHECK(m.hidden % m.heads == 0, "model '{}': heads {} do not divide hidden {}", m.name, m.heads, m.hidden);
  TESSEL_CHECK(m.heads % m.kv_heads == 0, "model '{}': kv_heads {} do not divide heads {}", m.name, m.kv_heads,
               m.heads);
  TESSEL_CHECK(m.arch == "gpt" || m.arch == "llama" || m.arch == "mixtral",
               "model '{}': arch must be gpt, llama or mixtral, got '{}'", m.name, m.arch);
  TESSEL_CHECK((m.arch == "mixtral") == (m.experts > 0), "model '{}': experts {} with arch {} (only mixtral has them)",
               m.name, m.experts, m.arch);
  if (m.is_moe()) {
    TESSEL_CHECK(m.top_k >= 1 && m.top_k <= m.experts, "model '{}': top_k {} must be in 1..experts {}", m.name, m.top_k,
                 m.experts);
    TESSEL_CHECK(m.moe_every >= 1 && m.shared_ffn >= 0 && m.capacity_factor >= 0,
                 "model '{}': moe_every {} must be at least 1, shared_ffn {} and capacity_factor {} not negative", m.name,
                 m.moe_every, m.shared_ffn, m.capacity_factor);
  }
}

}  // namespace tessel::plan
