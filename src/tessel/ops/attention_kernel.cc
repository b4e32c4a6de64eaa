// The fused attention kernel of the op sdpa (FlashAttention, Dao et al. 2022; the backward's
// loop order of FlashAttention-2): no [T, S] matrix is ever held. The forward
// walks key blocks for each block of queries with an online softmax — a running max m and
// running sum l per query row, the output accumulator rescaled by e^(m_old - m_new) when the
// max grows; a fully visible block whose rows have all seen keys keeps the earlier m as its
// base and skips the max and the rescale while its exponentials stay small (forward_block) —
// and keeps only out and the per-row log-sum-exp LSE = m + log l [B, H, T] for the backward.
// The backward rebuilds each block of probabilities from q, k and LSE (P = e^(s - LSE)), with
// D = rowsum(dO ⊙ O) computed once per row. So the memory between forward and backward is
// linear in the sequence (and selective recompute has nothing to drop).
//
// Shapes: q[B, H, T, D], k and v[B, Hkv, S, D], out[B, H, T, D], LSE[B, H, T], and the
// optional document starts docs[B, N] (int64)
//   forward   s = q k^T · scale (masked),  out = softmax(s) v,  LSE = logsumexp(s) per row
//   backward  P = e^(s - LSE);  dV += P^T dO;  dP = dO V^T;  dS = P ⊙ (dP - D)
//             dQ += dS K · scale;  dK += dS^T Q · scale
// Visibility: query t sits at key position p = t + (S - T) (aligned at the bottom right).
// Causal hides key j when j > p. With documents, row b of docs lists the key positions where
// its documents start (ascending, the first 0; a row with fewer documents pads with S); a
// query sees only keys of its own document, and a query at p < 0 belongs to none. Every
// query therefore sees one interval [lo(t), hi(t)) of keys, lo and hi non-decreasing in t;
// a block pair outside every row's interval is skipped, one inside every row's is not
// masked. A query that sees no key gets out = 0 (not NaN) and passes no gradient.
// Dropout on the probabilities (GPT-2's attn_pdrop, the DropMask): after the softmax,
// whose normaliser counts every key, each probability is zeroed with probability p and the
// rest scaled by 1/(1-p). Whether P[b, h, i, j] is dropped is a pure function of (seed,
// stream, its index in the global [B, H, T, S] tensor) — a word of the Philox block at
// index / 4 — so every layout draws the same mask (the SPMD rule and ring attention give the
// kernel its piece's global batch row, head and positions), and the backward draws it again:
// nothing is stored. With Z the scales (0 or 1/(1-p)): out = (P ⊙ Z) V, and the backward
// dV += (P ⊙ Z)^T dO, dS = P ⊙ (Z ⊙ dO V^T - D), D = rowsum(dO ⊙ O) as without dropout.
//
// Reproducible at any thread count: the work split depends on the shape alone. The forward
// runs one (batch, head, query block) per task; the backward one (batch, kv head) per task,
// which walks key blocks in order and, inside, the group's query heads and their query
// blocks in order, so dK and dV (local accumulators per key block) and dQ (accumulated in
// place, key blocks in order) sum in one fixed order. Grouped-query attention reads kv head
// h / (H / Hkv). q, k and v are read in place in any layout whose head dim is contiguous,
// and out, dq, dk, dv are written laid out [B, T, H, D] in memory, so merging the heads
// afterwards is a view (dq, dk and dv of a fused projection's heads share one buffer laid
// out like it instead, and a contiguous input gets a contiguous gradient). The block
// products run on kernels::small_gemm; a fully visible pair does its elementwise work in
// their epilogues (small_gemm_ep: P = 2^(s - LSE), dS = P ⊙ (dP - D), the rescale of the
// forward's accumulator) while the sums are in registers, and f32 exponentiates in base 2
// (attention_tiles.h); a partly visible block pair (the causal diagonal) runs the products in
// strips of 16 over what each strip sees, with separate elementwise passes. Where does the
// time go (f32, one thread, T = 1k, D = 64, bench/attention_bench, ~315 ms forward +
// backward): ~80% in the seven 64×64×64 block products of the fully visible pairs (S and P·V
// forward; S again, dV, dP, dQ and dK backward) at ~225 GFLOP/s in place (~250 with their
// operands in L1, a core's FMA peak ~270); ~10% in the diagonal pairs (7.6% of the products);
// ~3% in the forward's online softmax; the rest in the first touch of the fresh outputs and
// gradients, transposes, D and bookkeeping (docs/attention.md, "Measured").
#include "tessel/ops/attention_kernel.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <type_traits>

#include "tessel/core/philox.h"
#include "tessel/core/view.h"
#include "tessel/ops/attention_tiles.h"
#include "tessel/ops/dispatch.h"
#include "tessel/ops/fast_math.h"
#include "tessel/ops/kernel_util.h"
#include "tessel/ops/small_gemm.h"

namespace tessel::attention_kernel {

using kernels::small_gemm;
using namespace attention_tiles;

namespace {

// Block sizes: a block of queries against a block of keys, each operand of the pair's
// products small enough to stay in L1/L2 (64×64 f32 scores are 16 KiB). bench/attention_bench
// at T = 1k and 4k measured 32, 96 and 128 for either (forward and backward apart) within
// the noise of 64; smaller blocks skip more of the causal triangle, larger ones make fewer calls.
constexpr int64_t kBlockQ = 64;
constexpr int64_t kBlockK = 64;

// Whether an output [B, H, T, D] of T is stored past the caches (kStreamBytes, scaled_row).
template <typename T>
bool streamed(int64_t B, int64_t H, int64_t T_, int64_t D) {
  return B * H * T_ * D * static_cast<int64_t>(sizeof(T)) >= kStreamBytes;
}

// z[r·ld + c] = the dropout scale of query row t0 + r and key j0 + c of head (b, h) (local;
// bc at most a key block): 0 where dropped, 1/(1-p) elsewhere. A row's words come from the
// Philox blocks it spans, computed together; the scales are written row by row, contiguous.
template <typename T>
void drop_scales(const DropMask& m, int64_t b, int64_t h, int64_t t0, int64_t rows, int64_t j0, int64_t bc, T* z,
                 int64_t ld) {
  TESSEL_ASSERT(bc <= kBlockK, "attention dropout: a block of {} keys (at most {})", bc, kBlockK);
  const T keep = static_cast<T>(m.keep_scale);
  std::array<uint32_t, 4 * (kBlockK / 4 + 1)> words;
  for (int64_t r = 0; r < rows; ++r) {
    const auto first =
        static_cast<uint64_t>((((m.b0 + b) * m.heads + m.h0 + h) * m.queries + m.q0 + t0 + r) * m.keys + m.k0 + j0);
    const uint64_t last = first + static_cast<uint64_t>(bc) - 1;
    philox_blocks(m.seed, m.stream, first >> 2, static_cast<int64_t>((last >> 2) - (first >> 2) + 1), words.data());
    const uint32_t* __restrict w = words.data() + (first & 3);  // key c's word
    T* __restrict zr = z + r * ld;
    for (int64_t c = 0; c < bc; ++c) zr[c] = w[c] < m.threshold ? T(0) : keep;
  }
}

// The keys each query of one batch row sees: [lo[t], hi[t]) for t in [0, T).
struct Visible {
  std::vector<int64_t> lo, hi;
};

// docs: the batch row's N document starts (null: one document). Checks the starts: they
// index keys, and the forward is the first to see their values.
Visible visible_keys(const Dims& d, bool causal, const int64_t* docs, int64_t N, int64_t b) {
  if (docs != nullptr) {
    TESSEL_CHECK(docs[0] == 0, "sdpa: document starts of batch row {} must begin at 0, got {}", b, docs[0]);
    for (int64_t i = 1; i < N; ++i)
      TESSEL_CHECK(docs[i] >= docs[i - 1] && docs[i] <= d.total,
                   "sdpa: document starts of batch row {} must be ascending within [0, S={}]; start {} is {} after {}",
                   b, d.total, i, docs[i], docs[i - 1]);
  }
  // Positions are global (query t at q0 + t, key j at k0 + j); the interval is in local keys.
  auto local_key = [&](int64_t pos) { return std::clamp<int64_t>(pos - d.k0, 0, d.S); };
  Visible v{std::vector<int64_t>(static_cast<size_t>(d.T)), std::vector<int64_t>(static_cast<size_t>(d.T))};
  for (int64_t t = 0; t < d.T; ++t) {
    const int64_t p = d.q0 + t;
    int64_t lo = 0, hi = causal ? local_key(p + 1) : d.S;
    if (docs != nullptr) {
      if (p < 0) {
        hi = 0;
      } else {
        const int64_t* next = std::upper_bound(docs, docs + N, p);  // the first start after p
        lo = local_key(*(next - 1));
        hi = std::min(hi, next == docs + N ? d.S : local_key(*next));
      }
    }
    v.lo[static_cast<size_t>(t)] = lo;
    v.hi[static_cast<size_t>(t)] = std::max(lo, hi);
  }
  return v;
}

// How key block [j0, j1) meets query rows [t0, t0 + rows): not at all, partly (some scores
// masked), or fully (every row sees every key of the block).
enum class Overlap { none, partial, full };

Overlap overlap(const Visible& vis, int64_t t0, int64_t rows, int64_t j0, int64_t j1) {
  const int64_t* lo = vis.lo.data() + t0;
  const int64_t* hi = vis.hi.data() + t0;
  if (lo[rows - 1] <= j0 && hi[0] >= j1) return Overlap::full;  // lo and hi are non-decreasing
  if (hi[rows - 1] <= j0 || lo[0] >= j1) return Overlap::none;
  for (int64_t r = 0; r < rows; ++r)
    if (lo[r] < j1 && hi[r] > j0 && lo[r] < hi[r]) return Overlap::partial;
  return Overlap::none;
}

// A block pair that is only partly visible (the causal diagonal, a document boundary) is
// computed in strips of kStrip queries or keys, each product over the part of the other side
// that some row of the strip sees, rounded out to whole strips: on the causal diagonal that
// is 10/16 of the block's products. What a strip leaves uncomputed is masked for every row.
constexpr int64_t kStrip = 16;

struct Span {
  int64_t lo = 0, hi = 0;  // [lo, hi), empty when lo >= hi
  int64_t size() const { return hi - lo; }
};

Span round_out(int64_t lo, int64_t hi, int64_t n) {
  if (lo >= hi) return {};
  return {lo / kStrip * kStrip, std::min(n, (hi + kStrip - 1) / kStrip * kStrip)};
}

// The keys of block [j0, j0 + bc) that query rows [t0 + r0, t0 + r1) see, block-local.
Span keys_seen(const Visible& vis, int64_t t0, int64_t r0, int64_t r1, int64_t j0, int64_t bc) {
  int64_t lo = bc, hi = 0;
  for (int64_t r = t0 + r0; r < t0 + r1; ++r) {
    const int64_t a = std::max<int64_t>(vis.lo[static_cast<size_t>(r)] - j0, 0);
    const int64_t b = std::min<int64_t>(vis.hi[static_cast<size_t>(r)] - j0, bc);
    if (a < b) {
      lo = std::min(lo, a);
      hi = std::max(hi, b);
    }
  }
  return round_out(lo, hi, bc);
}

// The rows of query block [t0, t0 + rows) that see some key of [j0 + c0, j0 + c1), block-local.
Span rows_seeing(const Visible& vis, int64_t t0, int64_t rows, int64_t j0, int64_t c0, int64_t c1) {
  int64_t lo = rows, hi = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t a = vis.lo[static_cast<size_t>(t0 + r)], b = vis.hi[static_cast<size_t>(t0 + r)];
    if (a < b && a < j0 + c1 && b > j0 + c0) {
      lo = std::min(lo, r);
      hi = r + 1;
    }
  }
  return round_out(lo, hi, rows);
}

// Each batch row's visible key intervals.
std::vector<Visible> all_visible(const Dims& d, bool causal, const Tensor& docs) {
  std::vector<Visible> out;
  const int64_t N = docs.defined() ? docs.size(1) : 0;
  for (int64_t b = 0; b < d.B; ++b)
    out.push_back(visible_keys(d, causal, docs.defined() ? docs.data<int64_t>() + b * N : nullptr, N, b));
  return out;
}

// ---------------------------------------------------------------- forward

// The largest row sum of a block's exponentials the forward keeps against an earlier max
// (forward_block): with at most 2^24 a block, l and out's accumulator stay within f32's range
// for any sequence of up to 2^20 key blocks and values below ~2^80.
template <typename T>
constexpr T kLazyLimit = T(16777216);

// Scratch of one forward task: q's block transposed, the scores of one block pair (key-major:
// st[c·kBlockQ + r] for key c, query r, so the per-query max and sum run along contiguous
// rows and vectorise), the output accumulator and the running statistics.
template <typename T>
struct ForwardScratch {
  std::vector<T> qt, st, acc, m, l, base, alpha, z, zt;  // z, zt: dropout scales, query- and key-major
  explicit ForwardScratch(int64_t D)
      : qt(static_cast<size_t>(D * kBlockQ)),
        st(static_cast<size_t>(kBlockK * kBlockQ)),
        acc(static_cast<size_t>(kBlockQ * D)),
        m(kBlockQ),
        l(kBlockQ),
        base(kBlockQ),
        alpha(kBlockQ),
        z(st.size()),
        zt(st.size()) {}
};

// out and LSE of query rows [t0, t0 + rows) of head (b, h).
template <typename T>
void forward_block(const Dims& d, T scale, const Visible& vis, const DropMask& drop, const Heads<T>& q,
                   const Heads<T>& k, const Heads<T>& v, const Heads<T>& out, T* lse, int64_t b, int64_t h, int64_t t0,
                   int64_t rows, bool stream, ForwardScratch<T>& w) {
  constexpr T kNegInf = -std::numeric_limits<T>::infinity();
  const int64_t kvh = h / d.group(), D = d.D;
  const T scale2 = scale * kLogBase<T>;
  T* __restrict st = w.st.data();
  T* __restrict m = w.m.data();
  T* __restrict l = w.l.data();
  T* __restrict base = w.base.data();
  T* __restrict alpha = w.alpha.data();
  transpose_rows(q.at(b, h) + t0 * q.ld, q.ld, rows, D, w.qt.data(), kBlockQ);
  std::fill(w.acc.begin(), w.acc.end(), T(0));
  std::fill_n(m, rows, kNegInf);
  std::fill_n(l, rows, T(0));
  bool started = false;  // every row has seen a key: m is finite
  const int64_t first = vis.lo[static_cast<size_t>(t0)] / kBlockK * kBlockK;
  const int64_t last = vis.hi[static_cast<size_t>(t0 + rows - 1)];
  for (int64_t j0 = first; j0 < last; j0 += kBlockK) {
    const int64_t j1 = std::min(j0 + kBlockK, d.S), bc = j1 - j0;
    const Overlap ov = overlap(vis, t0, rows, j0, j1);
    if (ov == Overlap::none) continue;
    // st[bc, rows] = k[j0:j1, D] @ qt[D, rows] · scale, in the kernel's base (scale2); a
    // partial pair by strips of keys
    const T* kj = k.at(b, kvh) + j0 * k.ld;
    // A fully visible pair whose rows have all seen keys already keeps their running max as
    // the base: P = e^(s - m) in the product's epilogue, l += the block's row sums (alpha is
    // their scratch), nothing rescaled — unless a row's sum passes kLazyLimit (its max grew
    // by log2(kLazyLimit / keys) or more), when the block is done again the full way below.
    // The base cancels between out's numerator and l, and LSE = m + log l holds for any
    // base, so this changes only roundings (FlashAttention-4 rescales lazily too).
    bool lazy = ov == Overlap::full && started;
    if (lazy) {
      kernels::small_gemm_ep<T>(bc, rows, D, kj, k.ld, 1, w.qt.data(), kBlockQ, st, kBlockQ,
                                ExpBelowBase<T>{scale2, m});
      lazy = block_sums(st, kBlockQ, bc, rows, kLazyLimit<T>, alpha);
      if (lazy)
        for (int64_t r = 0; r < rows; ++r) l[r] += alpha[r];
    }
    if (!lazy) {
      if (ov == Overlap::full) {
        small_gemm<T>(bc, rows, D, scale2, kj, k.ld, 1, w.qt.data(), kBlockQ, T(0), st, kBlockQ);
      } else {
        for (int64_t c0 = 0; c0 < bc; c0 += kStrip) {
          const int64_t c1 = std::min(bc, c0 + kStrip);
          const Span r = rows_seeing(vis, t0, rows, j0, c0, c1);
          if (r.size() > 0)
            small_gemm<T>(c1 - c0, r.size(), D, scale2, kj + c0 * k.ld, k.ld, 1, w.qt.data() + r.lo, kBlockQ, T(0),
                          st + c0 * kBlockQ + r.lo, kBlockQ);
        }
      }
      // The running max grows to cover this block; alpha = e^(m_old - m_new) rescales what
      // came before. A partial pair's scores outside each row's interval (some never
      // computed) count as -inf.
      if (ov == Overlap::full)
        online_softmax<T, true>(st, kBlockQ, bc, rows, m, l, base, alpha);
      else
        online_softmax<T>(st, kBlockQ, bc, rows, m, l, base, alpha, Seen{vis.lo.data() + t0, vis.hi.data() + t0, j0});
    }
    // Dropout after the normaliser has counted every key: only the product sees the mask. The
    // scales come row by row (query-major) and are turned key-major like st.
    if (drop.on()) {
      drop_scales(drop, b, h, t0, rows, j0, bc, w.z.data(), kBlockK);
      transpose_rows(w.z.data(), kBlockK, rows, bc, w.zt.data(), kBlockQ);
      for (int64_t c = 0; c < bc; ++c) {
        T* __restrict row = st + c * kBlockQ;
        const T* __restrict zc = w.zt.data() + c * kBlockQ;
        for (int64_t r = 0; r < rows; ++r) row[r] *= zc[r];
      }
    }
    // acc[rows, D] = alpha ⊙ acc + P[rows, bc] @ v[j0:j1, D]  (P read transposed out of st);
    // a full pair rescales in the product's epilogue, a partial pair first (rows whose max
    // stayed put are left alone: a factor of exactly 1) and then adds by strips of queries,
    // each over the keys it sees
    const T* vj = v.at(b, kvh) + j0 * v.ld;
    if (lazy) {
      small_gemm<T>(rows, D, bc, T(1), st, 1, kBlockQ, vj, v.ld, T(1), w.acc.data(), D);
    } else if (ov == Overlap::full) {
      kernels::small_gemm_ep<T>(rows, D, bc, st, 1, kBlockQ, vj, v.ld, w.acc.data(), D, RescaleAdd<T>{alpha});
    } else {
      for (int64_t r = 0; r < rows; ++r)
        if (alpha[r] != T(1))
          for (int64_t e = 0; e < D; ++e) w.acc[static_cast<size_t>(r * D + e)] *= alpha[r];
      for (int64_t r0 = 0; r0 < rows; r0 += kStrip) {
        const int64_t r1 = std::min(rows, r0 + kStrip);
        const Span c = keys_seen(vis, t0, r0, r1, j0, bc);
        if (c.size() > 0)
          small_gemm<T>(r1 - r0, D, c.size(), T(1), st + c.lo * kBlockQ + r0, 1, kBlockQ, vj + c.lo * v.ld, v.ld, T(1),
                        w.acc.data() + r0 * D, D);
      }
    }
    if (!started) started = std::all_of(m, m + rows, [](T x) { return x != kNegInf; });
  }
  T* o = out.at(b, h) + t0 * out.ld;
  for (int64_t r = 0; r < rows; ++r) {
    const T inv = l[r] > T(0) ? T(1) / l[r] : T(0);
    scaled_row(w.acc.data() + r * D, D, inv, o + r * out.ld, stream);
    lse[t0 + r] = lse_of(m[r], l[r]);
  }
}

template <typename T>
void sdpa_forward_t(const Dims& d, T scale, const std::vector<Visible>& vis, const DropMask& drop, const Heads<T>& q,
                    const Heads<T>& k, const Heads<T>& v, const Heads<T>& out, T* lse) {
  const int64_t blocks = (d.T + kBlockQ - 1) / kBlockQ;
  const bool stream = streamed<T>(d.B, d.H, d.T, d.D);
  parallel_for(0, d.B * d.H * blocks, 1, [&](int64_t lo, int64_t hi) {
    ForwardScratch<T> w(d.D);
    for (int64_t unit = lo; unit < hi; ++unit) {
      const int64_t bh = unit / blocks, t0 = unit % blocks * kBlockQ, b = bh / d.H, h = bh % d.H;
      forward_block(d, scale, vis[static_cast<size_t>(b)], drop, q, k, v, out, lse + bh * d.T, b, h, t0,
                    std::min(kBlockQ, d.T - t0), stream, w);
    }
    stream_fence();
  });
}

// ---------------------------------------------------------------- backward

// Scratch of one backward task: the key block's k and v transposed, the block pair's P and
// dP (then dS), row-major [rows, kBlockK], the key block's dK and dV accumulators and the
// query block's LSE in the kernel's base.
template <typename T>
struct BackwardScratch {
  std::vector<T> kt, vt, p, ds, z, dk, dv, lse;
  explicit BackwardScratch(int64_t D)
      : kt(static_cast<size_t>(D * kBlockK)),
        vt(kt.size()),
        p(static_cast<size_t>(kBlockQ * kBlockK)),
        ds(p.size()),
        z(p.size()),
        dk(static_cast<size_t>(kBlockK * D)),
        dv(dk.size()),
        lse(kBlockQ) {}
};

struct BackwardArgs {
  bool dq = false, dk = false, dv = false;
  DropMask drop;
  bool stream = false;  // dK and dV stored past the caches (scaled_row)
};

// Key block [j0, j0 + bc) of kv head (b, kvh) against every query block of its group's heads,
// in order: dK and dV of the block (written once, at the end), dQ accumulated in place.
template <typename T>
void backward_key_block(const Dims& d, T scale, const Visible& vis, const Heads<T>& q, const Heads<T>& k,
                        const Heads<T>& v, const Heads<T>& dO, const T* lse, const T* delta, const Heads<T>& dq,
                        const Heads<T>& dk, const Heads<T>& dv, const BackwardArgs& want, int64_t b, int64_t kvh,
                        int64_t j0, BackwardScratch<T>& w) {
  const int64_t D = d.D, j1 = std::min(j0 + kBlockK, d.S), bc = j1 - j0;
  const bool need_ds = want.dq || want.dk;
  const T* kj = k.at(b, kvh) + j0 * k.ld;
  transpose_rows(kj, k.ld, bc, D, w.kt.data(), kBlockK);
  if (need_ds) transpose_rows(v.at(b, kvh) + j0 * v.ld, v.ld, bc, D, w.vt.data(), kBlockK);
  std::fill(w.dk.begin(), w.dk.end(), T(0));
  std::fill(w.dv.begin(), w.dv.end(), T(0));
  T* __restrict p = w.p.data();
  T* __restrict ds = w.ds.data();
  const T scale2 = scale * kLogBase<T>;  // the scores' scale in the kernel's base
  const bool drop = want.drop.on();
  T* __restrict z = w.z.data();  // the pair's dropout scales, laid out like P
  for (int64_t h = kvh * d.group(); h < (kvh + 1) * d.group(); ++h) {
    const T* lse_h = lse + (b * d.H + h) * d.T;
    const T* delta_h = delta + (b * d.H + h) * d.T;
    for (int64_t t0 = 0; t0 < d.T; t0 += kBlockQ) {
      const int64_t rows = std::min(kBlockQ, d.T - t0);
      const Overlap ov = overlap(vis, t0, rows, j0, j1);
      if (ov == Overlap::none) continue;
      const T* qi = q.at(b, h) + t0 * q.ld;
      const T* gi = dO.at(b, h) + t0 * dO.ld;
      T* dqi = want.dq ? dq.at(b, h) + t0 * dq.ld : nullptr;
      T* __restrict L = w.lse.data();  // the rows' LSE in the kernel's base
      for (int64_t r = 0; r < rows; ++r) L[r] = lse_h[t0 + r] * kLogBase<T>;
      if (drop) drop_scales(want.drop, b, h, t0, rows, j0, bc, z, kBlockK);
      if (ov == Overlap::full && drop) {
        // As below, with the dropped probabilities P ⊙ Z in dV's product and the scales on dP.
        kernels::small_gemm_ep<T>(rows, bc, D, qi, q.ld, 1, w.kt.data(), kBlockK, p, kBlockK, ExpShifted<T>{scale2, L});
        if (want.dv) {
          for (int64_t r = 0; r < rows; ++r)
            for (int64_t x = r * kBlockK; x < r * kBlockK + bc; ++x) ds[x] = p[x] * z[x];
          small_gemm<T>(bc, D, rows, T(1), ds, 1, kBlockK, gi, dO.ld, T(1), w.dv.data(), D);
        }
        if (!need_ds) continue;
        small_gemm<T>(rows, bc, D, T(1), gi, dO.ld, 1, w.vt.data(), kBlockK, T(0), ds, kBlockK);
        for (int64_t r = 0; r < rows; ++r) {
          const T dr = delta_h[t0 + r];
          for (int64_t x = r * kBlockK; x < r * kBlockK + bc; ++x) ds[x] = p[x] * (z[x] * ds[x] - dr);
        }
        if (want.dq) small_gemm<T>(rows, D, bc, scale, ds, kBlockK, 1, kj, k.ld, T(1), dqi, dq.ld);
        if (want.dk) small_gemm<T>(bc, D, rows, scale, ds, 1, kBlockK, qi, q.ld, T(1), w.dk.data(), D);
        continue;
      }
      if (ov == Overlap::full) {
        // P[rows, bc] = e^(q[rows, D] @ kt[D, bc] · scale - LSE), the exponentials in the
        // product's epilogue
        kernels::small_gemm_ep<T>(rows, bc, D, qi, q.ld, 1, w.kt.data(), kBlockK, p, kBlockK, ExpShifted<T>{scale2, L});
        // dV[bc, D] += P^T[bc, rows] @ dO[rows, D]
        if (want.dv) small_gemm<T>(bc, D, rows, T(1), p, 1, kBlockK, gi, dO.ld, T(1), w.dv.data(), D);
        if (!need_ds) continue;
        // dS[rows, bc] = P ⊙ (dO[rows, D] @ vt[D, bc] - D), in the product's epilogue
        kernels::small_gemm_ep<T>(rows, bc, D, gi, dO.ld, 1, w.vt.data(), kBlockK, ds, kBlockK,
                                  ProbsTimesShifted<T>{p, kBlockK, delta_h + t0});
        // dQ[rows, D] += dS[rows, bc] @ k[bc, D] · scale
        if (want.dq) small_gemm<T>(rows, D, bc, scale, ds, kBlockK, 1, kj, k.ld, T(1), dqi, dq.ld);
        // dK[bc, D] += dS^T[bc, rows] @ q[rows, D] · scale
        if (want.dk) small_gemm<T>(bc, D, rows, scale, ds, 1, kBlockK, qi, q.ld, T(1), w.dk.data(), D);
        continue;
      }
      // A partial pair, the same products by strips: those with rows of queries (s, dP, dQ)
      // over the keys the strip sees, those with rows of keys (dV, dK) over the queries that
      // see the strip. P and dS are written whole (0 where masked), so what a strip reads
      // outside another strip's span is 0.
      std::array<Span, kBlockQ / kStrip> seen;    // keys seen by each strip of queries
      std::array<Span, kBlockK / kStrip> seeing;  // queries seeing each strip of keys
      for (int64_t r0 = 0, i = 0; r0 < rows; r0 += kStrip, ++i)
        seen[static_cast<size_t>(i)] = keys_seen(vis, t0, r0, std::min(rows, r0 + kStrip), j0, bc);
      for (int64_t c0 = 0, i = 0; c0 < bc; c0 += kStrip, ++i)
        seeing[static_cast<size_t>(i)] = rows_seeing(vis, t0, rows, j0, c0, std::min(bc, c0 + kStrip));
      for (int64_t r0 = 0, i = 0; r0 < rows; r0 += kStrip, ++i) {
        const Span c = seen[static_cast<size_t>(i)];
        if (c.size() > 0)
          small_gemm<T>(std::min(kStrip, rows - r0), c.size(), D, scale2, qi + r0 * q.ld, q.ld, 1, w.kt.data() + c.lo,
                        kBlockK, T(0), p + r0 * kBlockK + c.lo, kBlockK);
      }
      for (int64_t r = 0; r < rows; ++r)
        exp_shifted_within(p + r * kBlockK, L[r], bc, vis.lo[static_cast<size_t>(t0 + r)] - j0,
                           vis.hi[static_cast<size_t>(t0 + r)] - j0);
      // dV's product reads the dropped probabilities P ⊙ Z (in ds until dS overwrites it).
      const T* pd = p;
      if (drop && want.dv) {
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t x = r * kBlockK; x < r * kBlockK + bc; ++x) ds[x] = p[x] * z[x];
        pd = ds;
      }
      if (want.dv)
        for (int64_t c0 = 0, i = 0; c0 < bc; c0 += kStrip, ++i) {
          const Span r = seeing[static_cast<size_t>(i)];
          if (r.size() > 0)
            small_gemm<T>(std::min(kStrip, bc - c0), D, r.size(), T(1), pd + r.lo * kBlockK + c0, 1, kBlockK,
                          gi + r.lo * dO.ld, dO.ld, T(1), w.dv.data() + c0 * D, D);
        }
      if (!need_ds) continue;
      for (int64_t r0 = 0, i = 0; r0 < rows; r0 += kStrip, ++i) {
        const Span c = seen[static_cast<size_t>(i)];
        const int64_t r1 = std::min(rows, r0 + kStrip);
        if (c.size() > 0)
          small_gemm<T>(r1 - r0, c.size(), D, T(1), gi + r0 * dO.ld, dO.ld, 1, w.vt.data() + c.lo, kBlockK, T(0),
                        ds + r0 * kBlockK + c.lo, kBlockK);
        for (int64_t r = r0; r < r1; ++r) {
          const T dr = delta_h[t0 + r];
          T* __restrict drow = ds + r * kBlockK;
          const T* __restrict prow = p + r * kBlockK;
          if (drop) {
            const T* __restrict zrow = z + r * kBlockK;
            for (int64_t x = 0; x < bc; ++x)
              drow[x] = x >= c.lo && x < c.hi ? prow[x] * (zrow[x] * drow[x] - dr) : T(0);
            continue;
          }
          for (int64_t x = 0; x < bc; ++x) drow[x] = x >= c.lo && x < c.hi ? prow[x] * (drow[x] - dr) : T(0);
        }
        if (want.dq && c.size() > 0)
          small_gemm<T>(r1 - r0, D, c.size(), scale, ds + r0 * kBlockK + c.lo, kBlockK, 1, kj + c.lo * k.ld, k.ld, T(1),
                        dqi + r0 * dq.ld, dq.ld);
      }
      if (want.dk)
        for (int64_t c0 = 0, i = 0; c0 < bc; c0 += kStrip, ++i) {
          const Span r = seeing[static_cast<size_t>(i)];
          if (r.size() > 0)
            small_gemm<T>(std::min(kStrip, bc - c0), D, r.size(), scale, ds + r.lo * kBlockK + c0, 1, kBlockK,
                          qi + r.lo * q.ld, q.ld, T(1), w.dk.data() + c0 * D, D);
        }
    }
  }
  for (int64_t c = 0; c < bc; ++c) {
    if (want.dk) scaled_row(w.dk.data() + c * D, D, T(1), dk.at(b, kvh) + (j0 + c) * dk.ld, want.stream);
    if (want.dv) scaled_row(w.dv.data() + c * D, D, T(1), dv.at(b, kvh) + (j0 + c) * dv.ld, want.stream);
  }
}

template <typename T>
void sdpa_backward_t(const Dims& d, T scale, const std::vector<Visible>& vis, const Heads<T>& q, const Heads<T>& k,
                     const Heads<T>& v, const Heads<T>& out, const T* lse, const Heads<T>& dO, T* delta,
                     const Heads<T>& dq, const Heads<T>& dk, const Heads<T>& dv, const BackwardArgs& want) {
  const int64_t key_blocks = (d.S + kBlockK - 1) / kBlockK;
  parallel_for(0, d.B * d.Hkv, 1, [&](int64_t lo, int64_t hi) {
    BackwardScratch<T> w(d.D);
    for (int64_t unit = lo; unit < hi; ++unit) {
      const int64_t b = unit / d.Hkv, kvh = unit % d.Hkv;
      // delta[b, h, t] = rowsum(dO ⊙ O), and dQ zeroed for the accumulation, for the group's
      // heads — here rather than in a pass of their own, so that the key blocks' products
      // find dO and dQ of these heads still in cache.
      for (int64_t h = kvh * d.group(); h < (kvh + 1) * d.group(); ++h)
        for (int64_t t = 0; t < d.T; ++t) {
          delta[(b * d.H + h) * d.T + t] = dot(dO.at(b, h) + t * dO.ld, out.at(b, h) + t * out.ld, d.D);
          if (want.dq) std::fill_n(dq.at(b, h) + t * dq.ld, d.D, T(0));
        }
      for (int64_t kb = 0; kb < key_blocks; ++kb)
        backward_key_block(d, scale, vis[static_cast<size_t>(b)], q, k, v, dO, lse, delta, dq, dk, dv, want, b, kvh,
                           kb * kBlockK, w);
    }
    stream_fence();
  });
}

}  // namespace

// A new [B, H, T, D] tensor laid out as [B, T, H, D] in memory, so that the usual
// permute-and-merge of heads after attention is a view, not a copy.
Tensor heads_major(int64_t B, int64_t H, int64_t T, int64_t D, DType dtype) {
  Tensor buf = Tensor::empty({B, T, H, D}, dtype);
  return view::permute(buf, {0, 2, 1, 3});
}

void forward(const Dims& d, double scale, bool causal, const Tensor& docs, const DropMask& drop, const Tensor& q,
             const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse) {
  const std::vector<Visible> vis = all_visible(d, causal, docs);
  TESSEL_DISPATCH_FLOAT(q.dtype(), "sdpa", [&]<typename T>() {
    Tensor kq, kk, kv, ko;
    Heads<T> hq = heads_of<T>(q, kq), hk = heads_of<T>(k, kk), hv = heads_of<T>(v, kv);
    sdpa_forward_t<T>(d, static_cast<T>(scale), vis, drop, hq, hk, hv, heads_of<T>(out, ko), lse.data<T>());
  });
}

void backward(const Dims& d, double scale, bool causal, const Tensor& docs, const DropMask& drop, const Tensor& q,
              const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse, const Tensor& dout,
              const Tensor& dq, const Tensor& dk, const Tensor& dv) {
  const std::vector<Visible> vis = all_visible(d, causal, docs);
  const Tensor l = kernels::contig(lse);
  Tensor delta = Tensor::empty({d.B, d.H, d.T}, q.dtype());  // rowsum(dO ⊙ O)
  TESSEL_DISPATCH_FLOAT(q.dtype(), "sdpa", [&]<typename T>() {
    Tensor keep[8];
    Heads<T> hq = heads_of<T>(q, keep[0]), hk = heads_of<T>(k, keep[1]), hv = heads_of<T>(v, keep[2]),
             hdo = heads_of<T>(dout, keep[3]), ho = heads_of<T>(out, keep[4]);
    Heads<T> gq, gk, gv;
    if (dq.defined()) gq = heads_of<T>(dq, keep[5]);
    if (dk.defined()) gk = heads_of<T>(dk, keep[6]);
    if (dv.defined()) gv = heads_of<T>(dv, keep[7]);
    sdpa_backward_t<T>(d, static_cast<T>(scale), vis, hq, hk, hv, ho, l.data<T>(), hdo, delta.data<T>(), gq, gk, gv,
                       BackwardArgs{dq.defined(), dk.defined(), dv.defined(), drop, streamed<T>(d.B, d.Hkv, d.S, d.D)});
  });
}

}  // namespace tessel::attention_kernel
