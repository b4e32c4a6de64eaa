// The vectorised pieces of the fused attention kernel (ops/attention.cc): register transposes
// of 16 × 16 tiles, a fixed-order dot product, the forward's online-softmax step over a
// key-major score tile, the backward's masked exponentials and the epilogues that do a fully
// visible block pair's elementwise work inside its products. f32 on AVX-512 runs them 16
// lanes at a time; every other type and target runs the plain loops. Which lanes an element
// takes never changes its value, so results do not depend on the target's vector width beyond
// what the plain loops would give. Internal to the ops layer.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#include "tessel/ops/fast_math.h"
#include "tessel/ops/small_gemm.h"

namespace tessel::attention_tiles {

// The base of the kernel's exponentials: f32 works in base 2 — its scores are scaled by
// log2(e) with the product's scale, so each exponential is fast::exp2_16 (no multiply by
// log2(e), a one-step reduction) — and f64 in base e with libm's exp, the reference of the
// gradient checks. m, the running max, is in the same base; LSE leaves the kernel in base e.
template <typename T>
constexpr T kLogBase = std::is_same_v<T, float> ? T(1.44269504088896340736) : T(1);

template <typename T>
inline T exp_base(T x) {
  if constexpr (std::is_same_v<T, float>) return fast::exp2(x);
  else return std::exp(x);
}

// LSE in base e of a row whose scores in the kernel's base have max m and Σ 2^(s - m) = l.
template <typename T>
inline T lse_of(T m, T l) {
  if (!(l > T(0))) return -std::numeric_limits<T>::infinity();
  if constexpr (std::is_same_v<T, float>) return (m + std::log2(l)) * 0.693147180559945309f;
  else return m + std::log(l);
}

#if defined(__AVX512F__)
// (The intrinsics below are the all-lanes mask forms: GCC 12's unmasked ones start from an
// uninitialised placeholder that -Wuninitialized reports once they are inlined.)
constexpr __mmask16 kAll = 0xFFFF;

// The lanes [0, n) of a 16-lane mask.
inline __mmask16 lanes_below(int64_t n) { return n >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << n) - 1u); }

// dst[e·ldd + s] = src[s·ld + e] for s, e < 16, in registers (three rounds of lane shuffles).
inline void transpose16(const float* src, int64_t ld, float* dst, int64_t ldd) {
  __m512 r[16], t[16];
  for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_ps(src + i * ld);
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_mask_unpacklo_ps(r[i], kAll, r[i], r[i + 1]);
    t[i + 1] = _mm512_mask_unpackhi_ps(r[i], kAll, r[i], r[i + 1]);
  }
  for (int i = 0; i < 16; i += 4)
    for (int k = 0; k < 2; ++k) {
      const __m512d a = _mm512_castps_pd(t[i + k]), b = _mm512_castps_pd(t[i + 2 + k]);
      r[i + k] = _mm512_castpd_ps(_mm512_mask_unpacklo_pd(a, 0xFF, a, b));
      r[i + 2 + k] = _mm512_castpd_ps(_mm512_mask_unpackhi_pd(a, 0xFF, a, b));
    }
  for (int i = 0; i < 4; ++i) {
    t[i] = _mm512_mask_shuffle_f32x4(r[i], kAll, r[i], r[i + 4], 0x88);
    t[i + 4] = _mm512_mask_shuffle_f32x4(r[i], kAll, r[i], r[i + 4], 0xDD);
    t[i + 8] = _mm512_mask_shuffle_f32x4(r[i + 8], kAll, r[i + 8], r[i + 12], 0x88);
    t[i + 12] = _mm512_mask_shuffle_f32x4(r[i + 8], kAll, r[i + 8], r[i + 12], 0xDD);
  }
  // Register i now holds column i with its 1 and 2 swapped in each group of four.
  constexpr int kColumn[16] = {0, 2, 1, 3, 4, 6, 5, 7, 8, 10, 9, 11, 12, 14, 13, 15};
  for (int i = 0; i < 8; ++i) {
    _mm512_storeu_ps(dst + kColumn[i] * ldd, _mm512_mask_shuffle_f32x4(t[i], kAll, t[i], t[i + 8], 0x88));
    _mm512_storeu_ps(dst + kColumn[i + 8] * ldd, _mm512_mask_shuffle_f32x4(t[i], kAll, t[i], t[i + 8], 0xDD));
  }
}
#endif

// dst[D, n] = src[n, D]^T (src rows `ld` apart), so that a product with it reads its
// right-hand operand by contiguous rows, as small_gemm's vector loads need. f32 on AVX-512
// moves whole 16 × 16 tiles in registers, the edges one value at a time.
template <typename T>
void transpose_rows(const T* src, int64_t ld, int64_t n, int64_t D, T* dst, int64_t ldd) {
  constexpr int64_t kTile = 16;
  for (int64_t s0 = 0; s0 < n; s0 += kTile)
    for (int64_t d0 = 0; d0 < D; d0 += kTile) {
#if defined(__AVX512F__)
      if constexpr (std::is_same_v<T, float>)
        if (s0 + kTile <= n && d0 + kTile <= D) {
          transpose16(src + s0 * ld + d0, ld, dst + d0 * ldd + s0, ldd);
          continue;
        }
#endif
      for (int64_t s = s0; s < std::min(n, s0 + kTile); ++s)
        for (int64_t e = d0; e < std::min(D, d0 + kTile); ++e) dst[e * ldd + s] = src[s * ld + e];
    }
}

// dst[e] = src[e] · f for e < n; with `stream`, f32 rows of whole vectors at 64-byte aligned
// addresses go past the caches (non-temporal stores: no read of the lines they overwrite).
// The caller fences (stream_fence) before another thread reads dst.
template <typename T>
inline void scaled_row(const T* __restrict src, int64_t n, T f, T* __restrict dst, bool stream) {
#if defined(__AVX512F__)
  if constexpr (std::is_same_v<T, float>)
    if (stream && n % 16 == 0 && reinterpret_cast<uintptr_t>(dst) % 64 == 0) {
      const __m512 fv = _mm512_set1_ps(f);
      for (int64_t e = 0; e < n; e += 16) _mm512_stream_ps(dst + e, _mm512_mul_ps(_mm512_loadu_ps(src + e), fv));
      return;
    }
#endif
  for (int64_t e = 0; e < n; ++e) dst[e] = src[e] * f;
}

// Orders the non-temporal stores of scaled_row before whatever this thread stores next.
inline void stream_fence() {
#if defined(__AVX512F__)
  _mm_sfence();
#endif
}

// Σ_e a[e]·b[e], e < n: on AVX-512 f32 in 16 lane sums (lane k takes e ≡ k mod 16, the last
// part masked) added up in a fixed tree; elsewhere in order.
template <typename T>
T dot(const T* __restrict a, const T* __restrict b, int64_t n) {
#if defined(__AVX512F__)
  if constexpr (std::is_same_v<T, float>) {
    __m512 acc = _mm512_setzero_ps();
    for (int64_t e = 0; e < n; e += 16) {
      const __mmask16 m = lanes_below(n - e);
      acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + e), _mm512_maskz_loadu_ps(m, b + e), acc);
    }
    float lane[16];
    _mm512_storeu_ps(lane, acc);
    for (int h = 8; h > 0; h /= 2)
      for (int k = 0; k < h; ++k) lane[k] += lane[k + h];
    return lane[0];
  }
#endif
  T s = T(0);
  for (int64_t e = 0; e < n; ++e) s += a[e] * b[e];
  return s;
}

// The exponentials of a score tile (in the kernel's base, exp_base), 16 f32 lanes at a time
// on AVX-512 (fast::exp2_16, masked loads and stores for a last part of fewer than 16);
// elsewhere exp_base, which the compiler vectorises. Which lanes an element takes never
// changes its value.

// One block of the forward's online softmax over the key-major scores st[c·ld + r]
// (key c < bc, query r < rows): the running max m grows to the block's, alpha = e^(m_old -
// m_new), l = l·alpha + Σ_c e^(s - m_new) in key order, and st becomes e^(s - m_new). A row
// that has seen no key yet (m = -inf) takes 0 as its base: e^(-inf - 0) = 0. (e^ is
// exp_base, and s and m are in the kernel's base: for f32 that is 2^ of scores scaled by
// log2(e), the same values as e^ of the scores themselves.) On AVX-512 a
// group of 16 rows keeps its max and sum in registers through the block.
// Finite: every score is finite (a fully visible pair), so the exponentials of the scores
// need no clamps.
// A partly visible pair passes `seen`: row r sees key c when lo[r] <= key0 + c < hi[r], and the
// scores it does not see count as -inf (max unchanged, exponential 0), whatever st holds there.
struct Seen {
  const int64_t* lo = nullptr;  // null: every row sees every key
  const int64_t* hi = nullptr;
  int64_t key0 = 0;
};

template <typename T, bool Finite = false>
void online_softmax(T* __restrict st, int64_t ld, int64_t bc, int64_t rows, T* __restrict m, T* __restrict l,
                    T* __restrict base, T* __restrict alpha, Seen seen = {}) {
  constexpr T kNegInf = -std::numeric_limits<T>::infinity();
#if defined(__AVX512F__)
  if constexpr (std::is_same_v<T, float>) {
    const __m512 neg_inf = _mm512_set1_ps(kNegInf);
    for (int64_t r = 0; r < rows; r += 16) {
      const __mmask16 k = lanes_below(rows - r);
      // The rows' intervals, eight 64-bit bounds to a register; the scores a row does not see
      // are masked out in registers (a pass writing -inf over them first made every load of
      // this loop wait on a store: 59% of a T = 128 forward).
      __m512i lo8[2] = {}, hi8[2] = {};
      if (seen.lo != nullptr)
        for (int h = 0; h < 2; ++h) {
          const auto kh = static_cast<__mmask8>(k >> (8 * h));
          lo8[h] = _mm512_maskz_loadu_epi64(kh, seen.lo + r + 8 * h);
          hi8[h] = _mm512_maskz_loadu_epi64(kh, seen.hi + r + 8 * h);
        }
      auto visible = [&](int64_t c) -> __mmask16 {
        if (seen.lo == nullptr) return k;
        const __m512i key = _mm512_set1_epi64(seen.key0 + c);
        const __mmask8 v0 = _mm512_cmple_epi64_mask(lo8[0], key) & _mm512_cmpgt_epi64_mask(hi8[0], key);
        const __mmask8 v1 = _mm512_cmple_epi64_mask(lo8[1], key) & _mm512_cmpgt_epi64_mask(hi8[1], key);
        return k & static_cast<__mmask16>(v0 | (static_cast<unsigned>(v1) << 8));
      };
      const __m512 m_old = _mm512_mask_loadu_ps(neg_inf, k, m + r);
      // The running max over the block's keys in four chains (max is exact in any order): one
      // chain waits a max's latency per key, four keep the loads coming.
      __m512 mc[4] = {m_old, m_old, m_old, m_old};
      int64_t c = 0;
      for (; c + 4 <= bc; c += 4)
#pragma GCC unroll 4
        for (int j = 0; j < 4; ++j)
          mc[j] = _mm512_mask_max_ps(mc[j], visible(c + j), mc[j], _mm512_maskz_loadu_ps(k, st + (c + j) * ld + r));
      for (; c < bc; ++c)
        mc[0] = _mm512_mask_max_ps(mc[0], visible(c), mc[0], _mm512_maskz_loadu_ps(k, st + c * ld + r));
      // (The masked form with every lane set: GCC 12 warns on the unmasked one's undefined source.)
      const __m512 m01 = _mm512_mask_max_ps(mc[0], kAll, mc[0], mc[1]);
      const __m512 m23 = _mm512_mask_max_ps(mc[2], kAll, mc[2], mc[3]);
      const __m512 mx = _mm512_mask_max_ps(m01, kAll, m01, m23);
      const __m512 b = _mm512_mask_mov_ps(mx, _mm512_cmp_ps_mask(mx, neg_inf, _CMP_EQ_OQ), _mm512_setzero_ps());
      const __m512 a = fast::exp2_16(_mm512_sub_ps(m_old, b));
      __m512 sum = _mm512_mul_ps(_mm512_maskz_loadu_ps(k, l + r), a);
      for (c = 0; c < bc; ++c) {
        T* x = st + c * ld + r;
        const __m512 y = _mm512_sub_ps(_mm512_maskz_loadu_ps(k, x), b);
        const __m512 e = _mm512_maskz_mov_ps(visible(c), Finite ? fast::exp2_16_finite(y) : fast::exp2_16(y));
        _mm512_mask_storeu_ps(x, k, e);
        sum = _mm512_add_ps(sum, e);
      }
      _mm512_mask_storeu_ps(m + r, k, mx);
      _mm512_mask_storeu_ps(l + r, k, sum);
      _mm512_mask_storeu_ps(base + r, k, b);
      _mm512_mask_storeu_ps(alpha + r, k, a);
    }
    return;
  }
#endif
  if (seen.lo != nullptr)
    for (int64_t c = 0; c < bc; ++c)
      for (int64_t r = 0; r < rows; ++r)
        if (seen.key0 + c < seen.lo[r] || seen.key0 + c >= seen.hi[r]) st[c * ld + r] = kNegInf;
  std::copy_n(m, rows, base);
  for (int64_t c = 0; c < bc; ++c)
    for (int64_t r = 0; r < rows; ++r) base[r] = st[c * ld + r] > base[r] ? st[c * ld + r] : base[r];
  for (int64_t r = 0; r < rows; ++r) {
    const T mn = base[r];
    base[r] = mn == kNegInf ? T(0) : mn;
    alpha[r] = exp_base<T>(m[r] - base[r]);
    m[r] = mn;
    l[r] *= alpha[r];
  }
  for (int64_t c = 0; c < bc; ++c)
    for (int64_t r = 0; r < rows; ++r) {
      st[c * ld + r] = exp_base<T>(st[c * ld + r] - base[r]);
      l[r] += st[c * ld + r];
    }
}

// The row sums of a key-major tile of exponentials: sum[r] = Σ_c st[c·ld + r] for r < rows,
// c < bc (on AVX-512 f32 in four chains of keys c ≡ 0..3 mod 4, added pairwise at the end: a
// fixed order). True when every sum is at most `limit` (a NaN is not).
template <typename T>
bool block_sums(const T* __restrict st, int64_t ld, int64_t bc, int64_t rows, T limit, T* __restrict sum) {
#if defined(__AVX512F__)
  if constexpr (std::is_same_v<T, float>) {
    const __m512 lim = _mm512_set1_ps(limit);
    bool within = true;
    for (int64_t r = 0; r < rows; r += 16) {
      const __mmask16 k = lanes_below(rows - r);
      __m512 sc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
      int64_t c = 0;
      for (; c + 4 <= bc; c += 4)
#pragma GCC unroll 4
        for (int j = 0; j < 4; ++j) sc[j] = _mm512_add_ps(sc[j], _mm512_maskz_loadu_ps(k, st + (c + j) * ld + r));
      for (; c < bc; ++c) sc[0] = _mm512_add_ps(sc[0], _mm512_maskz_loadu_ps(k, st + c * ld + r));
      const __m512 s = _mm512_add_ps(_mm512_add_ps(sc[0], sc[1]), _mm512_add_ps(sc[2], sc[3]));
      _mm512_mask_storeu_ps(sum + r, k, s);
      within = within && _mm512_mask_cmp_ps_mask(k, s, lim, _CMP_LE_OQ) == k;
    }
    return within;
  }
#endif
  bool within = true;
  for (int64_t r = 0; r < rows; ++r) {
    T s = T(0);
    for (int64_t c = 0; c < bc; ++c) s += st[c * ld + r];
    sum[r] = s;
    within = within && s <= limit;
  }
  return within;
}

// Backward, query-major: row[c] = exp_base(row[c] - L) for c in [lo, hi), 0 elsewhere in [0, n).
template <typename T>
void exp_shifted_within(T* __restrict row, T L, int64_t n, int64_t lo, int64_t hi) {
#if defined(__AVX512F__)
  if constexpr (std::is_same_v<T, float>) {
    const __m512 shift = _mm512_set1_ps(L);
    for (int64_t c = 0; c < n; c += 16) {
      const __mmask16 m = lanes_below(n - c);
      const __mmask16 keep = m & lanes_below(std::max<int64_t>(hi - c, 0)) & ~lanes_below(std::max<int64_t>(lo - c, 0));
      const __m512 e = fast::exp2_16(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, row + c), shift));
      _mm512_mask_storeu_ps(row + c, m, _mm512_maskz_mov_ps(keep, e));
    }
    return;
  }
#endif
  for (int64_t c = 0; c < n; ++c) row[c] = c >= lo && c < hi ? exp_base<T>(row[c] - L) : T(0);
}

// Epilogues of the block products (kernels::small_gemm_ep): the elementwise work of a block
// pair done on each vector of the product's sums while they are in registers, in place of
// a pass over the tile after it. ep(i, j, acc, n, c) writes C(i, j..j+n-1) from its sums.
using kernels::small_gemm_detail::Vec;
using kernels::small_gemm_detail::kLanes;

// The backward's P = exp_base(acc · scale - L[i]) of a fully visible block pair: acc the
// scores q·k unscaled, scale in the kernel's base, L the rows' LSE in that base.
template <typename T>
struct ExpShifted {
  T scale;
  const T* L;
  void operator()(int64_t i, int64_t, Vec<T> acc, int64_t n, T* c) const {
#if defined(__AVX512F__)
    if constexpr (std::is_same_v<T, float>) {
      // (Finite: every score of a fully visible pair and every row's LSE are.)
      const __m512 e = fast::exp2_16_finite(_mm512_fmsub_ps(acc, _mm512_set1_ps(scale), _mm512_set1_ps(L[i])));
      _mm512_mask_storeu_ps(c, lanes_below(n), e);
      return;
    }
#endif
    for (int64_t e = 0; e < n; ++e) c[e] = exp_base<T>(acc[e] * scale - L[i]);
  }
};

// The forward's P = exp_base(acc · scale - base[j]) of a fully visible block pair whose rows
// have all seen keys before: the key-major scores (row i a key, columns the queries) taken
// against each query's running max of the earlier blocks, `base`, instead of a max that
// includes this block (see forward_block: no rescale while the block's sums stay small).
template <typename T>
struct ExpBelowBase {
  T scale;
  const T* base;
  void operator()(int64_t, int64_t j, Vec<T> acc, int64_t n, T* c) const {
#if defined(__AVX512F__)
    if constexpr (std::is_same_v<T, float>) {
      const __mmask16 k = lanes_below(n);
      const __m512 e =
          fast::exp2_16_finite(_mm512_fmsub_ps(acc, _mm512_set1_ps(scale), _mm512_maskz_loadu_ps(k, base + j)));
      _mm512_mask_storeu_ps(c, k, e);
      return;
    }
#endif
    for (int64_t e = 0; e < n; ++e) c[e] = exp_base<T>(acc[e] * scale - base[j + e]);
  }
};

// The backward's dS = P ⊙ (acc - delta[i]) of a fully visible block pair: acc = dO·V^T, P the
// pair's probabilities (rows ldp apart, the same columns as C).
template <typename T>
struct ProbsTimesShifted {
  const T* p;
  int64_t ldp;
  const T* delta;
  void operator()(int64_t i, int64_t j, Vec<T> acc, int64_t n, T* c) const {
    const T* pr = p + i * ldp + j;
#if defined(__AVX512F__)
    if constexpr (std::is_same_v<T, float>) {
      const __mmask16 k = lanes_below(n);
      const __m512 d = _mm512_sub_ps(acc, _mm512_set1_ps(delta[i]));
      _mm512_mask_storeu_ps(c, k, _mm512_mul_ps(_mm512_maskz_loadu_ps(k, pr), d));
      return;
    }
#endif
    for (int64_t e = 0; e < n; ++e) c[e] = pr[e] * (acc[e] - delta[i]);
  }
};

// The forward's accumulator of a fully visible pair: C = acc + alpha[i] · C, the rescale of
// what came before (alpha = e^(m_old - m_new) of row i) done with the add of P·V.
template <typename T>
struct RescaleAdd {
  const T* alpha;
  void operator()(int64_t i, int64_t, Vec<T> acc, int64_t n, T* c) const {
#if defined(__AVX512F__)
    if constexpr (std::is_same_v<T, float>) {
      const __mmask16 k = lanes_below(n);
      _mm512_mask_storeu_ps(c, k, _mm512_fmadd_ps(_mm512_set1_ps(alpha[i]), _mm512_maskz_loadu_ps(k, c), acc));
      return;
    }
#endif
    for (int64_t e = 0; e < n; ++e) c[e] = acc[e] + alpha[i] * c[e];
  }
};

}  // namespace tessel::attention_tiles
