// Every kernel that splits its work gives the same bits with 1, 2 and 3 intra-op threads
// (docs/development.md): forward and backward of the ops a training step runs, on inputs
// large enough that each op splits into several chunks (several gemm tiles for the products).
// A gemm handed to OpenBLAS's own threads fails this: its split, and with it the rounding of
// about one element in ten, follows the thread count.
#include <cblas.h>
#include <gtest/gtest.h>

#include <cstring>
#include <array>
#include <functional>

#include "op_test_util.h"
#include "tessel/autograd/engine.h"
#include "tessel/core/context.h"
#include "tessel/ops/kernel_util.h"
#include "tessel/ops/ops.h"

namespace tessel::testing {
namespace {

struct Case {
  const char* name;
  std::function<Tensor(std::vector<Tensor>&)> run;  // output from leaves that it creates
};

Tensor leaf(const Shape& shape, uint64_t seed, std::vector<Tensor>& leaves) {
  Tensor t = rand_tensor(shape, DType::f32, seed).set_requires_grad();
  leaves.push_back(t);
  return t;
}

const Case kCases[] = {
    {"matmul", [](auto& l) { return matmul(leaf({300, 500}, 1, l), leaf({500, 700}, 2, l)); }},
    {"matmul_transposed", [](auto& l) { return matmul(leaf({500, 300}, 3, l), leaf({700, 500}, 4, l), true, true); }},
    {"matmul_batched", [](auto& l) { return matmul(leaf({16, 128, 64}, 5, l), leaf({16, 64, 128}, 6, l)); }},
    {"linear_bias", [](auto& l) { return linear(leaf({4, 256, 256}, 7, l), leaf({768, 256}, 8, l), leaf({768}, 9, l)); }},
    {"linear_in_out", [](auto& l) {
       return linear(leaf({1024, 256}, 10, l), leaf({256, 3, 256}, 11, l), leaf({3, 256}, 12, l), true);
     }},
    {"layer_norm", [](auto& l) { return layer_norm(leaf({4096, 256}, 13, l), leaf({256}, 14, l), leaf({256}, 15, l)); }},
    {"rms_norm", [](auto& l) { return rms_norm(leaf({4096, 256}, 16, l), leaf({256}, 17, l)); }},
    {"softmax", [](auto& l) { return softmax(leaf({2048, 300}, 18, l), -1); }},
    {"softmax_dim0", [](auto& l) { return softmax(leaf({300, 2048}, 19, l), 0); }},
    {"log_softmax", [](auto& l) { return log_softmax(leaf({2048, 300}, 20, l), -1); }},
    {"cross_entropy", [](auto& l) {
       return cross_entropy(leaf({4096, 256}, 21, l), index_tensor({4096}, 256, 22));
     }},
    {"sum_rows", [](auto& l) { return sum(leaf({512, 1024}, 23, l), {0}); }},
    {"sum_columns", [](auto& l) { return sum(leaf({512, 1024}, 24, l), {1}); }},
    {"mean_all", [](auto& l) { return mean(leaf({700, 1000}, 25, l)); }},
    {"gelu", [](auto& l) { return gelu(leaf({512, 1024}, 26, l), true); }},
    {"embedding", [](auto& l) { return embedding(leaf({256, 256}, 27, l), index_tensor({4, 1024}, 256, 28)); }},
    {"sdpa_causal", [](auto& l) {
       return scaled_dot_product_attention(leaf({2, 4, 128, 64}, 29, l), leaf({2, 4, 128, 64}, 30, l),
                                           leaf({2, 4, 128, 64}, 31, l), true);
     }},
    // Several query and key blocks per head, grouped heads, T != S and document masks: the
    // backward's dK and dV sum over query heads and blocks in one order at any thread count.
    {"sdpa_gqa_docs", [](auto& l) {
       Tensor docs = Tensor::from_vector<int64_t>({0, 100, 250, 0, 30, 300}, {2, 3});
       return scaled_dot_product_attention(leaf({2, 4, 200, 32}, 32, l), leaf({2, 2, 300, 32}, 33, l),
                                           leaf({2, 2, 300, 32}, 34, l), docs, true);
     }},
    {"sdpa_plain_long", [](auto& l) {
       return scaled_dot_product_attention(leaf({1, 2, 400, 64}, 35, l), leaf({1, 2, 400, 64}, 36, l),
                                           leaf({1, 2, 400, 64}, 37, l), false);
     }},
};

// The case's output and its leaves' gradients (for a fixed output gradient) at `threads`.
std::vector<Tensor> run_at(const Case& c, int threads) {
  set_default_num_threads(threads);
  std::vector<Tensor> leaves;
  Tensor out = c.run(leaves);
  backward(out, rand_tensor(out.shape(), out.dtype(), 99));
  std::vector<Tensor> all{out.detach()};
  for (const Tensor& t : leaves) all.push_back(t.grad());
  return all;
}

// "" when a and b hold the same bits, else where they first differ.
std::string first_difference(const Tensor& a, const Tensor& b) {
  Tensor x = contiguous(a), y = contiguous(b);
  if (x.shape() != y.shape()) return "shapes differ";
  const float* p = x.data<float>();
  const float* q = y.data<float>();
  int64_t count = 0, first = -1;
  for (int64_t i = 0; i < x.numel(); ++i)
    if (std::memcmp(p + i, q + i, sizeof(float)) != 0) {
      if (first < 0) first = i;
      ++count;
    }
  if (count == 0) return "";
  return fmt::format("{} of {} elements differ, first at {}: {:.9g} vs {:.9g}", count, x.numel(), first, p[first],
                     q[first]);
}

class ThreadCount : public ::testing::TestWithParam<Case> {
 protected:
  void TearDown() override { set_default_num_threads(before_); }
  int before_ = current_num_threads();
};

TEST_P(ThreadCount, SameBitsWithOneTwoAndThreeThreads) {
  const Case& c = GetParam();
  const std::vector<Tensor> one = run_at(c, 1);
  for (int threads : {2, 3}) {
    const std::vector<Tensor> many = run_at(c, threads);
    ASSERT_EQ(one.size(), many.size());
    for (size_t i = 0; i < one.size(); ++i)
      EXPECT_EQ(first_difference(many[i], one[i]), "")
          << (i == 0 ? std::string("output") : fmt::format("gradient of input {}", i - 1)) << " with " << threads
          << " threads against 1";
  }
}

INSTANTIATE_TEST_SUITE_P(Ops, ThreadCount, ::testing::ValuesIn(kCases),
                         [](const auto& info) { return std::string(info.param.name); });

// Dropout on the attention probabilities: the masks are drawn at global indices, not per task.
Tensor sdpa_dropout_gqa(std::vector<Tensor>& l) {
  return scaled_dot_product_attention(leaf({2, 4, 200, 32}, 38, l), leaf({2, 2, 200, 32}, 39, l),
                                      leaf({2, 2, 200, 32}, 40, l), Tensor(), true, 0.0, {}, SdpaDropout{0.2, 5, 6, 0});
}
const Case kDropoutCases[] = {{"sdpa_dropout_gqa", sdpa_dropout_gqa}};
INSTANTIATE_TEST_SUITE_P(Dropout, ThreadCount, ::testing::ValuesIn(kDropoutCases),
                         [](const auto& info) { return std::string(info.param.name); });

// The tile grid depends on the shape alone, covers C exactly, and splits a large product.
TEST(GemmGrid, CoversTheProductAndSplitsLargeOnes) {
  for (auto [M, N, K] : {std::array<int64_t, 3>{1, 1, 1}, {64, 64, 64}, {2048, 768, 256}, {256, 768, 2048},
                         {8192, 2304, 768}, {3, 100000, 512}, {100000, 3, 512}, {777, 333, 4097}}) {
    const kernels::GemmGrid g = kernels::gemm_grid(M, N, K);
    SCOPED_TRACE(fmt::format("{}x{}x{}", M, N, K));
    EXPECT_EQ(g.row_blocks, (M + g.rows - 1) / g.rows);
    EXPECT_EQ(g.col_blocks, (N + g.cols - 1) / g.cols);
    EXPECT_GE(g.rows * g.row_blocks, M);
    EXPECT_LT(g.rows * (g.row_blocks - 1), M);
    EXPECT_GE(g.cols * g.col_blocks, N);
    EXPECT_LT(g.cols * (g.col_blocks - 1), N);
    const double tiles_wanted = static_cast<double>(M) * N * K / static_cast<double>(kernels::kGemmTileWork);
    if (tiles_wanted >= 4 && (M >= 128 || N >= 256)) {
      EXPECT_GE(g.row_blocks * g.col_blocks, 4);
    }
    EXPECT_LE(g.row_blocks * g.col_blocks, 512);
  }
}

// kernels::gemm at 1-4 threads gives, bit for bit, what one single-threaded BLAS call a tile
// of its grid gives, on f32 products whose tiles a thread merges into one call (and on some
// with a corner tile of one row, small enough for BLAS to take another path, which it does
// not merge), every transpose, beta 0 and 1.
TEST(GemmTiles, MergedCallsKeepEachTilesBits) {
  struct Shape3 {
    int64_t M, N, K;
  };
  const Shape3 shapes[] = {{512, 1024, 256}, {512, 256, 1024}, {256, 1024, 512}, {1024, 768, 256},
                           {1000, 700, 300}, {3000, 300, 512}, {777, 333, 4097}, {2641, 100, 2048}};
  const int before = current_num_threads();
  openblas_set_num_threads(1);  // the reference's calls, as kernels::gemm makes them
  int split = 0;
  for (const Shape3& s : shapes)
    for (int trans = 0; trans < 4; ++trans)
      for (float beta : {0.0f, 1.0f}) {
        const bool ta = trans & 1, tb = trans & 2;
        SCOPED_TRACE(fmt::format("{}x{}x{} ta {} tb {} beta {}", s.M, s.N, s.K, ta, tb, beta));
        const Tensor a = rand_tensor({s.M * s.K}, DType::f32, 50), b = rand_tensor({s.K * s.N}, DType::f32, 51);
        const Tensor c0 = rand_tensor({s.M * s.N}, DType::f32, 52);
        const int64_t lda = ta ? s.M : s.K, ldb = tb ? s.K : s.N;
        const float* pa = a.data<float>();
        const float* pb = b.data<float>();
        const kernels::GemmGrid g = kernels::gemm_grid(s.M, s.N, s.K);
        split += g.row_blocks * g.col_blocks > 1;
        Tensor want = view::clone(c0);
        for (int64_t i0 = 0; i0 < s.M; i0 += g.rows)
          for (int64_t j0 = 0; j0 < s.N; j0 += g.cols)
            cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
                        std::min(g.rows, s.M - i0), std::min(g.cols, s.N - j0), s.K, 1.0f, ta ? pa + i0 : pa + i0 * lda,
                        lda, tb ? pb + j0 * ldb : pb + j0, ldb, beta, want.data<float>() + i0 * s.N + j0, s.N);
        for (int threads : {1, 2, 3, 4}) {
          set_default_num_threads(threads);
          Tensor got = view::clone(c0);
          kernels::gemm<float>(ta, tb, s.M, s.N, s.K, 1.0f, pa, lda, pb, ldb, beta, got.data<float>(), s.N);
          EXPECT_EQ(first_difference(got, want), "") << threads << " threads against a call a tile";
        }
      }
  set_default_num_threads(before);
  EXPECT_GT(split, 0) << "no shape splits into tiles: the test checks nothing";
}

}  // namespace
}  // namespace tessel::testing
