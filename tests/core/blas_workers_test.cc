// quiet_blas_workers: OpenBLAS's idle workers are told to sleep at once (OPENBLAS_THREAD_TIMEOUT
// 4, unless the user set it) and restarted; threaded BLAS calls still work afterwards.
#include <gtest/gtest.h>

#include <cblas.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "tessel/core/context.h"

namespace tessel {
namespace {

TEST(QuietBlasWorkers, SetsTheTimeoutUnlessGivenAndThreadedGemmStillWorks) {
  const char* given = std::getenv("OPENBLAS_THREAD_TIMEOUT");
  const std::string before = given != nullptr ? given : "";
  quiet_blas_workers();
  quiet_blas_workers();  // once per process: a second call changes nothing
  const char* now = std::getenv("OPENBLAS_THREAD_TIMEOUT");
  ASSERT_NE(now, nullptr);
  EXPECT_EQ(std::string(now), given != nullptr ? before : "4");

  // The workers were stopped; a threaded call starts them again and computes the product.
  const int threads_before = openblas_get_num_threads();
  openblas_set_num_threads(2);
  constexpr int n = 256;
  std::vector<float> a(n * n), b(n * n, 0.5f), c(n * n, -1.0f);
  for (int i = 0; i < n * n; ++i) a[static_cast<size_t>(i)] = static_cast<float>(i % 7);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
  openblas_set_num_threads(threads_before);
  for (int i = 0; i < n; ++i) {
    float want = 0;
    for (int k = 0; k < n; ++k) want += static_cast<float>((i * n + k) % 7) * 0.5f;
    for (int j = 0; j < n; ++j) ASSERT_EQ(c[static_cast<size_t>(i * n + j)], want) << "row " << i << " column " << j;
  }
}

}  // namespace
}  // namespace tessel
