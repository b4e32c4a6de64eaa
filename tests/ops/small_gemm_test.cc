// kernels::small_gemm against a plain triple loop in double precision: every tile height and
// width with remainders, A read plainly and transposed (swapped strides), leading dims wider
// than the matrices, beta 0 (C only written, NaN there ignored), 1 and 0.5, K = 0, f32 and f64.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "tessel/ops/small_gemm.h"

namespace tessel {
namespace {

template <typename T>
void check(int64_t M, int64_t N, int64_t K, bool trans_a, T alpha, T beta) {
  std::mt19937 gen(static_cast<unsigned>(M * 1000003 + N * 1009 + K * 7 + trans_a));
  std::uniform_real_distribution<double> u(-1, 1);
  // A is M x K, stored [M, lda] or, transposed, [K, lda]; B is [K, ldb]; C is [M, ldc].
  const int64_t lda = (trans_a ? M : K) + 3, ldb = N + 5, ldc = N + 2;
  std::vector<T> a(static_cast<size_t>((trans_a ? K : M) * lda + 1)), b(static_cast<size_t>(K * ldb + 1));
  std::vector<T> c(static_cast<size_t>(M * ldc + 1));
  for (T& x : a) x = static_cast<T>(u(gen));
  for (T& x : b) x = static_cast<T>(u(gen));
  for (T& x : c) x = beta == T(0) ? std::numeric_limits<T>::quiet_NaN() : static_cast<T>(u(gen));
  const std::vector<T> c0 = c;
  const int64_t sa_row = trans_a ? 1 : lda, sa_col = trans_a ? lda : 1;
  kernels::small_gemm<T>(M, N, K, alpha, a.data(), sa_row, sa_col, b.data(), ldb, beta, c.data(), ldc);
  const double tol = std::is_same_v<T, float> ? 2e-5 : 1e-12;
  for (int64_t i = 0; i < M; ++i) {
    for (int64_t j = 0; j < ldc; ++j) {
      const T got = c[static_cast<size_t>(i * ldc + j)];
      if (j >= N) {  // padding between rows is never touched
        const T was = c0[static_cast<size_t>(i * ldc + j)];
        ASSERT_TRUE(std::isnan(was) ? std::isnan(got) : got == was) << "M=" << M << " N=" << N << " wrote padding";
        continue;
      }
      double want = 0;
      for (int64_t p = 0; p < K; ++p)
        want += static_cast<double>(a[static_cast<size_t>(i * sa_row + p * sa_col)]) * b[static_cast<size_t>(p * ldb + j)];
      want *= alpha;
      if (beta != T(0)) want += static_cast<double>(beta) * c0[static_cast<size_t>(i * ldc + j)];
      ASSERT_NEAR(got, want, tol * (1 + std::sqrt(static_cast<double>(K))))
          << "M=" << M << " N=" << N << " K=" << K << " trans_a=" << trans_a << " at (" << i << ", " << j << ")";
    }
  }
}

template <typename T>
void sweep() {
  for (int64_t M : {1, 2, 5, 6, 7, 13, 32})
    for (int64_t N : {1, 3, 8, 9, 16, 17, 31, 33, 64, 70})
      for (int64_t K : {0, 1, 4, 64})
        for (bool trans_a : {false, true}) {
          check<T>(M, N, K, trans_a, T(1), T(0));
          check<T>(M, N, K, trans_a, T(0.25), T(1));
        }
  check<T>(13, 33, 9, false, T(-1.5), T(0.5));
  check<T>(13, 33, 9, true, T(2), T(-1));
}

TEST(SmallGemm, MatchesThePlainProductF32) { sweep<float>(); }
TEST(SmallGemm, MatchesThePlainProductF64) { sweep<double>(); }

}  // namespace
}  // namespace tessel
