// quiet_blas_workers: OpenBLAS's idle workers are told to sleep at once (OPENBLAS_THREAD_TIMEOUT
// 4, unless the user set it) and restarted; threaded BLAS calls still work afterwards. And the
// kernel set: where OpenBLAS fell back to a set without AVX2 on a CPU that has it, tessel
// switched it before main (context.h, better_blas_kernels).
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

TEST(BlasKernels, AGenericSetIsReplacedByTheBestTheCpuAndLibraryHave) {
  const std::vector<std::string> all = {"Cooperlake", "SkylakeX", "Haswell"};
  const CpuFeatures bf16{true, true, true}, avx512{true, true, false}, avx2{true, false, false}, old{};
  // Debian 12's OpenBLAS on Emerald Rapids: the SSE3 fallback on an AVX-512 BF16 CPU.
  EXPECT_EQ(better_blas_kernels("Prescott", bf16, all), "Cooperlake");
  EXPECT_EQ(better_blas_kernels("Prescott", avx512, all), "SkylakeX");
  EXPECT_EQ(better_blas_kernels("Sandybridge", avx2, all), "Haswell");
  EXPECT_EQ(better_blas_kernels("Core2", bf16, {"SkylakeX", "Haswell"}), "SkylakeX");  // what the library holds
  EXPECT_EQ(better_blas_kernels("Prescott", bf16, {}), "");
  EXPECT_EQ(better_blas_kernels("Prescott", old, all), "");  // the CPU has nothing better
  // A set with AVX2 kernels or wider is OpenBLAS's considered choice and stands.
  for (const char* kept : {"Haswell", "Zen", "SkylakeX", "Cooperlake", "SAPPHIRERAPIDS", "Excavator"})
    EXPECT_EQ(better_blas_kernels(kept, bf16, all), "") << kept;
}

TEST(BlasKernels, ThisProcessRunsKernelsAsWideAsTheCpu) {
  const char* forced = std::getenv("OPENBLAS_CORETYPE");
  if (forced != nullptr && *forced != '\0') GTEST_SKIP() << "OPENBLAS_CORETYPE=" << forced << " is obeyed as given";
  const CpuFeatures cpu = cpu_features();
  if (!cpu.avx2_fma) GTEST_SKIP() << "this CPU has no AVX2 + FMA";
  const std::string core = openblas_get_corename();
  // Whatever OpenBLAS detected, the set running now has AVX2 kernels or wider.
  EXPECT_EQ(better_blas_kernels(core, cpu, {"Cooperlake", "SkylakeX", "Haswell"}), "")
      << "running " << blas_kernels_description();
  // And it computes: a product through the switched tables.
  constexpr int n = 96;
  std::vector<float> a(n * n, 0.25f), b(n * n, 2.0f), c(n * n);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
  for (float x : c) ASSERT_EQ(x, 0.5f * n);
}

}  // namespace
}  // namespace tessel
