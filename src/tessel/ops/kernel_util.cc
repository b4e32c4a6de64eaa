// Kernel helpers.
#include "tessel/ops/kernel_util.h"

#include <cblas.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <string>
#include <type_traits>

#include "tessel/ops/reduce.h"
#include "tessel/ops/shape.h"

namespace tessel::kernels {

void check_same_device(std::string_view what, const Tensor& a, const Tensor& b) {
  TESSEL_CHECK(a.device() == b.device(), "{}: {} is on {} but {} is on {}; move one with Tensor::to", what, a.str(),
               a.device().str(), b.str(), b.device().str());
}

std::string inputs_str(const MetaCall& call) {
  std::string out;
  for (const TensorMeta& m : call.inputs) out += (out.empty() ? "" : ", ") + m.str();
  return out;
}

void check_floating(const MetaCall& call, size_t i) {
  TESSEL_CHECK(is_floating(call.inputs[i].dtype), "{}: input {} has dtype {}; expected a floating dtype (inputs: {})",
               call.op.name, i, call.inputs[i].dtype, inputs_str(call));
}

void check_same_dtype(const MetaCall& call, size_t i, size_t j) {
  TESSEL_CHECK(call.inputs[i].dtype == call.inputs[j].dtype, "{}: dtype mismatch between input {} ({}) and input {} ({})",
               call.op.name, i, call.inputs[i].dtype, j, call.inputs[j].dtype);
}

void check_ndim(const MetaCall& call, size_t i, int64_t ndim, bool at_least) {
  int64_t have = static_cast<int64_t>(call.inputs[i].shape.size());
  TESSEL_CHECK(at_least ? have >= ndim : have == ndim, "{}: input {} must have {}{} dims, got shape {} (inputs: {})",
               call.op.name, i, at_least ? "at least " : "", ndim, shape_str(call.inputs[i].shape), inputs_str(call));
}

void check_index(const MetaCall& call, size_t i) {
  TESSEL_CHECK(is_integral(call.inputs[i].dtype), "{}: input {} has dtype {}; expected i32 or i64 indices", call.op.name,
               i, call.inputs[i].dtype);
}

namespace {

// Keeps OpenBLAS on one thread: tessel sets it so (set_default_num_threads), but a program that
// embeds tessel may have set more, and then each tile would again depend on the count.
void blas_single_threaded() {
  if (openblas_get_num_threads() != 1) openblas_set_num_threads(1);
}

// Whether OpenBLAS's kernel set is one whose sgemm gives an element the same bits inside a
// call on several tiles as in its tile's own call (below). Measured on the AVX-512 sets,
// SkylakeX and Cooperlake (tests/ops/thread_count_test.cc, GemmTiles); not on the AVX2 Zen
// set, whose register tiles do not line up with tessel's 16-wide tile edges: a tenth of the
// elements of a 1024x768x256 product differed (AMD EPYC, OpenBLAS 0.3.21). Any set not
// measured keeps a call a tile.
bool blas_keeps_tile_bits() {
  static const bool keeps = [] {
    std::string core = openblas_get_corename();
    for (char& ch : core) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    return core == "skylakex" || core == "cooperlake";
  }();
  return keeps;
}

void blas_gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
               const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N, K, alpha, A, lda, B,
              ldb, beta, C, ldc);
}
void blas_gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, double alpha, const double* A, int64_t lda,
               const double* B, int64_t ldb, double beta, double* C, int64_t ldc) {
  cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N, K, alpha, A, lda, B,
              ldb, beta, C, ldc);
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace

// Halves the larger tile side (rows in multiples of 16, BLAS's widest register tile) until
// the grid has about work / kGemmTileWork tiles, keeping tiles at least 32 x 64.
GemmGrid gemm_grid(int64_t M, int64_t N, int64_t K) {
  constexpr int64_t kAlign = 16, kMinRows = 32, kMinCols = 64, kMaxTiles = 256;
  GemmGrid g{.rows = std::max<int64_t>(M, 1), .cols = std::max<int64_t>(N, 1)};
  const double work = static_cast<double>(M) * static_cast<double>(N) * static_cast<double>(std::max<int64_t>(K, 1));
  const double want = std::min<double>(kMaxTiles, std::ceil(work / static_cast<double>(kGemmTileWork)));
  while (static_cast<double>(g.row_blocks * g.col_blocks) < want) {
    const bool rows_ok = g.rows >= 2 * kMinRows, cols_ok = g.cols >= 2 * kMinCols;
    if (rows_ok && (g.rows >= g.cols || !cols_ok)) {
      g.rows = ceil_div(ceil_div(g.rows, 2), kAlign) * kAlign;
      g.row_blocks = ceil_div(M, g.rows);
    } else if (cols_ok) {
      g.cols = ceil_div(ceil_div(g.cols, 2), kAlign) * kAlign;
      g.col_blocks = ceil_div(N, g.cols);
    } else {
      break;
    }
  }
  return g;
}

// Below this many multiply-adds OpenBLAS 0.3.21 may leave its packed path for one without
// K-blocking, which rounds differently: the SkylakeX/Cooperlake "direct" sgemm (row-major, no
// transposes, alpha 1, beta 0, below 28·512·512) and the small-matrix kernels (up to 100³).
// Above it, every element of C is summed over K in blocks that depend on K alone, so a call
// on a rectangle of whole tiles gives each element the bits the tiles' own calls give it
// (tile sides are multiples of 16, the register tiles' widths, so no element moves between a
// full and an edge register tile).
constexpr double kBlasPackedWork = 28.0 * 512 * 512;

template <typename T>
void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, T alpha, const T* A, int64_t lda, const T* B, int64_t ldb,
          T beta, T* C, int64_t ldc) {
  if (M == 0 || N == 0) return;
  if (K == 0) {
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j) C[i * ldc + j] = beta == T(0) ? T(0) : beta * C[i * ldc + j];
    return;
  }
  ProfileScope profile_scope("(blas gemm)");
  blas_single_threaded();
  const GemmGrid g = gemm_grid(M, N, K);
  // The rows [i0, i0 + m) and columns [j0, j0 + n) of C: op(A)'s rows i0.. are A's rows (or,
  // transposed, its columns) from i0; op(B)'s columns j0.. likewise.
  auto rect = [&](int64_t i0, int64_t j0, int64_t m, int64_t n) {
    blas_gemm(ta, tb, m, n, K, alpha, ta ? A + i0 : A + i0 * lda, lda, tb ? B + j0 * ldb : B + j0, ldb, beta,
              C + i0 * ldc + j0, ldc);
  };
  // Tiles [t0, t1) in row-major grid order, as few rectangles as they form: the rest of a
  // first partial grid row, whole grid rows, the start of a last partial one.
  auto tiles_from = [&](int64_t t0, int64_t t1) {
    while (t0 < t1) {
      const int64_t r = t0 / g.col_blocks, c = t0 % g.col_blocks;
      const int64_t i0 = r * g.rows, j0 = c * g.cols;
      if (c == 0 && t1 - t0 >= g.col_blocks) {
        const int64_t full_rows = (t1 - t0) / g.col_blocks;
        rect(i0, 0, std::min(full_rows * g.rows, M - i0), N);
        t0 += full_rows * g.col_blocks;
      } else {
        const int64_t end = std::min(t1, (r + 1) * g.col_blocks);
        rect(i0, j0, std::min(g.rows, M - i0), std::min((end - t0) * g.cols, N - j0));
        t0 = end;
      }
    }
  };
  const int64_t tiles = g.row_blocks * g.col_blocks;
  if (tiles == 1) return rect(0, 0, M, N);
  // The grid fixes the bits; how many calls carry them is free where a call on several tiles
  // rounds as the tiles' own calls do. Then each thread takes one run of consecutive tiles as
  // one call (BLAS packs each operand once instead of once a tile): f32 products whose
  // smallest tile, the corner one, stays on the packed path. OpenBLAS's SkylakeX dgemm does
  // not keep the bits of a tile inside a larger call (a fifth of a sweep of large f64 shapes
  // differed), so f64 — the dtype of gradient checks, not of training — keeps a call a tile,
  // as does f32 on a kernel set not known to keep the bits (blas_keeps_tile_bits).
  const double corner = static_cast<double>(M - (g.row_blocks - 1) * g.rows) *
                        static_cast<double>(N - (g.col_blocks - 1) * g.cols) * static_cast<double>(K);
  const bool merge = std::is_same_v<T, float> && corner >= kBlasPackedWork && blas_keeps_tile_bits();
  const int64_t parts = merge ? std::min<int64_t>(tiles, current_num_threads()) : tiles;
  parallel_for(0, parts, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t p = lo; p < hi; ++p) tiles_from(p * tiles / parts, (p + 1) * tiles / parts);
  });
}

template void gemm<float>(bool, bool, int64_t, int64_t, int64_t, float, const float*, int64_t, const float*, int64_t,
                          float, float*, int64_t);
template void gemm<double>(bool, bool, int64_t, int64_t, int64_t, double, const double*, int64_t, const double*,
                           int64_t, double, double*, int64_t);

Tensor sum_to(const Tensor& grad, const Shape& shape) {
  if (grad.shape() == shape) return grad;
  const Shape& g = grad.shape();
  size_t lead = g.size() - shape.size();
  std::vector<int64_t> dims;
  for (size_t i = 0; i < g.size(); ++i)
    if (i < lead || (shape[i - lead] == 1 && g[i] != 1)) dims.push_back(static_cast<int64_t>(i));
  Tensor s = dims.empty() ? grad : sum(grad, dims, /*keepdim=*/true);
  return reshape(s, shape);
}

DimSplit split_at(const Shape& shape, int64_t dim) {
  DimSplit s;
  for (int64_t i = 0; i < static_cast<int64_t>(shape.size()); ++i) {
    if (i < dim) s.outer *= shape[i];
    else if (i == dim) s.size = shape[i];
    else s.inner *= shape[i];
  }
  return s;
}

double io_bytes(const MetaCall& call, std::span<const TensorMeta> outputs) {
  double bytes = 0;
  for (const TensorMeta& m : call.inputs) bytes += static_cast<double>(m.nbytes());
  for (const TensorMeta& m : outputs) bytes += static_cast<double>(m.nbytes());
  return bytes;
}

Cost elementwise_cost(const MetaCall& call, std::span<const TensorMeta> outputs, double flops_per_element) {
  double n = outputs.empty() ? 0 : static_cast<double>(outputs[0].numel());
  return Cost{flops_per_element * n, io_bytes(call, outputs)};
}

}  // namespace tessel::kernels
