// Language models: GPT-2 and Llama, sized by Hugging Face's config names, with Hugging
// Face's parameter names and layouts so their safetensors checkpoints load as they are.
#pragma once

#include <memory>
#include <string>

#include "tessel/nn/layers.h"
#include "tessel/nn/moe.h"

namespace tessel::nn {

struct Gpt2Config {
  int64_t n_layer = 12, n_embd = 768, n_head = 12, vocab_size = 50257, n_positions = 1024;
  double layer_norm_epsilon = 1e-5;
  // Dropout rates, Hugging Face's resid_pdrop (each residual branch), embd_pdrop (the summed
  // embeddings) and attn_pdrop (the attention probabilities); -1: as `dropout`.
  double dropout = 0.0;
  double embd_dropout = -1, attn_dropout = -1;
  double embd_rate() const { return embd_dropout >= 0 ? embd_dropout : dropout; }
  double attn_rate() const { return attn_dropout >= 0 ? attn_dropout : dropout; }
  double initializer_range = 0.02;
};

struct LlamaConfig {
  int64_t num_hidden_layers = 32, hidden_size = 4096, num_attention_heads = 32, num_key_value_heads = 32;
  int64_t intermediate_size = 11008, vocab_size = 32000, max_position_embeddings = 4096;
  double rope_theta = 10000.0, rms_norm_eps = 1e-6, initializer_range = 0.02;
  // Mixtral: mixture-of-experts feed-forward blocks (`moe.num_experts` > 0), in every
  // `moe_every`-th block (blocks i with (i + 1) % moe_every == 0, Qwen2-MoE's
  // decoder_sparse_step); the others keep the dense SwiGLU `mlp`.
  MoeConfig moe{.num_experts = 0};
  int64_t moe_every = 1;
  bool is_moe() const { return moe.num_experts > 0; }
  bool moe_block(int64_t i) const { return is_moe() && (i + 1) % moe_every == 0; }
};

// A causal language model: token ids [B, T] -> logits [B, T, V], written as a chain
// embed -> block 0 -> ... -> block n-1 -> head so pipeline stages can run a piece of it.
class LanguageModel : public Module {
 public:
  Tensor forward(const Tensor& ids);
  virtual int64_t num_blocks() const = 0;
  virtual Tensor embed(const Tensor& ids) = 0;               // [B, T] -> [B, T, C]
  virtual Tensor block(int64_t i, const Tensor& x) = 0;      // [B, T, C] -> [B, T, C]
  virtual Tensor head(const Tensor& x) = 0;                  // [B, T, C] -> [B, T, V]
  // The parameters each part uses. A parameter may serve two parts (GPT-2's token embedding
  // is also its LM head).
  enum class Part { embed, block, head };
  virtual std::vector<Parameter*> part_parameters(Part part, int64_t block = 0) = 0;
  virtual std::string arch() const = 0;
  virtual int64_t vocab_size() const = 0;
  virtual int64_t max_seq_len() const = 0;
  // Model FLOPs per token for training at `seq_len`: 6·N plus attention 12·L·C·T (the
  // PaLM convention, N counting every parameter once).
  virtual double train_flops_per_token(int64_t seq_len) const = 0;
  // Parameter names a checkpoint may hold that this model does not (buffers, tied heads).
  virtual bool ignorable_checkpoint_key(const std::string& name) const = 0;
  // Selective activation recompute (parallel.recompute: selective): every block's attention
  // keeps no probabilities between its forward and backward and rebuilds them in the backward.
  virtual void set_selective_recompute(bool on) = 0;
};

class Gpt2Block : public Module {
 public:
  explicit Gpt2Block(const Gpt2Config& c);
  Tensor forward(const Tensor& x) const;
  Gpt2Attention& attn() { return *attn_; }

 private:
  LayerNorm* ln_1_;
  Gpt2Attention* attn_;
  LayerNorm* ln_2_;
  Mlp* mlp_;
  Dropout* drop_;
};

// transformer.{wte, wpe, h.i.{ln_1, attn.c_attn, attn.c_proj, ln_2, mlp.c_fc, mlp.c_proj},
// ln_f}; the LM head is tied to wte.
class Gpt2 : public LanguageModel {
 public:
  explicit Gpt2(const Gpt2Config& c);
  int64_t num_blocks() const override;
  Tensor embed(const Tensor& ids) override;
  Tensor block(int64_t i, const Tensor& x) override;
  Tensor head(const Tensor& x) override;
  std::vector<Parameter*> part_parameters(Part part, int64_t block = 0) override;
  std::string arch() const override { return "gpt2"; }
  int64_t vocab_size() const override { return config_.vocab_size; }
  int64_t max_seq_len() const override { return config_.n_positions; }
  double train_flops_per_token(int64_t seq_len) const override;
  bool ignorable_checkpoint_key(const std::string& name) const override;
  void set_selective_recompute(bool on) override;
  const Gpt2Config& config() const { return config_; }

 private:
  Gpt2Config config_;
  Embedding* wte_;
  Embedding* wpe_;
  Dropout* drop_;
  ModuleList<Gpt2Block>* h_;
  LayerNorm* ln_f_;
};

class LlamaBlock : public Module {
 public:
  LlamaBlock(const LlamaConfig& c, int64_t index);
  Tensor forward(const Tensor& x, const Rope& rope) const;
  LlamaAttention& self_attn() { return *self_attn_; }
  MoeBlock* moe() { return moe_; }  // Mixtral's block_sparse_moe, or null

 private:
  RMSNorm* input_layernorm_;
  LlamaAttention* self_attn_;
  RMSNorm* post_attention_layernorm_;
  SwiGlu* mlp_ = nullptr;
  MoeBlock* moe_ = nullptr;
};

// model.{embed_tokens, layers.i.{input_layernorm, self_attn.{q,k,v,o}_proj,
// post_attention_layernorm, mlp.{gate,up,down}_proj}, norm}, lm_head (untied). Mixtral (arch
// "mixtral") is the same with layers.i.block_sparse_moe.{gate, experts.e.{w1,w2,w3}} in place of
// the mlp.
class Llama : public LanguageModel {
 public:
  explicit Llama(const LlamaConfig& c);
  int64_t num_blocks() const override;
  Tensor embed(const Tensor& ids) override;
  Tensor block(int64_t i, const Tensor& x) override;
  Tensor head(const Tensor& x) override;
  std::vector<Parameter*> part_parameters(Part part, int64_t block = 0) override;
  std::string arch() const override { return config_.is_moe() ? "mixtral" : "llama"; }
  int64_t vocab_size() const override { return config_.vocab_size; }
  int64_t max_seq_len() const override { return config_.max_position_embeddings; }
  double train_flops_per_token(int64_t seq_len) const override;
  bool ignorable_checkpoint_key(const std::string& name) const override;
  void set_selective_recompute(bool on) override;
  const LlamaConfig& config() const { return config_; }

 private:
  const Rope& rope(int64_t seq_len, DType dtype);

  LlamaConfig config_;
  Module* model_;
  Embedding* embed_tokens_;
  ModuleList<LlamaBlock>* layers_;
  RMSNorm* norm_;
  Linear* lm_head_;
  std::unique_ptr<Rope> rope_;
};

// The mean next-token cross-entropy of `model` on inputs/targets [B, T].
Tensor lm_loss(LanguageModel& model, const Tensor& inputs, const Tensor& targets);

}  // namespace tessel::nn
