// Model checkpoints: Hugging Face GPT-2 files (bare names, mask buffers) load as they are, a
// tessel file round-trips, and mismatches are named.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "tessel/ckpt/checkpoint.h"
#include "tessel/ckpt/safetensors.h"
#include "tessel/nn/models.h"
#include "tessel/core/view.h"
#include "tessel/ops/inplace.h"

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
  std::map<std::string, Tensor> hf;
  // the attention mask buffers; c_attn as the Conv1D matrix [C, 3C] (tessel holds [C, 3, C]).
  for (nn::Parameter* p : src.parameters())
    hf[p->name.substr(std::string("transformer.").size())] = view::reshape(p->value, p->stored_shape());
  EXPECT_EQ(hf.at("h.0.attn.c_attn.weight").shape(), (Shape{8, 24}));
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

// Mixtral's experts: one tensor per expert in Hugging Face's files
// ("model.layers.N.block_sparse_moe.experts.E.w1.weight" [F, C]), one stacked [E, F, C]
// parameter here. Saved and loaded through those names; a missing or misshapen expert named.
TEST(LoadModel, MixtralExpertsAreOneTensorPerExpertInTheFiles) {
  nn::LlamaConfig c{.num_hidden_layers = 2, .hidden_size = 8, .num_attention_heads = 2, .num_key_value_heads = 1,
                    .intermediate_size = 6, .vocab_size = 10, .max_position_embeddings = 8};
  c.moe = {.num_experts = 3, .top_k = 2, .expert_hidden = 6};
  nn::Llama src(c);
  src.materialize(1);
  std::map<std::string, Tensor> state = model_state(src);
  EXPECT_FALSE(state.count("model.layers.0.block_sparse_moe.experts.w1.weight"));
  ASSERT_TRUE(state.count("model.layers.1.block_sparse_moe.experts.2.w2.weight"));
  EXPECT_EQ(state.at("model.layers.1.block_sparse_moe.experts.2.w2.weight").shape(), (Shape{8, 6}));
  EXPECT_EQ(state.at("model.layers.1.block_sparse_moe.experts.2.w2.weight").to_doubles(),
            view::select(src.parameter("model.layers.1.block_sparse_moe.experts.w2.weight").value, 0, 2).to_doubles());
  const std::string path = temp("mixtral.safetensors");
  save_safetensors(path, state, {{"format", "pt"}});
  nn::Llama dst(c);
  dst.materialize(2);
  load_model(path, dst);
  for (nn::Parameter* p : dst.parameters())
    EXPECT_EQ(p->value.to_doubles(), src.parameter(p->name).value.to_doubles()) << p->name;
  auto missing = state;
  missing.erase("model.layers.0.block_sparse_moe.experts.1.w3.weight");
  save_safetensors(path, missing);
  try {
    load_model(path, dst);
    ADD_FAILURE() << "a missing expert was accepted";
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("experts.1.w3.weight"), std::string::npos) << e.what();
  }
  fs::remove(path);
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

TEST(LoadModel, RejectsIntegerWeights) {
  nn::Gpt2 m(tiny());
  m.materialize(1);
  std::map<std::string, Tensor> state = model_state(m);
  state["transformer.wte.weight"] = Tensor::zeros({10, 8}, DType::i32);
  std::string path = temp("i32.safetensors");
  save_safetensors(path, state);
  try {
    load_model(path, m);
    FAIL() << "an I32 tensor loaded into a float parameter";
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("I32"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("transformer.wte.weight"), std::string::npos) << e.what();
  }
  fs::remove(path);
}

TEST(ResolveCheckpoint, PicksTheNewestCompleteStepByNumber) {
  fs::path dir = temp("resolve");
  fs::remove_all(dir);
  nn::Gpt2 m(tiny());
  m.materialize(1);
  for (int64_t step : {2, 999999, 1000000}) save_checkpoint(dir.string(), m, nullptr, TrainerState{.step = step});
  for (const char* bogus : {"step-1000000x", "step-"}) {  // not step folders at all
    fs::create_directories(dir / bogus);
    std::ofstream(dir / bogus / "trainer.json") << "{\"step\": 5}";
  }
  fs::create_directories(dir / "step-2000000");  // a folder with nothing in it: incomplete
  fs::create_directories(dir / ".step-2000001.tmp");  // what a killed save leaves
  EXPECT_EQ(fs::path(resolve_checkpoint(dir.string())).filename(), "step-1000000");
  EXPECT_FALSE(fs::exists(dir / ".step-2000001.tmp")) << "the killed save's folder is cleaned up";
  EXPECT_NE(checkpoint_incomplete((dir / "step-2000000").string()), "");
  EXPECT_EQ(checkpoint_incomplete((dir / "step-1000000").string()), "");
  // A truncated file makes a step incomplete: resume falls back to the one before.
  fs::resize_file(dir / "step-1000000" / "model.safetensors", 100);
  EXPECT_NE(checkpoint_incomplete((dir / "step-1000000").string()).find("model.safetensors"), std::string::npos);
  EXPECT_EQ(fs::path(resolve_checkpoint(dir.string())).filename(), "step-999999");
  fs::remove_all(dir);
}

// keep_last: only the newest N step folders stay.
TEST(SaveCheckpoint, KeepsTheLastN) {
  fs::path dir = temp("keep");
  fs::remove_all(dir);
  nn::Gpt2 m(tiny());
  m.materialize(1);
  for (int64_t step = 1; step <= 4; ++step) save_checkpoint(dir.string(), m, nullptr, TrainerState{.step = step}, 2);
  std::vector<std::string> left;
  for (const auto& e : fs::directory_iterator(dir)) left.push_back(e.path().filename().string());
  std::sort(left.begin(), left.end());
  EXPECT_EQ(left, (std::vector<std::string>{"step-000003", "step-000004"}));
  fs::remove_all(dir);
}

// A checkpoint whose parts disagree, or whose trainer.json is malformed, is refused with the
// file named, rather than resumed from a mixed or impossible state.
TEST(LoadCheckpoint, RefusesInconsistentState) {
  fs::path dir = temp("inconsistent");
  fs::remove_all(dir);
  nn::Gpt2 m(tiny());
  m.materialize(1);
  const std::string step1 = save_checkpoint(dir.string(), m, nullptr, TrainerState{.step = 1, .seed = 7});
  copy_(m.parameters()[0]->value, Tensor::full(m.parameters()[0]->value.shape(), 0.25));
  const std::string step3 = save_checkpoint(dir.string(), m, nullptr, TrainerState{.step = 3, .seed = 7});
  const fs::path trainer = fs::path(step3) / "trainer.json";
  std::stringstream good;
  good << std::ifstream(trainer).rdbuf();
  auto error_of = [&](const std::string& trainer_text) {
    std::ofstream(trainer) << trainer_text;
    std::string msg = "<no error>";
    try {
      load_checkpoint(step3, m, nullptr);
    } catch (const CheckpointError& e) {
      msg = e.what();
    }
    std::ofstream(trainer) << good.str();
    return msg;
  };
  EXPECT_EQ(error_of(good.str()), "<no error>");
  // Any change to trainer.json after the save is caught by the manifest.
  std::string with_step = good.str();
  with_step.replace(with_step.find("\"step\":3"), 8, "\"step\":4");
  std::string msg = error_of(with_step);
  EXPECT_NE(msg.find("trainer.json does not match its checksum"), std::string::npos) << msg;
  // Without a manifest (a checkpoint from before them) the fields themselves are checked.
  const fs::path manifest = fs::path(step3) / "manifest.json";
  const fs::path aside = fs::path(step3) / "manifest.aside";
  fs::rename(manifest, aside);
  with_step = good.str();
  with_step.replace(with_step.find("\"step\":3"), 8, "\"step\":-2");
  EXPECT_NE(error_of(with_step).find("negative"), std::string::npos) << error_of(with_step);
  msg = error_of("{\"step\":3,\"seed\":7,\"arch\":\"gpt2\",\"settings\":5}");
  EXPECT_NE(msg.find("settings"), std::string::npos) << msg;
  EXPECT_NE(msg.find(trainer.string()), std::string::npos) << msg;
  msg = error_of("{\"step\":3,\"arch\":\"gpt2\"}");
  EXPECT_NE(msg.find("seed"), std::string::npos) << msg;
  EXPECT_NE(msg.find(trainer.string()), std::string::npos) << msg;
  fs::rename(aside, manifest);
  // step 1's weights in step 3's folder: the pieces' checksums do not match.
  fs::copy_file(fs::path(step1) / "model.safetensors", fs::path(step3) / "model.safetensors",
                fs::copy_options::overwrite_existing);
  msg = error_of(good.str());
  EXPECT_NE(msg.find("checksum"), std::string::npos) << msg;
  EXPECT_NE(msg.find(m.parameters()[0]->name), std::string::npos) << msg;
  fs::remove_all(dir);
}

}  // namespace
}  // namespace tessel
