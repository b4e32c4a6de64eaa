// Engine::predict in a layout against one rank's: the logits of a batch given whole to every
// rank, including batches the layout's dp cannot split evenly or at all (a batch of one over
// two dp ranks once left the SPMD rules the sequence to split over dp, and sdpa took that
// split for a context-parallel one), with and without context parallel and tensor parallel.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <mutex>

#include "tessel/comm/thread_backend.h"
#include "tessel/engine/engine.h"

namespace tessel {
namespace {

RunConfig config(const std::string& arch, int64_t dp, int64_t tp, int64_t cp, const std::string& cp_method) {
  RunConfig c;
  c.model.arch = arch;
  if (arch == "gpt2") {
    c.model.gpt2 = {.n_layer = 2, .n_embd = 32, .n_head = 4, .vocab_size = 256, .n_positions = 32};
  } else {
    c.model.llama = {.num_hidden_layers = 2, .hidden_size = 32, .num_attention_heads = 4, .num_key_value_heads = 2,
                     .intermediate_size = 64, .vocab_size = 256, .max_position_embeddings = 32};
  }
  c.data.path = std::string(TESSEL_SOURCE_DIR) + "/data/kjv.txt";
  c.train = {.steps = 1, .global_batch = 8, .micro_batch = 8, .seq_len = 16};
  c.parallel.dp = dp;
  c.parallel.tp = tp;
  c.parallel.cp = cp;
  c.parallel.cp_method = cp_method;
  return c;
}

// Rank 0's logits of `batch` rows of T tokens, predicted right after the engine is built.
std::vector<double> logits(const RunConfig& cfg, int64_t batch, int64_t T = 16) {
  std::vector<int64_t> ids(static_cast<size_t>(batch * T));
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int64_t>("In the beginning God created the"[i % 32]);
  std::vector<double> out;
  std::mutex mu;
  spawn(static_cast<int>(cfg.parallel.world_size()), [&](int rank) {
    Engine engine(cfg);
    const Tensor y = engine.predict(Tensor::from_vector(ids, {batch, T}));
    if (rank != 0) return;
    std::lock_guard lock(mu);
    out = y.to_doubles();
  });
  return out;
}

struct Case {
  const char* arch;
  int64_t dp, tp, cp;
  const char* cp_method;
  int64_t batch;
  int64_t T = 16;
};

TEST(Predict, LogitsInEveryLayoutAreOneRanks) {
  // (Odd shapes too: 7 tokens over dp 2, one token over tp 2, 3 tokens over cp 2 all_to_all.)
  for (const Case& c :
       {Case{"gpt2", 2, 1, 1, "ring", 1, 7}, Case{"gpt2", 1, 2, 1, "ring", 3, 5}, Case{"llama", 1, 2, 1, "ring", 1, 1},
        Case{"llama", 1, 1, 2, "ring", 2, 12}, Case{"llama", 1, 1, 2, "all_to_all", 2, 6},
        Case{"gpt2", 2, 2, 2, "ring", 3, 8}, Case{"gpt2", 1, 1, 2, "all_to_all", 1, 3},
        Case{"gpt2", 2, 1, 1, "ring", 1}, Case{"gpt2", 4, 1, 1, "ring", 1}, Case{"gpt2", 4, 1, 1, "ring", 2},
        Case{"gpt2", 2, 2, 1, "ring", 1}, Case{"llama", 2, 1, 1, "ring", 1}, Case{"llama", 1, 1, 2, "ring", 1},
        Case{"llama", 2, 1, 2, "ring", 1}, Case{"llama", 2, 1, 2, "all_to_all", 3}, Case{"gpt2", 1, 2, 2, "ring", 2}}) {
    SCOPED_TRACE(
        fmt::format("{} dp {} tp {} cp {} {}, batch {} T {}", c.arch, c.dp, c.tp, c.cp, c.cp_method, c.batch, c.T));
    const std::vector<double> want = logits(config(c.arch, 1, 1, 1, "ring"), c.batch, c.T);
    const std::vector<double> got = logits(config(c.arch, c.dp, c.tp, c.cp, c.cp_method), c.batch, c.T);
    ASSERT_EQ(got.size(), want.size());
    double worst = 0;
    for (size_t i = 0; i < got.size(); ++i) worst = std::max(worst, std::abs(got[i] - want[i]));
    EXPECT_LE(worst, 1e-5);
  }
}

}  // namespace
}  // namespace tessel
