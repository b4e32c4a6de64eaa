// GPT-2 and Llama.
#include "tessel/nn/models.h"

#include <cmath>

#include "tessel/ops/ops.h"

namespace tessel::nn {

// ---------------------------------------------------------------- GPT-2

Gpt2Block::Gpt2Block(const Gpt2Config& c) {
  // Residual output projections start smaller: std / sqrt(2 · n_layer) (GPT-2 paper §2.3).
  double proj_std = c.initializer_range / std::sqrt(2.0 * static_cast<double>(c.n_layer));
  ln_1_ = &add_module("ln_1", std::make_unique<LayerNorm>(c.n_embd, c.layer_norm_epsilon));
  attn_ = &add_module(
      "attn", std::make_unique<Gpt2Attention>(c.n_embd, c.n_head, c.initializer_range, proj_std, c.attn_rate()));
  ln_2_ = &add_module("ln_2", std::make_unique<LayerNorm>(c.n_embd, c.layer_norm_epsilon));
  mlp_ = &add_module("mlp", std::make_unique<Mlp>(c.n_embd, 4 * c.n_embd, c.initializer_range, proj_std));
  drop_ = &add_module("drop", std::make_unique<Dropout>(c.dropout));
}

// x + drop(attn(ln_1(x))), then + drop(mlp(ln_2(x))).
Tensor Gpt2Block::forward(const Tensor& x) const {
  Tensor h = add(x, drop_->forward(attn_->forward(ln_1_->forward(x))));
  return add(h, drop_->forward(mlp_->forward(ln_2_->forward(h))));
}

Gpt2::Gpt2(const Gpt2Config& c) : config_(c) {
  TESSEL_CHECK(c.n_layer > 0 && c.n_embd > 0 && c.n_head > 0 && c.vocab_size > 0 && c.n_positions > 0,
               "gpt2 config: n_layer ({}), n_embd ({}), n_head ({}), vocab_size ({}) and n_positions ({}) must be positive",
               c.n_layer, c.n_embd, c.n_head, c.vocab_size, c.n_positions);
  auto& t = add_module("transformer", std::make_unique<ModuleGroup>());
  wte_ = &t.add("wte", std::make_unique<Embedding>(c.vocab_size, c.n_embd, c.initializer_range));
  wpe_ = &t.add("wpe", std::make_unique<Embedding>(c.n_positions, c.n_embd, c.initializer_range));
  drop_ = &t.add("drop", std::make_unique<Dropout>(c.embd_rate()));
  h_ = &t.add("h", std::make_unique<ModuleList<Gpt2Block>>());
  for (int64_t i = 0; i < c.n_layer; ++i) h_->append(std::make_unique<Gpt2Block>(c));
  ln_f_ = &t.add("ln_f", std::make_unique<LayerNorm>(c.n_embd, c.layer_norm_epsilon));
  finalize_names();
}

int64_t Gpt2::num_blocks() const { return config_.n_layer; }

Tensor Gpt2::embed(const Tensor& ids) {
  TESSEL_CHECK(ids.dim() == 2, "gpt2: token ids must be [B, T], got {}", ids.str());
  const int64_t T = ids.size(1);
  TESSEL_CHECK(T <= config_.n_positions, "gpt2: sequence length {} exceeds n_positions {}", T, config_.n_positions);
  // [T, C] broadcast over B; or, when the tokens are not in order (context parallel's
  // load-balanced layout), the rows at their positions [B, T, C].
  const Tensor& positions = sequence_state().positions;
  Tensor pos = positions.defined() ? embedding(wpe_->weight().use(), positions) : slice(wpe_->weight().use(), 0, 0, T);
  return drop_->forward(add(wte_->forward(ids), pos));
}

Tensor Gpt2::block(int64_t i, const Tensor& x) { return (*h_)[static_cast<size_t>(i)].forward(x); }

// Tied head: logits = ln_f(x) @ wte^T (wte is [V, C], the [out, in] layout).
Tensor Gpt2::head(const Tensor& x) { return linear(ln_f_->forward(x), wte_->weight().use()); }

std::vector<Parameter*> Gpt2::part_parameters(Part part, int64_t block) {
  switch (part) {
    case Part::embed: return {&wte_->weight(), &wpe_->weight()};
    case Part::block: return (*h_)[static_cast<size_t>(block)].parameters();
    case Part::head: {
      std::vector<Parameter*> out = ln_f_->parameters();
      out.push_back(&wte_->weight());
      return out;
    }
  }
  return {};
}

double Gpt2::train_flops_per_token(int64_t seq_len) const {
  return 6.0 * static_cast<double>(num_parameters()) +
         12.0 * static_cast<double>(config_.n_layer * config_.n_embd * seq_len);
}

bool Gpt2::ignorable_checkpoint_key(const std::string& name) const {
  // Hugging Face stores the causal-mask buffers of older versions and sometimes the tied head.
  auto ends_with = [&](const char* s) { return name.size() >= std::strlen(s) && name.compare(name.size() - std::strlen(s), std::string::npos, s) == 0; };
  return ends_with(".attn.bias") || ends_with(".attn.masked_bias") || name == "lm_head.weight";
}

void Gpt2::set_selective_recompute(bool on) {
  for (size_t i = 0; i < h_->size(); ++i) (*h_)[i].attn().set_recompute_probs(on);
}

// ---------------------------------------------------------------- Llama

LlamaBlock::LlamaBlock(const LlamaConfig& c, int64_t index) {
  input_layernorm_ = &add_module("input_layernorm", std::make_unique<RMSNorm>(c.hidden_size, c.rms_norm_eps));
  self_attn_ = &add_module("self_attn", std::make_unique<LlamaAttention>(c.hidden_size, c.num_attention_heads,
                                                                        c.num_key_value_heads, c.initializer_range));
  post_attention_layernorm_ =
      &add_module("post_attention_layernorm", std::make_unique<RMSNorm>(c.hidden_size, c.rms_norm_eps));
  if (c.moe_block(index))
    moe_ = &add_module("block_sparse_moe", std::make_unique<MoeBlock>(c.hidden_size, c.moe, c.initializer_range, index));
  else
    mlp_ = &add_module("mlp", std::make_unique<SwiGlu>(c.hidden_size, c.intermediate_size, c.initializer_range));
}

Tensor LlamaBlock::forward(const Tensor& x, const Rope& rope) const {
  Tensor h = add(x, self_attn_->forward(input_layernorm_->forward(x), rope));
  const Tensor normed = post_attention_layernorm_->forward(h);
  return add(h, moe_ ? moe_->forward(normed) : mlp_->forward(normed));
}

Llama::Llama(const LlamaConfig& c) : config_(c) {
  TESSEL_CHECK(c.num_hidden_layers > 0 && c.hidden_size > 0 && c.num_attention_heads > 0 && c.vocab_size > 0 &&
                   c.intermediate_size > 0,
               "llama config: num_hidden_layers ({}), hidden_size ({}), num_attention_heads ({}), intermediate_size "
               "({}) and vocab_size ({}) must be positive",
               c.num_hidden_layers, c.hidden_size, c.num_attention_heads, c.intermediate_size, c.vocab_size);
  auto& m = add_module("model", std::make_unique<ModuleGroup>());
  model_ = &m;
  embed_tokens_ = &m.add("embed_tokens", std::make_unique<Embedding>(c.vocab_size, c.hidden_size, c.initializer_range));
  layers_ = &m.add("layers", std::make_unique<ModuleList<LlamaBlock>>());
  TESSEL_CHECK(c.moe_every >= 1, "mixtral config: decoder_sparse_step ({}) must be at least 1", c.moe_every);
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) layers_->append(std::make_unique<LlamaBlock>(c, i));
  norm_ = &m.add("norm", std::make_unique<RMSNorm>(c.hidden_size, c.rms_norm_eps));
  lm_head_ = &add_module("lm_head", std::make_unique<Linear>(c.hidden_size, c.vocab_size, false, Linear::Layout::out_in,
                                                             c.initializer_range));
  finalize_names();
}

const Rope& Llama::rope(int64_t seq_len, DType dtype) {
  if (!rope_ || rope_->cos.size(0) < seq_len || rope_->cos.dtype() != dtype)
    rope_ = std::make_unique<Rope>(Rope::make(seq_len, config_.hidden_size / config_.num_attention_heads,
                                              config_.rope_theta, dtype));
  return *rope_;
}

int64_t Llama::num_blocks() const { return config_.num_hidden_layers; }

Tensor Llama::embed(const Tensor& ids) {
  TESSEL_CHECK(ids.dim() == 2, "llama: token ids must be [B, T], got {}", ids.str());
  const int64_t T = ids.size(1);
  TESSEL_CHECK(T <= config_.max_position_embeddings, "llama: sequence length {} exceeds max_position_embeddings {}", T,
               config_.max_position_embeddings);
  return embed_tokens_->forward(ids);
}

Tensor Llama::block(int64_t i, const Tensor& x) {
  return (*layers_)[static_cast<size_t>(i)].forward(x, rope(x.size(1), x.dtype()));
}

Tensor Llama::head(const Tensor& x) { return lm_head_->forward(norm_->forward(x)); }

std::vector<Parameter*> Llama::part_parameters(Part part, int64_t block) {
  switch (part) {
    case Part::embed: return embed_tokens_->parameters();
    case Part::block: return (*layers_)[static_cast<size_t>(block)].parameters();
    case Part::head: {
      std::vector<Parameter*> out = norm_->parameters();
      for (Parameter* p : lm_head_->parameters()) out.push_back(p);
      return out;
    }
  }
  return {};
}

double Llama::train_flops_per_token(int64_t seq_len) const {
  // A token passes through k of the E experts of each MoE block: the others' weights do not count.
  int64_t idle = 0;
  for (int64_t i = 0; i < config_.num_hidden_layers; ++i)
    if (config_.moe_block(i))
      idle += 3 * config_.moe.expert_hidden * config_.hidden_size * (config_.moe.num_experts - config_.moe.top_k);
  return 6.0 * static_cast<double>(num_parameters() - idle) +
         12.0 * static_cast<double>(config_.num_hidden_layers * config_.hidden_size * seq_len);
}

bool Llama::ignorable_checkpoint_key(const std::string& name) const {
  return name.find("rotary_emb.inv_freq") != std::string::npos;
}

void Llama::set_selective_recompute(bool on) {
  for (size_t i = 0; i < layers_->size(); ++i) (*layers_)[i].self_attn().set_recompute_probs(on);
}

Tensor LanguageModel::forward(const Tensor& ids) {
  Tensor x = embed(ids);
  for (int64_t i = 0; i < num_blocks(); ++i) x = block(i, x);
  return head(x);
}

Tensor lm_loss(LanguageModel& model, const Tensor& inputs, const Tensor& targets) {
  Tensor logits = model.forward(inputs);
  return cross_entropy(logits, targets);
}

}  // namespace tessel::nn
