// What the planner needs to know of a model: the sizes of a decoder-only transformer. Built from
// a training config's model section (by the cli) or from a named preset: the GPT sizes of
// Narayanan et al. 2021, Table 1, of the Megatron-LM README's H100 weak scaling and of MT-NLG,
// the Llama 2/3 family, and the Mixtral mixtures of experts.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace tessel::plan {

struct ModelSpec {
  std::string name;
  // gpt (LayerNorm, GELU MLP of 4h, biases) | llama (RMSNorm, SwiGLU, GQA) | mixtral (llama's
  // attention; every moe_every-th block's MLP a mixture of `experts` SwiGLU experts of width ffn)
  std::string arch = "gpt";
  int64_t layers = 0, hidden = 0, heads = 0, kv_heads = 0, ffn = 0, vocab = 0, seq = 0;
  // Mixture of experts (mixtral; Hugging Face's keys): num_local_experts, num_experts_per_tok,
  // decoder_sparse_step (blocks i with (i + 1) % moe_every == 0 are sparse, the rest dense
  // SwiGLU of width ffn), shared_expert_intermediate_size (0: none) and capacity_factor (0:
  // dropless; else no expert takes more than capacity_factor x its even share).
  int64_t experts = 0, top_k = 0, moe_every = 1, shared_ffn = 0;
  double capacity_factor = 0;
  double dropout = 0;         // > 0: dropout after residual branches (and, unless set apart, the others)
  double attn_dropout = -1;   // on the attention probabilities (GPT-2's attn_pdrop); -1: as dropout
  double embd_dropout = -1;   // on the embeddings (embd_pdrop); -1: as dropout
  bool tied_embedding = true; // LM head shares the token embedding
  bool position_embedding = true;  // learned positions (GPT); Llama uses RoPE

  int64_t head_dim() const { return hidden / heads; }
  double attn_rate() const { return attn_dropout >= 0 ? attn_dropout : dropout; }
  double embd_rate() const { return embd_dropout >= 0 ? embd_dropout : dropout; }
  bool swiglu() const { return arch != "gpt"; }
  bool is_moe() const { return experts > 0; }
  bool moe_layer(int64_t i) const { return is_moe() && (i + 1) % moe_every == 0; }
  int64_t moe_layers(int64_t first, int64_t last) const;  // sparse blocks among [first, last)
  double layer_parameters() const;  // one dense transformer block
  // One sparse block: attention, router, all experts, shared experts, norms; and of that the
  // routed experts' weights (what expert parallelism splits).
  double moe_layer_parameters() const;
  double expert_parameters() const;
  double parameters() const;        // whole model
};

// A model of each architecture from its sizes, with the architecture's fixed traits: GPT has an
// MLP of 4·hidden, as many kv heads as heads, learned positions and a tied head; Llama has
// RoPE (no position table) and an untied head.
ModelSpec gpt_spec(std::string name, int64_t layers, int64_t hidden, int64_t heads, int64_t vocab, int64_t seq);
ModelSpec llama_spec(std::string name, int64_t layers, int64_t hidden, int64_t heads, int64_t kv_heads, int64_t ffn,
                     int64_t vocab, int64_t seq);
// Llama's traits with `experts` routed experts of width ffn, `top_k` per token, in every block.
ModelSpec mixtral_spec(std::string name, int64_t layers, int64_t hidden, int64_t heads, int64_t kv_heads, int64_t ffn,
                       int64_t vocab, int64_t seq, int64_t experts, int64_t top_k);

// gpt-1.7b, gpt-3.6b, gpt-7.5b, gpt-18b, gpt-39b, gpt-76b, gpt-146b, gpt-310b, gpt-530b, gpt-1t,
// the Megatron-Core r0.8 weak-scaling GPTs mcore-gpt-{1.7b,7.1b,16b,32b,70b,119b,177b,314b,462b},
// mt-nlg-530b, llama2-7b, llama2-13b, llama2-70b, llama3-8b, llama3-70b, llama3-405b,
// mixtral-8x7b, mixtral-8x22b.
ModelSpec model_preset(std::string_view name);
std::vector<std::string> model_preset_names();
bool is_model_preset(std::string_view name);

// Checks the sizes (positive, heads divide hidden, kv_heads divide heads, top_k <= experts);
// throws naming the field.
void validate(const ModelSpec& m);

}  // namespace tessel::plan
