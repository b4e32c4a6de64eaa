// Models: Hugging Face parameter names and layouts, deterministic name-keyed init, whole-model
// gradients against finite differences (f64), and layout-invariant dropout.
#include <gtest/gtest.h>

#include <cmath>
#include <set>

#include "tessel/autograd/engine.h"
#include "tessel/core/context.h"
#include "tessel/core/view.h"
#include "tessel/nn/models.h"
#include "tessel/ops/ops.h"

namespace tessel::nn {
namespace {

Gpt2Config tiny_gpt2() {
  Gpt2Config c;
  c.n_layer = 2;
  c.n_embd = 8;
  c.n_head = 2;
  c.vocab_size = 11;
  c.n_positions = 6;
  return c;
}

LlamaConfig tiny_llama() {
  LlamaConfig c;
  c.num_hidden_layers = 2;
  c.hidden_size = 8;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.intermediate_size = 12;
  c.vocab_size = 13;
  c.max_position_embeddings = 8;
  return c;
}

Tensor ids(const Shape& shape, int64_t vocab, uint64_t seed) {
  std::vector<double> v(static_cast<size_t>(shape_numel(shape)));
  for (size_t i = 0; i < v.size(); ++i) v[i] = std::floor(uniform_f64_at(seed, 5, i) * static_cast<double>(vocab));
  return Tensor::from_doubles(v, shape, DType::i64);
}

std::map<std::string, Shape> shapes_of(Module& m) {
  std::map<std::string, Shape> out;
  for (Parameter* p : m.parameters()) out[p->name] = p->shape;
  return out;
}

TEST(Gpt2, HuggingFaceNamesAndLayouts) {
  Gpt2 m(tiny_gpt2());
  auto s = shapes_of(m);
  EXPECT_EQ(s.size(), 4u + 2 * 12);  // wte, wpe, ln_f.{weight,bias} + 12 per block
  EXPECT_EQ(s.at("transformer.wte.weight"), (Shape{11, 8}));
  EXPECT_EQ(s.at("transformer.wpe.weight"), (Shape{6, 8}));
  // Conv1D [in, out] split as [in, q|k|v, out] so tp can shard heads; files keep [in, out].
  EXPECT_EQ(s.at("transformer.h.0.attn.c_attn.weight"), (Shape{8, 3, 8}));
  EXPECT_EQ(s.at("transformer.h.0.attn.c_attn.bias"), (Shape{3, 8}));
  EXPECT_EQ(m.parameter("transformer.h.0.attn.c_attn.weight").stored_shape(), (Shape{8, 24}));
  EXPECT_EQ(m.parameter("transformer.h.0.attn.c_attn.bias").stored_shape(), (Shape{24}));
  EXPECT_EQ(m.parameter("transformer.h.1.attn.c_proj.weight").stored_shape(), (Shape{8, 8}));
  EXPECT_EQ(s.at("transformer.h.1.attn.c_proj.weight"), (Shape{8, 8}));
  EXPECT_EQ(s.at("transformer.h.1.mlp.c_fc.weight"), (Shape{8, 32}));
  EXPECT_EQ(s.at("transformer.h.1.mlp.c_proj.weight"), (Shape{32, 8}));
  EXPECT_EQ(s.at("transformer.h.0.ln_1.weight"), (Shape{8}));
  EXPECT_EQ(s.at("transformer.h.0.ln_2.bias"), (Shape{8}));
  EXPECT_EQ(s.at("transformer.ln_f.weight"), (Shape{8}));
  EXPECT_EQ(s.count("lm_head.weight"), 0u);  // tied to wte
  EXPECT_TRUE(m.ignorable_checkpoint_key("h.3.attn.bias"));
  EXPECT_FALSE(m.ignorable_checkpoint_key("transformer.h.0.attn.c_attn.bias"));
}

TEST(Llama, HuggingFaceNamesAndLayouts) {
  Llama m(tiny_llama());
  auto s = shapes_of(m);
  EXPECT_EQ(s.size(), 3u + 2 * 9);
  EXPECT_EQ(s.at("model.embed_tokens.weight"), (Shape{13, 8}));
  EXPECT_EQ(s.at("model.layers.0.self_attn.q_proj.weight"), (Shape{8, 8}));  // [out, in]
  EXPECT_EQ(s.at("model.layers.0.self_attn.k_proj.weight"), (Shape{4, 8}));  // 2 kv heads of 2
  EXPECT_EQ(s.at("model.layers.1.self_attn.o_proj.weight"), (Shape{8, 8}));
  EXPECT_EQ(s.at("model.layers.1.mlp.gate_proj.weight"), (Shape{12, 8}));
  EXPECT_EQ(s.at("model.layers.1.mlp.down_proj.weight"), (Shape{8, 12}));
  EXPECT_EQ(s.at("model.layers.0.input_layernorm.weight"), (Shape{8}));
  EXPECT_EQ(s.at("model.layers.0.post_attention_layernorm.weight"), (Shape{8}));
  EXPECT_EQ(s.at("model.norm.weight"), (Shape{8}));
  EXPECT_EQ(s.at("lm_head.weight"), (Shape{13, 8}));
}

TEST(Init, DeterministicByNameAndScaledResiduals) {
  Gpt2Config c = tiny_gpt2();
  c.n_embd = 64;
  c.n_layer = 4;
  c.vocab_size = 300;
  Gpt2 a(c), b(c);
  a.materialize(7);
  b.materialize(7);
  for (Parameter* p : a.parameters()) EXPECT_EQ(p->value.to_doubles(), b.parameter(p->name).value.to_doubles()) << p->name;
  auto stddev = [](const Tensor& t) {
    double s = 0, s2 = 0;
    std::vector<double> v = t.to_doubles();
    for (double x : v) s += x, s2 += x * x;
    return std::sqrt(s2 / v.size() - (s / v.size()) * (s / v.size()));
  };
  EXPECT_NEAR(stddev(a.parameter("transformer.wte.weight").value), 0.02, 0.002);
  EXPECT_NEAR(stddev(a.parameter("transformer.h.0.attn.c_attn.weight").value), 0.02, 0.002);
  EXPECT_NEAR(stddev(a.parameter("transformer.h.0.mlp.c_proj.weight").value), 0.02 / std::sqrt(8.0), 0.001);
  EXPECT_EQ(a.parameter("transformer.h.0.ln_1.weight").value.to_doubles(), std::vector<double>(64, 1.0));
  EXPECT_EQ(a.parameter("transformer.h.0.attn.c_attn.bias").value.to_doubles(), std::vector<double>(192, 0.0));
  // Same-shaped parameters with different names differ.
  EXPECT_NE(a.parameter("transformer.h.0.attn.c_proj.weight").value.to_doubles(),
            a.parameter("transformer.h.1.attn.c_proj.weight").value.to_doubles());
}

// c_attn [C, 3, C] has the row-major element indices of Hugging Face's [C, 3C], so its
// initial values are bit for bit those a [C, 3C] parameter of the same name gets.
TEST(Init, PackedQkvInitEqualsTheHuggingFaceShapedInit) {
  Gpt2Config c = tiny_gpt2();
  Gpt2 m(c);
  m.materialize(5);
  const Parameter& p = m.parameter("transformer.h.1.attn.c_attn.weight");
  Tensor flat = Tensor::empty({8, 24}, DType::f32);
  init_fill(flat, p.init, 5, p.name);
  EXPECT_EQ(view::contiguous(p.value).to_doubles(), flat.to_doubles());
  // A tp shard of heads (the last dim split in 2) is the matching column blocks of [C, 3C].
  Tensor piece = Tensor::empty({8, 3, 4}, DType::f32);
  init_fill(piece, p.init, 5, p.name, GlobalBox{{8, 3, 8}, {0, 0, 4}});
  EXPECT_EQ(piece.to_doubles(), view::contiguous(view::slice(p.value, 2, 4, 8)).to_doubles());
}

TEST(Init, AShardInitialisedAloneEqualsTheSliceOfTheFullInit) {
  Gpt2Config c = tiny_gpt2();
  Gpt2 m(c);
  m.materialize(3);
  Parameter& p = m.parameter("transformer.h.1.mlp.c_fc.weight");  // [8, 32]
  Tensor shard = Tensor::empty({8, 11});
  init_fill(shard, p.init, 3, p.name, GlobalBox{p.shape, {0, 11}});
  EXPECT_EQ(shard.to_doubles(), view::slice(p.value, 1, 11, 22).to_doubles());
}

// d(loss)/d(every parameter element) by autograd against central differences, in f64.
void check_model_gradients(LanguageModel& m, int64_t vocab) {
  m.materialize(11, DType::f64);
  Tensor in = ids({2, 5}, vocab, 1), tg = ids({2, 5}, vocab, 2);
  for (Parameter* p : m.parameters()) p->value.set_grad(Tensor());
  backward(lm_loss(m, in, tg));
  NoGradGuard no_grad;
  const double eps = 1e-6;
  double worst = 0;
  std::string worst_at;
  for (Parameter* p : m.parameters()) {
    ASSERT_TRUE(p->value.grad().defined()) << p->name << " got no gradient";
    std::vector<double> g = p->value.grad().to_doubles();
    double* v = p->value.data<double>();
    for (int64_t i = 0; i < p->value.numel(); ++i) {
      double saved = v[i];
      v[i] = saved + eps;
      double up = lm_loss(m, in, tg).item();
      v[i] = saved - eps;
      double down = lm_loss(m, in, tg).item();
      v[i] = saved;
      double num = (up - down) / (2 * eps);
      // Central differences carry ~1e-10 of round-off at this loss scale: absolute 1e-8
      // plus relative 1e-5.
      double err = std::fabs(num - g[static_cast<size_t>(i)]) / (1e-8 + 1e-5 * std::fabs(num));
      if (err > worst) {
        worst = err;
        worst_at = fmt::format("{}[{}]: autograd {} numeric {}", p->name, i, g[static_cast<size_t>(i)], num);
      }
    }
  }
  EXPECT_LE(worst, 1.0) << worst_at;
}

TEST(Gpt2, WholeModelGradientsMatchFiniteDifferences) {
  Gpt2 m(tiny_gpt2());
  check_model_gradients(m, 11);
}

TEST(Llama, WholeModelGradientsMatchFiniteDifferences) {
  Llama m(tiny_llama());
  check_model_gradients(m, 13);
}

// Mixtral: one dense block and one mixture-of-experts block (the MoE losses off here: lm_loss does
// not count them; tests/nn/moe_test.cc checks their gradients).
TEST(Mixtral, WholeModelGradientsMatchFiniteDifferences) {
  LlamaConfig c = tiny_llama();
  c.num_hidden_layers = 2;
  c.moe = {.num_experts = 3, .top_k = 2, .expert_hidden = c.intermediate_size, .aux_loss_coef = 0, .z_loss_coef = 0};
  c.moe_every = 2;  // block 1 sparse, block 0 dense
  Llama m(c);
  EXPECT_EQ(m.arch(), "mixtral");
  m.parameter("model.layers.0.mlp.gate_proj.weight");
  Parameter& w1 = m.parameter("model.layers.1.block_sparse_moe.experts.w1.weight");
  EXPECT_TRUE(w1.file_stack);
  EXPECT_EQ(stacked_file_name(w1.name, 2), "model.layers.1.block_sparse_moe.experts.2.w1.weight");
  check_model_gradients(m, 13);
}

TEST(Llama, RopeMatchesTheRotateHalfFormula) {
  Rope r = Rope::make(4, 4, 10000.0, DType::f64);
  Tensor x = Tensor::from_doubles({1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 3, 4}, {1, 1, 4, 4}, DType::f64);
  std::vector<double> y = apply_rope(x, r).to_doubles();
  for (int t = 0; t < 4; ++t) {
    // pairs (0, 2) at frequency 1 and (1, 3) at frequency 1/100
    double a0 = t * 1.0, a1 = t / 100.0;
    EXPECT_NEAR(y[t * 4 + 0], 1 * std::cos(a0) - 3 * std::sin(a0), 1e-12);
    EXPECT_NEAR(y[t * 4 + 2], 3 * std::cos(a0) + 1 * std::sin(a0), 1e-12);
    EXPECT_NEAR(y[t * 4 + 1], 2 * std::cos(a1) - 4 * std::sin(a1), 1e-12);
    EXPECT_NEAR(y[t * 4 + 3], 4 * std::cos(a1) + 2 * std::sin(a1), 1e-12);
  }
}

TEST(Dropout, MasksDependOnGlobalRowsNotOnHowTheBatchIsSplit) {
  Gpt2Config c = tiny_gpt2();
  c.dropout = 0.3;
  Gpt2 m(c);
  m.materialize(5);
  Tensor in = ids({4, 6}, 11, 9);
  DropoutState& s = dropout_state();
  s = DropoutState{.seed = 42, .step = 3, .global_rows = 4, .row_offset = 0};
  Tensor whole = m.forward(in);
  s.row_offset = 2;
  Tensor half = m.forward(slice(in, 0, 2, 4));
  EXPECT_EQ(half.to_doubles(), slice(whole, 0, 2, 4).to_doubles());
  s.step = 4;  // another step draws other masks
  s.row_offset = 0;
  EXPECT_NE(m.forward(in).to_doubles(), whole.to_doubles());
  m.train(false);  // eval: no dropout at all
  Tensor eval_a = m.forward(in);
  s.step = 9;
  EXPECT_EQ(m.forward(in).to_doubles(), eval_a.to_doubles());
  s = DropoutState{};
}

// The three rates (Hugging Face's resid_pdrop, embd_pdrop, attn_pdrop) act where they are named:
// a model whose attention rate alone is set differs from one without dropout, and setting each
// of the three apart changes the output.
TEST(Dropout, Gpt2sThreeRatesActApart) {
  Tensor in = ids({2, 6}, 11, 9);
  dropout_state() = DropoutState{.seed = 42, .step = 3, .global_rows = 2, .row_offset = 0};
  auto output = [&](double resid, double embd, double attn) {
    Gpt2Config c = tiny_gpt2();
    c.dropout = resid;
    c.embd_dropout = embd;
    c.attn_dropout = attn;
    Gpt2 m(c);
    m.materialize(5);
    return m.forward(in).to_doubles();
  };
  const std::vector<double> none = output(0, 0, 0), all = output(0.3, -1, -1);
  const std::vector<double> attn = output(0, 0, 0.3), embd = output(0, 0.3, 0), resid = output(0.3, 0, 0);
  for (const auto* one : {&attn, &embd, &resid}) {
    EXPECT_NE(*one, none);
    EXPECT_NE(*one, all);
  }
  EXPECT_NE(attn, embd);
  EXPECT_NE(attn, resid);
  EXPECT_NE(embd, resid);
  EXPECT_EQ(output(0.3, 0.3, 0.3), all);  // -1 is "as resid_pdrop"
  dropout_state() = DropoutState{};
}

}  // namespace
}  // namespace tessel::nn
