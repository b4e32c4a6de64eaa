// Transformer building blocks.
#include "tessel/nn/layers.h"

#include <cmath>

#include "tessel/core/context.h"
#include "tessel/dist/dtensor.h"
#include "tessel/ops/ops.h"

namespace tessel::nn {

DropoutState& dropout_state() {
  RankContext& ctx = rank_context();
  auto s = ctx.get_ext<DropoutState>();
  if (!s) {
    s = std::make_shared<DropoutState>();
    ctx.set_ext(s);
  }
  return *s;
}

SequenceState& sequence_state() {
  RankContext& ctx = rank_context();
  auto s = ctx.get_ext<SequenceState>();
  if (!s) {
    s = std::make_shared<SequenceState>();
    ctx.set_ext(s);
  }
  return *s;
}

Linear::Linear(int64_t in, int64_t out, bool bias, Layout layout, double init_std) : layout_(layout) {
  Shape w = layout == Layout::out_in ? Shape{out, in} : Shape{in, out};
  weight_ = &add_parameter("weight", w, Init::normal(init_std));
  if (bias) bias_ = &add_parameter("bias", {out}, Init::zeros());
}

Linear::Linear(int64_t in, const Shape& out, bool bias, double init_std) : layout_(Layout::in_out) {
  Shape w{in};
  w.insert(w.end(), out.begin(), out.end());
  const int64_t outf = shape_numel(out);
  weight_ = &add_parameter("weight", w, Shape{in, outf}, Init::normal(init_std));
  if (bias) bias_ = &add_parameter("bias", out, Shape{outf}, Init::zeros());
}

Tensor Linear::forward(const Tensor& x) const {
  return prepare_output(
      linear(prepare_input(x), weight_->use(), bias_ ? bias_->use() : Tensor(), layout_ == Layout::in_out));
}

Embedding::Embedding(int64_t num, int64_t dim, double init_std) {
  weight_ = &add_parameter("weight", {num, dim}, Init::normal(init_std));
}

Tensor Embedding::forward(const Tensor& ids) const { return prepare_output(embedding(weight_->use(), prepare_input(ids))); }

LayerNorm::LayerNorm(int64_t dim, double eps) : eps_(eps) {
  weight_ = &add_parameter("weight", {dim}, Init::ones());
  bias_ = &add_parameter("bias", {dim}, Init::zeros());
}

Tensor LayerNorm::forward(const Tensor& x) const { return layer_norm(x, weight_->use(), bias_->use(), eps_); }

RMSNorm::RMSNorm(int64_t dim, double eps) : eps_(eps) { weight_ = &add_parameter("weight", {dim}, Init::ones()); }

Tensor RMSNorm::forward(const Tensor& x) const { return rms_norm(x, weight_->use(), eps_); }

Tensor Dropout::forward(const Tensor& x) const {
  if (!training() || p_ == 0.0) return x;
  const DropoutState& s = dropout_state();
  GlobalBox box;
  if (s.global_rows > 0 && x.dim() > 0) {
    box.global_shape = x.shape();
    box.global_shape[0] = s.global_rows;
    box.offset.assign(x.shape().size(), 0);
    box.offset[0] = s.row_offset;
  }
  // Under ring attention the activations [B, T, C] hold the sequence in the load-balanced
  // order over the mesh dim named cp: the masks are drawn in the natural order.
  SequenceOrder order;
  if (is_dist(x) && x.dim() >= 2 && sequence_state().cp_method == "ring") {
    const DistAttr& a = dist_attr(x);
    const int64_t cp = a.mesh.find_dim("cp");
    if (cp >= 0 && a.mesh.dim_size(cp) > 1) order = SequenceOrder{1, a.mesh.dim_size(cp)};
  }
  return dropout(x, p_, s.seed, stream_combine(stream_key(path()), s.step), box, order);
}

Mlp::Mlp(int64_t dim, int64_t hidden, double init_std, double proj_std) {
  c_fc_ = &add_module("c_fc", std::make_unique<Linear>(dim, hidden, true, Linear::Layout::in_out, init_std));
  c_proj_ = &add_module("c_proj", std::make_unique<Linear>(hidden, dim, true, Linear::Layout::in_out, proj_std));
}

Tensor Mlp::forward(const Tensor& x) const { return c_proj_->forward(gelu(c_fc_->forward(x), true)); }

SwiGlu::SwiGlu(int64_t dim, int64_t hidden, double init_std) {
  gate_ = &add_module("gate_proj", std::make_unique<Linear>(dim, hidden, false, Linear::Layout::out_in, init_std));
  up_ = &add_module("up_proj", std::make_unique<Linear>(dim, hidden, false, Linear::Layout::out_in, init_std));
  down_ = &add_module("down_proj", std::make_unique<Linear>(hidden, dim, false, Linear::Layout::out_in, init_std));
}

Tensor SwiGlu::forward(const Tensor& x) const { return down_->forward(mul(silu(gate_->forward(x)), up_->forward(x))); }

Rope Rope::make(int64_t seq_len, int64_t head_dim, double theta, DType dtype) {
  TESSEL_CHECK(head_dim % 2 == 0, "rope: head dim {} must be even", head_dim);
  if (meta_mode())  // tracing: the tables' shapes are all a step needs
    return Rope{Tensor::empty({seq_len, head_dim}, dtype), Tensor::empty({seq_len, head_dim}, dtype)};
  std::vector<double> c(static_cast<size_t>(seq_len * head_dim)), s(c.size());
  int64_t half = head_dim / 2;
  for (int64_t t = 0; t < seq_len; ++t)
    for (int64_t i = 0; i < half; ++i) {
      double inv_freq = 1.0 / std::pow(theta, static_cast<double>(2 * i) / static_cast<double>(head_dim));
      double angle = static_cast<double>(t) * inv_freq;
      for (int64_t k : {i, i + half}) {
        c[static_cast<size_t>(t * head_dim + k)] = std::cos(angle);
        s[static_cast<size_t>(t * head_dim + k)] = std::sin(angle);
      }
    }
  return Rope{Tensor::from_doubles(c, {seq_len, head_dim}, dtype), Tensor::from_doubles(s, {seq_len, head_dim}, dtype)};
}

Tensor apply_rope(const Tensor& x, const Rope& rope, const Tensor& positions) {
  int64_t D = x.size(-1), T = x.size(-2);
  Tensor cos, sin;
  if (positions.defined()) {  // [B, T] -> [B, 1, T, D], broadcast over heads
    cos = unsqueeze(embedding(rope.cos, positions), 1);
    sin = unsqueeze(embedding(rope.sin, positions), 1);
  } else {
    cos = slice(rope.cos, 0, 0, T);
    sin = slice(rope.sin, 0, 0, T);
  }
  std::vector<Tensor> halves = split(x, {D / 2, D / 2}, -1);
  Tensor rotated = cat({neg(halves[1]), halves[0]}, -1);
  return add(mul(x, cos), mul(rotated, sin));
}

Tensor causal_attention(const Tensor& q, const Tensor& k, const Tensor& v, bool /*recompute_probs*/,
                        const SdpaDropout& dropout) {
  const SequenceState& s = sequence_state();
  if (!is_dist(q))
    return scaled_dot_product_attention(q, k, v, s.doc_starts, /*causal=*/true, /*scale=*/0.0, {}, dropout);
  // Context parallel: attention takes the sequence split over the mesh dim named cp, whatever
  // placements the ops before it chose. Under ring attention the tokens are held in the
  // load-balanced order (parallel/data.h), which only that split maps back to causal positions:
  // an op that moved the sequence's split to another dim (batch over cp, say) would otherwise
  // hand attention the reordered sequence as if it were the natural one.
  const auto on_cp = [&](const Tensor& t) {
    const DistAttr& a = dist_attr(t);
    const int64_t cp = a.mesh.find_dim("cp");
    if (s.cp_method.empty() || cp < 0 || a.mesh.dim_size(cp) == 1) return t;
    const size_t m = static_cast<size_t>(cp);
    if (a.placements[m].is_shard(2)) return t;
    Placements want = a.placements;
    for (Placement& p : want)
      if (p.is_shard(2)) p = Replicate();  // the sequence split over cp alone
    want[m] = Shard(2);
    return reshard(t, a.mesh, want);
  };
  const Tensor qs = on_cp(q);
  Tensor y = scaled_dot_product_attention(qs, on_cp(k), on_cp(v), s.doc_starts, /*causal=*/true, /*scale=*/0.0,
                                          s.cp_method, dropout);
  // all_to_all hands the output back split by heads where q's sequence was split: the
  // all_to_all back, so the projection after it sees the sequence split as before.
  const DistAttr& qa = dist_attr(qs);
  const Placements& yp = dist_attr(y).placements;
  for (size_t m = 0; m < yp.size(); ++m)
    if (qa.placements[m].is_shard(2) && !yp[m].is_shard(2)) return reshard(y, qa.mesh, qa.placements);
  return y;
}

Gpt2Attention::Gpt2Attention(int64_t dim, int64_t heads, double init_std, double proj_std, double attn_pdrop)
    : heads_(heads), attn_pdrop_(attn_pdrop) {
  TESSEL_CHECK(dim % heads == 0, "gpt2 attention: n_embd {} is not a multiple of n_head {}", dim, heads);
  c_attn_ = &add_module("c_attn", std::make_unique<Linear>(dim, Shape{3, dim}, true, init_std));
  c_proj_ = &add_module("c_proj", std::make_unique<Linear>(dim, dim, true, Linear::Layout::in_out, proj_std));
}

Tensor Gpt2Attention::forward(const Tensor& x) const {
  const int64_t B = x.size(0), T = x.size(1), C = x.size(2), H = heads_, D = C / H;
  // [B, T, 3, C] -> [B, T, 3, H, D]: under tp, C is sharded and the shard moves onto H (each
  // rank's columns are whole heads), so q, k and v stay sharded by heads; all are views.
  Tensor qkv = reshape(c_attn_->forward(x), {B, T, 3, H, D});
  std::vector<Tensor> parts = split(qkv, {1, 1, 1}, 2);
  auto heads = [&](const Tensor& t) { return permute(squeeze(t, 2), {0, 2, 1, 3}); };  // [B, H, T, D]
  // The probabilities' dropout is keyed like the Dropout modules': seed, this module's path and
  // the step name the stream, the micro-batch's place in the step's batch its first row.
  SdpaDropout drop;
  if (training() && attn_pdrop_ > 0.0) {
    const DropoutState& s = dropout_state();
    drop = SdpaDropout{attn_pdrop_, s.seed, stream_combine(stream_key(path()), s.step), s.row_offset};
  }
  Tensor y = causal_attention(heads(parts[0]), heads(parts[1]), heads(parts[2]), recompute_probs_, drop);
  return c_proj_->forward(reshape(permute(y, {0, 2, 1, 3}), {B, T, C}));
}

LlamaAttention::LlamaAttention(int64_t dim, int64_t heads, int64_t kv_heads, double init_std)
    : heads_(heads), kv_heads_(kv_heads), head_dim_(dim / heads) {
  TESSEL_CHECK(dim % heads == 0, "llama attention: hidden_size {} is not a multiple of num_attention_heads {}", dim, heads);
  TESSEL_CHECK(kv_heads > 0 && heads % kv_heads == 0,
               "llama attention: num_attention_heads {} is not a multiple of num_key_value_heads {}", heads, kv_heads);
  q_ = &add_module("q_proj", std::make_unique<Linear>(dim, heads * head_dim_, false, Linear::Layout::out_in, init_std));
  k_ = &add_module("k_proj", std::make_unique<Linear>(dim, kv_heads * head_dim_, false, Linear::Layout::out_in, init_std));
  v_ = &add_module("v_proj", std::make_unique<Linear>(dim, kv_heads * head_dim_, false, Linear::Layout::out_in, init_std));
  o_ = &add_module("o_proj", std::make_unique<Linear>(heads * head_dim_, dim, false, Linear::Layout::out_in, init_std));
}

Tensor LlamaAttention::forward(const Tensor& x, const Rope& rope) const {
  const int64_t B = x.size(0), T = x.size(1), D = head_dim_;
  auto heads = [&](const Tensor& t, int64_t h) { return permute(reshape(t, {B, T, h, D}), {0, 2, 1, 3}); };
  const Tensor& positions = sequence_state().positions;
  Tensor q = apply_rope(heads(q_->forward(x), heads_), rope, positions);
  Tensor k = apply_rope(heads(k_->forward(x), kv_heads_), rope, positions);
  Tensor v = heads(v_->forward(x), kv_heads_);
  Tensor y = causal_attention(q, k, v, recompute_probs_);
  return o_->forward(reshape(permute(y, {0, 2, 1, 3}), {B, T, heads_ * D}));
}

}  // namespace tessel::nn
