// Save in one layout, resume in another: a run saved at step 3 and resumed in another layout
// (world size 8→4→2→1 and back, tp 2↔4, pp 2→1, vpp 2→1, ZeRO stage 3→0 and 0→3, GPT-2 and
// Llama, dropout on) continues the trajectory of the run that saved it: the loss at every step
// after the resume equals the uninterrupted run's (relative 1e-5) and the parameters after the
// last step match (1e-4). A rank of a sharded layout reads only its own pieces of the checkpoint.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "tessel/cli/config.h"
#include "tessel/cli/trainer.h"
#include "support/compare.h"
#include "tessel/ckpt/checkpoint.h"
#include "tessel/engine/engine.h"

namespace tessel {
namespace {

namespace fs = std::filesystem;

struct Shape3 {
  int dp = 1, tp = 1, pp = 1, vpp = 1, stage = 0;
  const char* schedule = "1F1B";
  int world() const { return dp * tp * pp; }
  std::string str() const {
    return fmt::format("dp{}·tp{}·pp{}{} stage{}", dp, tp, pp, vpp > 1 ? fmt::format("·vpp{}", vpp) : "", stage);
  }
};

RunConfig base_config(bool llama) {
  std::vector<std::string> sets = {"train.steps=6", "train.warmup=2", "train.global_batch=8", "train.seq_len=16",
                                   "train.micro_batch=4", "train.threads=1", "log.every=1000"};
  if (llama) {
    for (const char* s : {"model.num_hidden_layers=4", "model.hidden_size=32", "model.num_attention_heads=4",
                          "model.num_key_value_heads=4", "model.intermediate_size=64", "model.max_position_embeddings=32"})
      sets.push_back(s);
  } else {
    for (const char* s : {"model.n_layer=4", "model.n_embd=32", "model.n_head=4", "model.n_positions=32", "train.dropout=0.1"})
      sets.push_back(s);
  }
  return load_run_config(std::string(TESSEL_SOURCE_DIR) + (llama ? "/configs/llama-tiny.yaml" : "/configs/gpt2-tiny.yaml"),
                         sets);
}

RunConfig with(RunConfig cfg, const Shape3& l) {
  cfg.parallel.dp = l.dp;
  cfg.parallel.tp = l.tp;
  cfg.parallel.pp = l.pp;
  cfg.parallel.vpp = l.vpp;
  cfg.parallel.sharding_stage = l.stage;
  cfg.parallel.schedule = l.vpp > 1 ? "VPP" : l.schedule;
  return cfg;
}

// Losses of the steps run, final whole parameters, and the bytes rank 0 read on resume.
struct RunRecord {
  std::vector<double> losses;
  std::map<std::string, Tensor> params;
  int64_t bytes_read = 0;
};

RunRecord run(const RunConfig& cfg, const Shape3& l, const std::string& save, const std::string& resume) {
  const TrainOptions opts{.save_dir = save, .resume_dir = resume, .progress = false, .quiet = true, .collect_params = true};
  RunRecord out;
  if (l.world() == 1) {  // the single-rank trainer
    const TrainResult r = train(cfg, opts);
    for (const StepRecord& s : r.steps) out.losses.push_back(s.loss);
    out.params = r.final_params;
    return out;
  }
  const ParallelTrainResult r = train_parallel_threads(cfg, l.world(), ParallelTrainOptions{.base = opts});
  for (const StepRecord& s : r.train.steps) out.losses.push_back(s.loss);
  out.params = r.final_params;
  out.bytes_read = r.resume_bytes_read;
  return out;
}

int64_t checkpoint_tensor_bytes(const std::string& step_dir) {
  int64_t total = 0;
  for (const auto& e : fs::directory_iterator(step_dir))
    if (e.path().extension() == ".safetensors") total += static_cast<int64_t>(fs::file_size(e.path()));
  return total;
}

struct Pair {
  bool llama;
  Shape3 from, to;
  bool sharded_reader;  // every tensor of `to` split over its ranks: rank 0 must read well under all of it
};

TEST(Checkpoint, ResumesInAnotherLayoutOnTheSameTrajectory) {
  const std::vector<Pair> pairs = {
      {false, {2, 2, 2, 1, 1}, {2, 2, 1, 1, 0}, false},  // world 8 -> 4, pp 2 -> 1, stage 1 -> 0
      {false, {2, 2, 1, 1, 0}, {2, 1, 1, 1, 2}, false},  // 4 -> 2, tp 2 -> 1
      {false, {2, 1, 1, 1, 2}, {1, 1, 1, 1, 0}, false},  // 2 -> 1: the single-rank trainer resumes
      {false, {1, 1, 1, 1, 0}, {1, 2, 1, 1, 0}, false},  // 1 -> 2
      {false, {1, 2, 1, 1, 0}, {2, 1, 2, 1, 0}, false},  // 2 -> 4
      {false, {4, 1, 1, 1, 3}, {2, 2, 2, 2, 3}, false},  // 4 -> 8, vpp 1 -> 2, ZeRO-3 both
      {false, {1, 2, 1, 1, 0}, {1, 4, 1, 1, 0}, true},   // tp 2 -> 4
      {false, {1, 4, 1, 1, 0}, {2, 2, 1, 1, 1}, false},  // tp 4 -> 2
      {false, {1, 1, 2, 2, 0}, {1, 1, 2, 1, 0}, false},  // vpp 2 -> 1
      {false, {2, 1, 1, 1, 3}, {2, 1, 1, 1, 0}, false},  // ZeRO 3 -> 0
      {false, {4, 1, 1, 1, 0}, {2, 2, 1, 1, 3}, true},   // ZeRO 0 -> 3
      {true, {2, 2, 1, 1, 2}, {2, 1, 2, 1, 3}, false},   // Llama: tp 2 -> pp 2, stage 2 -> 3
      {true, {1, 1, 1, 1, 0}, {1, 2, 2, 1, 0}, false},   // Llama: 1 -> 4
      {true, {1, 2, 2, 1, 1}, {1, 1, 1, 1, 0}, false},   // Llama: 4 -> 1
  };
  const std::string root = ::testing::TempDir() + "/tessel-resume-matrix";
  for (const Pair& p : pairs) {
    const std::string what = fmt::format("{} {} -> {}", p.llama ? "llama" : "gpt2", p.from.str(), p.to.str());
    SCOPED_TRACE(what);
    fs::remove_all(root);
    RunConfig cfg = base_config(p.llama);
    cfg.train.save_every = 3;
    // The uninterrupted run of the first layout, saving at step 3 on the way.
    const RunRecord whole = run(with(cfg, p.from), p.from, root + "/a", "");
    ASSERT_EQ(whole.losses.size(), 6u);
    const std::string step3 = root + "/a/step-000003";
    ASSERT_TRUE(fs::exists(step3 + "/manifest.json"));
    const RunRecord resumed = run(with(cfg, p.to), p.to, root + "/b", step3);
    ASSERT_EQ(resumed.losses.size(), 3u);
    double worst = 0;
    for (size_t i = 0; i < 3; ++i) {
      const double want = whole.losses[3 + i], d = std::abs(resumed.losses[i] - want) / want;
      worst = std::max(worst, d);
      EXPECT_LE(d, 1e-5) << "step " << 3 + i << ": " << resumed.losses[i] << " vs " << want;
    }
    double worst_param = 0;
    ASSERT_EQ(resumed.params.size(), whole.params.size());
    for (const auto& [name, t] : whole.params) {
      ASSERT_TRUE(resumed.params.count(name)) << name;
      const double d = rel_diff(resumed.params.at(name), t);
      worst_param = std::max(worst_param, d);
      EXPECT_LE(d, 1e-4) << name;
    }
    const int64_t total = checkpoint_tensor_bytes(step3);
    if (p.sharded_reader) {
      // Its own pieces (a quarter or less here) plus its share of the saved pieces that the new
      // layout reads only in part and so are read whole once to check their checksums (all of
      // them for tp2 -> tp4): well under the whole checkpoint.
      EXPECT_LT(resumed.bytes_read, total * 6 / 10) << "rank 0 read " << resumed.bytes_read << " of " << total;
    }
    std::printf("  %-48s loss rel diff %.1e, parameters %.1e; rank 0 read %lld of %lld bytes\n", what.c_str(), worst,
                worst_param, static_cast<long long>(resumed.bytes_read), static_cast<long long>(total));
    // The resumed run's own checkpoint at the end is one the first layout can read back.
    EXPECT_TRUE(fs::exists(root + "/b/step-000006/manifest.json"));
  }
  fs::remove_all(root);
}

// A piece damaged on disk after the save (same size, so the manifest cannot tell) is caught
// while the resuming ranks read it — from the bytes they read when a rank's box holds the whole
// piece (tp2 -> tp2), by reading it whole once when the ranks read it only in part (tp2 -> tp4)
// — and the resume goes on from the next older checkpoint, on the same trajectory.
TEST(Checkpoint, DamagedPiecesAreCaughtWhileReadAndAnOlderStepIsUsed) {
  const std::string root = ::testing::TempDir() + "/tessel-resume-damaged";
  RunConfig cfg = base_config(false);
  cfg.train.save_every = 2;
  const Shape3 saver{1, 2, 1, 1, 0};
  fs::remove_all(root);
  const RunRecord whole = run(with(cfg, saver), saver, root + "/a", "");
  ASSERT_EQ(whole.losses.size(), 6u);
  const std::string step4 = root + "/a/step-000004";
  ASSERT_TRUE(fs::exists(step4 + "/manifest.json"));
  fs::remove_all(root + "/a/step-000006");
  // Flip one byte inside the tensor data of every model file of step 4 (past the header).
  for (const auto& e : fs::directory_iterator(step4)) {
    if (e.path().extension() != ".safetensors" || e.path().filename().string().rfind("model", 0) != 0) continue;
    std::fstream f(e.path(), std::ios::in | std::ios::out | std::ios::binary);
    uint64_t header = 0;
    f.read(reinterpret_cast<char*>(&header), 8);
    const auto at = static_cast<std::streamoff>(8 + header + (fs::file_size(e.path()) - 8 - header) / 2);
    f.seekg(at);
    char c = 0;
    f.read(&c, 1);
    c = static_cast<char>(c ^ 0x5a);
    f.seekp(at);
    f.write(&c, 1);
  }
  for (const Shape3& to : {Shape3{1, 2, 1, 1, 0}, Shape3{1, 4, 1, 1, 0}}) {
    SCOPED_TRACE(to.str());
    fs::remove_all(root + "/b");
    const RunRecord resumed = run(with(cfg, to), to, root + "/b", root + "/a");
    // Resumed from step 2 (4 steps run), not the damaged step 4.
    ASSERT_EQ(resumed.losses.size(), 4u);
    for (size_t i = 0; i < 4; ++i)
      EXPECT_LE(std::abs(resumed.losses[i] - whole.losses[2 + i]) / whole.losses[2 + i], 1e-5) << "step " << 2 + i;
    // Named as damaged when given as the step itself.
    std::string msg = "<no error>";
    try {
      run(with(cfg, to), to, root + "/c", step4);
    } catch (const CheckpointError& e) {
      msg = e.what();
    }
    EXPECT_NE(msg.find("checksum"), std::string::npos) << msg;
    EXPECT_NE(msg.find(step4), std::string::npos) << msg;
  }
  fs::remove_all(root);
}

}  // namespace
}  // namespace tessel
