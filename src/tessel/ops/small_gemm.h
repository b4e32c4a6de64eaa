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

#include <algorithm>
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

// C = alpha · acc + beta · C, small_gemm's epilogue: ep(i, j, acc, n, c) receives the sum
// acc of C(i, j..j+n-1) (n <= lanes; the lanes past n are 0) and where that part of C sits.
// Beta known to be 0 or 1 (Beta 0 or 1) or any (-1); a known one computes the same values.
template <typename T, int Beta = -1>
struct AlphaBeta {
  T alpha, beta;
  void operator()(int64_t, int64_t, Vec<T> acc, int64_t n, T* c) const {
    Vec<T> r = acc * alpha;
    const bool add = Beta == 1 || (Beta == -1 && beta != T(0));
    const T bt = Beta == 1 ? T(1) : beta;
    if (n == kLanes<T>) {
      if (add) r += bt * load(c);
      store(c, r);
      return;
    }
    for (int64_t e = 0; e < n; ++e) c[e] = add ? r[e] + bt * c[e] : r[e];
  }
};

// C[MR, NV·lanes] of one tile, rows i0.. and columns j0.. of the whole product.
template <typename T, int MR, int NV, typename Ep>
inline void tile(int64_t K, const T* a, int64_t sa_row, int64_t sa_col, const T* b, int64_t ldb, T* c, int64_t ldc,
                 int64_t i0, int64_t j0, const Ep& ep) {
  constexpr int L = kLanes<T>;
  // (Every loop over MR and NV unrolled: the accumulators then live in registers from the
  // first multiply-add to the epilogue instead of being zeroed, spilled and reloaded through
  // the stack, about 6% of a 64×64×64 product.)
  Vec<T> acc[MR][NV];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) acc[i][v] = Vec<T>{};
  for (int64_t p = 0; p < K; ++p) {
    Vec<T> row[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) row[v] = load(b + p * ldb + v * L);
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      const T x = a[i * sa_row + p * sa_col];
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) acc[i][v] += x * row[v];
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) ep(i0 + i, j0 + v * L, acc[i][v], L, c + i * ldc + v * L);
}

// Tiles of kTileRows rows (and one of the M % kTileRows rows left) over NV vectors of columns.
template <typename T, int NV, typename Ep>
inline void tile_column(int64_t M, int64_t K, const T* a, int64_t sa_row, int64_t sa_col, const T* b, int64_t ldb, T* c,
                        int64_t ldc, int64_t j0, const Ep& ep) {
  int64_t i = 0;
  for (; i + kTileRows <= M; i += kTileRows) {
    // A row-major A is read a row at a time per tile: its next tile's rows are fetched into
    // L1 now, while this tile's multiply-adds run, not when the next tile stalls on them.
    if (sa_col == 1)
      for (int64_t r = i + kTileRows; r < std::min<int64_t>(M, i + 2 * kTileRows); ++r)
        for (int64_t p = 0; p < K; p += 64 / static_cast<int64_t>(sizeof(T))) __builtin_prefetch(a + r * sa_row + p, 0, 3);
    tile<T, kTileRows, NV>(K, a + i * sa_row, sa_row, sa_col, b, ldb, c + i * ldc, ldc, i, j0, ep);
  }
  const T* ai = a + i * sa_row;
  T* ci = c + i * ldc;
  switch (M - i) {
    case 5: tile<T, 5, NV>(K, ai, sa_row, sa_col, b, ldb, ci, ldc, i, j0, ep); break;
    case 4: tile<T, 4, NV>(K, ai, sa_row, sa_col, b, ldb, ci, ldc, i, j0, ep); break;
    case 3: tile<T, 3, NV>(K, ai, sa_row, sa_col, b, ldb, ci, ldc, i, j0, ep); break;
    case 2: tile<T, 2, NV>(K, ai, sa_row, sa_col, b, ldb, ci, ldc, i, j0, ep); break;
    case 1: tile<T, 1, NV>(K, ai, sa_row, sa_col, b, ldb, ci, ldc, i, j0, ep); break;
    default: break;
  }
}

}  // namespace small_gemm_detail

// C[M, N] = ep(A @ B): the product, each vector of C's row i from column j handed with its
// sum acc (no alpha) to ep(i, j, acc, n, &C(i, j)), which writes the n <= lanes values of C it
// covers (small_gemm_detail::AlphaBeta is small_gemm's). A kernel fuses its elementwise work
// into the product this way while the sums are still in registers (attention's exponentials).
template <typename T, typename Ep>
void small_gemm_ep(int64_t M, int64_t N, int64_t K, const T* a, int64_t sa_row, int64_t sa_col, const T* b, int64_t ldb,
                   T* c, int64_t ldc, const Ep& ep) {
  using namespace small_gemm_detail;
  constexpr int L = kLanes<T>;
  int64_t j = 0;
#if defined(__AVX512F__)
  // AVX-512 has 32 vector registers: 6 rows x 4 vectors (24 accumulators) halves the loads
  // per multiply-add of the 2-vector tile (about 5% at 64x64x64 on a Zen 5 core).
  for (; j + 4 * L <= N; j += 4 * L) tile_column<T, 4>(M, K, a, sa_row, sa_col, b + j, ldb, c + j, ldc, j, ep);
#endif
  for (; j + 2 * L <= N; j += 2 * L) tile_column<T, 2>(M, K, a, sa_row, sa_col, b + j, ldb, c + j, ldc, j, ep);
  if (j + L <= N) {
    tile_column<T, 1>(M, K, a, sa_row, sa_col, b + j, ldb, c + j, ldc, j, ep);
    j += L;
  }
  // The last N % L columns one element at a time, handed over as one part vector per row.
  if (j < N)
    for (int64_t i = 0; i < M; ++i) {
      Vec<T> acc{};
      for (int64_t e = j; e < N; ++e) {
        T s = T(0);
        for (int64_t p = 0; p < K; ++p) s += a[i * sa_row + p * sa_col] * b[p * ldb + e];
        acc[e - j] = s;
      }
      ep(i, j, acc, N - j, c + i * ldc + j);
    }
}

// C[M, N] = alpha · A @ B + beta · C (see the file comment for the operand layouts). C must not
// overlap A or B; with beta 0, C is only written.
template <typename T>
void small_gemm(int64_t M, int64_t N, int64_t K, T alpha, const T* a, int64_t sa_row, int64_t sa_col, const T* b,
                int64_t ldb, T beta, T* c, int64_t ldc) {
  // (beta 0 and 1, attention's, each with its own epilogue: no test of beta per vector.)
  using small_gemm_detail::AlphaBeta;
  if (beta == T(0)) small_gemm_ep(M, N, K, a, sa_row, sa_col, b, ldb, c, ldc, AlphaBeta<T, 0>{alpha, beta});
  else if (beta == T(1)) small_gemm_ep(M, N, K, a, sa_row, sa_col, b, ldb, c, ldc, AlphaBeta<T, 1>{alpha, beta});
  else small_gemm_ep(M, N, K, a, sa_row, sa_col, b, ldb, c, ldc, AlphaBeta<T>{alpha, beta});
}

}  // namespace tessel::kernels
