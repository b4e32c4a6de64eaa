// Model checkpoints: Hugging Face GPT-2 files (bare names, mask buffers) load as they are, a
// tessel file round-trips, and mismatches are named.
#include <gtest/gtest.h>

#include <filesystem>

#include "tessel/ckpt/checkpoint.h"
#include "tessel/ckpt/safetensors.h"
#include "tessel/core/view.h"

namespace tessel {
namespace {

namespace fs = std::filesystem;

nn::Gpt2Config tiny() {
  nn::Gpt2Config c;
  c.n_layer = 2;
  c.n_embd = 8;
  c.n_head = 2;
  c.vocab_size = 10;
  c.n_positions = 4;
  return c;
}

std::string temp(const std::string& name) {
  return (fs::temp_directory_path() / fmt::format("tessel_ckpt_{}_{}", ::getpid(), name)).string();
}

TEST(LoadModel, AcceptsHuggingFaceGpt2FilesAsTheyAre) {
  nn::Gpt2 src(tiny());
  src.materialize(1);
  // The layout of openai-community/gpt2's model.safetensors: no "transformer." prefix, plus
  // the attention mask buffers.
  std::map<std::string, Tensor> hf;
  for (nn::Parameter* p : src.parameters()) hf[p->name.substr(std::string("transformer.").size())] = p->value;
  for (int i = 0; i < 2; ++i) hf[fmt::format("h.{}.attn.bias", i)] = Tensor::ones({1, 1, 4, 4});
  std::string path = temp("hf.safetensors");
  save_safetensors(path, hf, {{"format", "pt"}});
  nn::Gpt2 dst(tiny());
  dst.materialize(2);
  load_model(path, dst);
  for (nn::Parameter* p : dst.parameters())
    EXPECT_EQ(p->value.to_doubles(), src.parameter(p->name).value.to_doubles()) << p->name;
  fs::remove(path);
}

TEST(LoadModel, NamesMissingExtraAndMisshapenTensors) {
  nn::Gpt2 m(tiny());
  m.materialize(1);
  std::map<std::string, Tensor> state = model_state(m);
  auto error_with = [&](std::map<std::string, Tensor> s) {
    std::string path = temp("bad.safetensors");
    save_safetensors(path, s);
    std::string msg = "<no error>";
    try {
      load_model(path, m);
    } catch (const CheckpointError& e) {
      msg = e.what();
    }
    fs::remove(path);
    return msg;
  };
  auto missing = state;
  missing.erase("transformer.h.1.mlp.c_fc.bias");
  EXPECT_NE(error_with(missing).find("transformer.h.1.mlp.c_fc.bias"), std::string::npos);
  auto extra = state;
  extra["transformer.h.9.attn.c_attn.weight"] = Tensor::zeros({1});
  EXPECT_NE(error_with(extra).find("transformer.h.9.attn.c_attn.weight"), std::string::npos);
  auto shaped = state;
  shaped["transformer.wte.weight"] = Tensor::zeros({11, 8});
  std::string msg = error_with(shaped);
  EXPECT_NE(msg.find("[11, 8]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[10, 8]"), std::string::npos) << msg;
}

TEST(LoadModel, ConvertsDtypes) {
  nn::Gpt2 src(tiny());
  src.materialize(1);
  std::map<std::string, Tensor> bf16;
  for (auto& [name, t] : model_state(src)) bf16[name] = view::to_dtype(t, DType::bf16);
  std::string path = temp("bf16.safetensors");
  save_safetensors(path, bf16);
  nn::Gpt2 dst(tiny());
  dst.materialize(2);
  load_model(path, dst);
  Tensor w = dst.parameter("transformer.wte.weight").value;
  EXPECT_EQ(w.dtype(), DType::f32);
  EXPECT_EQ(w.to_doubles(), view::to_dtype(bf16.at("transformer.wte.weight"), DType::f32).to_doubles());
  fs::remove(path);
}

}  // namespace
}  // namespace tessel
