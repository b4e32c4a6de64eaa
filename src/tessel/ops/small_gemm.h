// A register-blocked gemm for the small products inside attention (a block of 64 queries
// against a block of 64 keys, head dim 64): operands that sit in L1/L2 are read where
// they are, with no packing and no per-call setup, which is most of what a BLAS call costs at
// these sizes (bench/ops_bench sdpa; on a Zen 2 core 1.25-1.7x cblas_sgemm for 32x64x64 to
// 128x128x64). Large products still go to BLAS (kernels::gemm).
//
// Shapes: C[M, N] = alpha · A[M, K] @ B[K, N] + beta · C, where A(i, p) = a[i·sa_row + p·sa_col]
// (a transposed A is the same call with the strides swapped), B is row-major with rows `ldb`
// apart and C row-major with rows `ldc` apart. Each C element sums its K products in order
// p = 0..K-1 (deterministic: no dependence on threads or timing).
#pragma once

#include <cstdint>
#include <cstring>

namespace tessel::kernels {

namespace small_gemm_detail {

#if defined(__AVX512F__)
constexpr int kVecBytes = 64;
#elif defined(__AVX__)
constexpr int kVecBytes = 32;
#else
constexpr int kVecBytes = 16;
#endif

typedef float VecF __attribute__((vector_size(kVecBytes)));
typedef double VecD __attribute__((vector_size(kVecBytes)));
template <typename T>
struct VecOf;
template <>
struct VecOf<float> {
  using type = VecF;
};
template <>
struct VecOf<double> {
  using type = VecD;
};
template <typename T>
using Vec = typename VecOf<T>::type;
template <typename T>
constexpr int kLanes = kVecBytes / static_cast<int>(sizeof(T));

// Rows of C per tile: 6 rows x 2 vectors keeps 12 accumulators, 2 loaded rows of B and one
// broadcast of A in the 16 vector registers of AVX2.
constexpr int kTileRows = 6;

template <typename T>
inline Vec<T> load(const T* p) {
  Vec<T> v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
template <typename T>
inline void store(T* p, const Vec<T>& v) {
  std::memcpy(p, &v, sizeof v);
}

// C[MR, NV·lanes] of one tile.
template <typename T, int MR, int NV>
inline void tile(int64_t K, T alpha, const T* a, int64_t sa_row, int64_t sa_col, const T* b, int64_t ldb, T beta, T* c,
                 int64_t ldc) {
  constexpr int L = kLanes<T>;
  Vec<T> acc[MR][NV];
  for (int i = 0; i < MR; ++i)
    for (int v = 0; v < NV; ++v) acc[i][v] = Vec<T>{};
  for (int64_t p = 0; p < K; ++p) {
    Vec<T> row[NV];
    for (int v = 0; v < NV; ++v) row[v] = load(b + p * ldb + v * L);
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      const T x = a[i * sa_row + p * sa_col];
      for (int v = 0; v < NV; ++v) acc[i][v] += x * row[v];
    }
  }
  for (int i = 0; i < MR; ++i)
    for (int v = 0; v < NV; ++v) {
      T* out = c + i * ldc + v * L;
      Vec<T> r = acc[i][v] * alpha;
      if (beta != T(0)) r += beta * load(out);
      store(out, r);
    }
}

// Tiles of kTileRows rows (and one of the M % kTileRows rows left) over NV vectors of columns.
template <typename T, int NV>
inline void tile_column(int64_t M, int64_t K, T alpha, const T* a, int64_t sa_row, int64_t sa_col, const T* b,
                        int64_t ldb, T beta, T* c, int64_t ldc) {
  int64_t i = 0;
  for (; i + kTileRows <= M; i += kTileRows)
    tile<T, kTileRows, NV>(K, alpha, a + i * sa_row, sa_row, sa_col, b, ldb, beta, c + i * ldc, ldc);
  const T* ai = a + i * sa_row;
  T* ci = c + i * ldc;
  switch (M - i) {
    case 5: tile<T, 5, NV>(K, alpha, ai, sa_row, sa_col, b, ldb, beta, ci, ldc); break;
    case 4: tile<T, 4, NV>(K, alpha, ai, sa_row, sa_col, b, ldb, beta, ci, ldc); break;
    case 3: tile<T, 3, NV>(K, alpha, ai, sa_row, sa_col, b, ldb, beta, ci, ldc); break;
    case 2: tile<T, 2, NV>(K, alpha, ai, sa_row, sa_col, b, ldb, beta, ci, ldc); break;
    case 1: tile<T, 1, NV>(K, alpha, ai, sa_row, sa_col, b, ldb, beta, ci, ldc); break;
    default: break;
  }
}

}  // namespace small_gemm_detail

// C[M, N] = alpha · A @ B + beta · C (see the file comment for the operand layouts). C must not
// overlap A or B; with beta 0, C is only written.
template <typename T>
void small_gemm(int64_t M, int64_t N, int64_t K, T alpha, const T* a, int64_t sa_row, int64_t sa_col, const T* b,
                int64_t ldb, T beta, T* c, int64_t ldc) {
  using namespace small_gemm_detail;
  constexpr int L = kLanes<T>;
  int64_t j = 0;
#if defined(__AVX512F__)
  // AVX-512 has 32 vector registers: 6 rows x 4 vectors (24 accumulators) halves the loads
  // per multiply-add of the 2-vector tile (about 5% at 64x64x64 on a Zen 5 core).
  for (; j + 4 * L <= N; j += 4 * L) tile_column<T, 4>(M, K, alpha, a, sa_row, sa_col, b + j, ldb, beta, c + j, ldc);
#endif
  for (; j + 2 * L <= N; j += 2 * L) tile_column<T, 2>(M, K, alpha, a, sa_row, sa_col, b + j, ldb, beta, c + j, ldc);
  if (j + L <= N) {
    tile_column<T, 1>(M, K, alpha, a, sa_row, sa_col, b + j, ldb, beta, c + j, ldc);
    j += L;
  }
  // The last N % L columns one element at a time.
  for (; j < N; ++j)
    for (int64_t i = 0; i < M; ++i) {
      T s = T(0);
      for (int64_t p = 0; p < K; ++p) s += a[i * sa_row + p * sa_col] * b[p * ldb + j];
      T& out = c[i * ldc + j];
      out = beta != T(0) ? alpha * s + beta * out : alpha * s;
    }
}

}  // namespace tessel::kernels
