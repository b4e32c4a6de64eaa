// Scaled dot-product attention, fused and memory-efficient (FlashAttention, Dao et al. 2022;
// the backward's loop order of FlashAttention-2): no [T, S] matrix is ever held. The forward
// walks key blocks for each block of queries with an online softmax — a running max m and
// running sum l per query row, the output accumulator rescaled by e^(m_old - m_new) when the
// max grows — and keeps only out and the per-row log-sum-exp LSE = m + log l [B, H, T] for
// the backward. The backward rebuilds each block of probabilities from q, k and LSE
// (P = e^(s - LSE)), with D = rowsum(dO ⊙ O) computed once per row. So the memory between
// forward and backward is linear in the sequence, and selective recompute (the attribute
// recompute_probs) has nothing left to drop: the attribute is accepted and ignored.
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
// Dropout on the probabilities (GPT-2's attn_pdrop; attribute "dropout" p): after the softmax,
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
#include "tessel/ops/attention.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <optional>
#include <type_traits>

#include "tessel/core/philox.h"
#include "tessel/ops/attention_tiles.h"
#include "tessel/ops/dispatch.h"
#include "tessel/ops/fast_math.h"
#include "tessel/ops/kernel_util.h"
#include "tessel/ops/op_list.h"
#include "tessel/ops/small_gemm.h"
#include "tessel/sharding/spmd_rules.h"

namespace tessel {

using kernels::small_gemm;
using namespace attention_tiles;

namespace {

// q0 and k0: the global positions of query 0 and key 0 (the op: S - T and 0, aligned at the
// bottom right; ring attention's blocks: where their chunks sit in the whole sequence), and
// `total` the positions the document starts index (the op: S).
struct Dims {
  int64_t B, H, Hkv, T, S, D;
  int64_t q0 = 0, k0 = 0, total = 0;
  int64_t group() const { return H / Hkv; }
};

Dims dims_of(const Shape& q, const Shape& k) {
  return Dims{q[0], q[1], k[1], q[2], k[2], q[3], k[2] - q[2], 0, k[2]};
}

// The dropout of one call: where its q sits in the global [B, H, T, S] tensor of
// probabilities (batch row b0, head h0 of `heads`, query q0 of `queries`, key k0 of `keys`)
// and the Philox stream. Off when p is 0.
struct DropMask {
  uint64_t seed = 0, stream = 0;
  uint32_t threshold = 0;  // a word below it drops
  double keep_scale = 1.0;
  int64_t b0 = 0, h0 = 0, heads = 0, q0 = 0, queries = 0, k0 = 0, keys = 0;
  bool on() const { return threshold > 0; }
};

DropMask drop_mask(const SdpaDropout& dr, const Dims& d, int64_t b0, int64_t h0, int64_t heads) {
  DropMask m;
  TESSEL_CHECK(dr.p >= 0.0 && dr.p < 1.0, "sdpa: attention dropout p={} must be in [0, 1)", dr.p);
  m.threshold = static_cast<uint32_t>(std::min(dr.p * 4294967296.0, 4294967295.0));
  m.keep_scale = 1.0 / (1.0 - dr.p);
  m.seed = dr.seed;
  m.stream = dr.stream;
  m.b0 = dr.row0 + b0;
  m.h0 = h0;
  m.heads = heads > 0 ? heads : d.H;
  m.queries = d.T;
  m.keys = d.S;
  return m;
}

// The op's dropout attributes: p, seed, stream and row0 from the caller, b0, h0 and heads
// (the piece's place among the global batch rows and heads) from the SPMD rule.
DropMask drop_mask_of(const Attrs& a, const Dims& d) {
  if (!a.has("dropout") || a.f("dropout") == 0.0) return {};
  const SdpaDropout dr{a.f("dropout"), static_cast<uint64_t>(a.i("seed")), static_cast<uint64_t>(a.i("stream")),
                       a.i("row0")};
  auto get = [&](const char* key) { return a.has(key) ? a.i(key) : 0; };
  return drop_mask(dr, d, get("b0"), get("h0"), get("heads"));
}

double scale_of(const Attrs& attrs, int64_t D) {
  double s = attrs.f("scale");
  return s != 0.0 ? s : 1.0 / std::sqrt(static_cast<double>(std::max<int64_t>(D, 1)));
}

// Block sizes: a block of queries against a block of keys, each operand of the pair's
// products small enough to stay in L1/L2 (64×64 f32 scores are 16 KiB). bench/attention_bench
// at T = 1k and 4k measured 32, 96 and 128 for either (forward and backward apart) within
// the noise of 64; smaller blocks skip more of the causal triangle, larger ones make fewer calls.
constexpr int64_t kBlockQ = 64;
constexpr int64_t kBlockK = 64;

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

std::vector<TensorMeta> sdpa_infer(const MetaCall& c) {
  TESSEL_CHECK(c.inputs.size() == 3 || c.inputs.size() == 4,
               "sdpa: expected q, k, v and optionally the document starts, got {} inputs", c.inputs.size());
  for (size_t i = 0; i < 3; ++i) {
    kernels::check_floating(c, i);
    kernels::check_same_dtype(c, 0, i);
    kernels::check_ndim(c, i, 4);
  }
  const Shape& q = c.inputs[0].shape;
  const Shape& k = c.inputs[1].shape;
  const Shape& v = c.inputs[2].shape;
  TESSEL_CHECK(k == v, "sdpa: k {} and v {} must have one shape [B, Hkv, S, D]", shape_str(k), shape_str(v));
  TESSEL_CHECK(q[0] == k[0], "sdpa: batch differs: q {} has B={} but k {} has B={}", shape_str(q), q[0], shape_str(k),
               k[0]);
  TESSEL_CHECK(q[3] == k[3], "sdpa: head dim differs: q {} has D={} but k {} has D={}", shape_str(q), q[3],
               shape_str(k), k[3]);
  TESSEL_CHECK(k[1] > 0 && q[1] % k[1] == 0,
               "sdpa: query heads H={} (q {}) must be a multiple of kv heads Hkv={} (k {})", q[1], shape_str(q), k[1],
               shape_str(k));
  if (c.inputs.size() == 4) {
    const TensorMeta& docs = c.inputs[3];
    TESSEL_CHECK(docs.dtype == DType::i64, "sdpa: document starts must be i64, got {}", dtype_name(docs.dtype));
    TESSEL_CHECK(docs.shape.size() == 2 && docs.shape[0] == q[0] && docs.shape[1] >= 1,
                 "sdpa: document starts must be [B, N] with B={} (q {}) and N >= 1, got {}", q[0], shape_str(q),
                 shape_str(docs.shape));
  }
  DType dt = c.inputs[0].dtype;
  return {TensorMeta{q, dt, {}}, TensorMeta{{q[0], q[1], q[2]}, dt, {}}};
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

// A [B, H, T, D] operand as BLAS reads it: head (b, h) starts at base + b·sb + h·sh and its
// T rows are `ld` apart with D contiguous. Views such as a permuted [B, T, H, D] projection
// are read in place; only layouts with a strided D are copied.
template <typename T>
struct Heads {
  T* base = nullptr;
  int64_t sb = 0, sh = 0, ld = 0;
  T* at(int64_t b, int64_t h) const { return base + b * sb + h * sh; }
};

template <typename T>
Heads<T> heads_of(const Tensor& t, Tensor& keep) {
  const int64_t D = t.size(3), rows = t.size(2);
  bool direct = (t.stride(3) == 1 || D <= 1) && (rows <= 1 || t.stride(2) >= std::max<int64_t>(D, 1));
  keep = direct ? t : view::contiguous(t);
  int64_t ld = rows <= 1 ? std::max<int64_t>(D, 1) : keep.stride(2);
  return Heads<T>{keep.data<T>(), keep.stride(0), keep.stride(1), ld};
}

// A new [B, H, T, D] tensor laid out as [B, T, H, D] in memory, so that the usual
// permute-and-merge of heads after attention is a view, not a copy.
Tensor heads_major(int64_t B, int64_t H, int64_t T, int64_t D, DType dtype) {
  Tensor buf = Tensor::empty({B, T, H, D}, dtype);
  return view::permute(buf, {0, 2, 1, 3});
}

// The document starts as a contiguous i64 tensor, or undefined without documents.
Tensor docs_of(std::span<const Tensor> inputs) {
  return inputs.size() == 4 ? kernels::contig(inputs[3]) : Tensor();
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
                   int64_t rows, ForwardScratch<T>& w) {
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
  const int64_t first = vis.lo[static_cast<size_t>(t0)] / kBlockK * kBlockK;
  const int64_t last = vis.hi[static_cast<size_t>(t0 + rows - 1)];
  for (int64_t j0 = first; j0 < last; j0 += kBlockK) {
    const int64_t j1 = std::min(j0 + kBlockK, d.S), bc = j1 - j0;
    const Overlap ov = overlap(vis, t0, rows, j0, j1);
    if (ov == Overlap::none) continue;
    // st[bc, rows] = k[j0:j1, D] @ qt[D, rows] · scale, in the kernel's base (scale2); a
    // partial pair by strips of keys
    const T* kj = k.at(b, kvh) + j0 * k.ld;
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
      const int64_t* lo = vis.lo.data() + t0;
      const int64_t* hi = vis.hi.data() + t0;
      for (int64_t c = 0; c < bc; ++c) {
        T* __restrict row = st + c * kBlockQ;
        for (int64_t r = 0; r < rows; ++r) row[r] = j0 + c >= lo[r] && j0 + c < hi[r] ? row[r] : kNegInf;
      }
    }
    // The running max grows to cover this block; alpha = e^(m_old - m_new) rescales what came
    // before.
    if (ov == Overlap::full) online_softmax<T, true>(st, kBlockQ, bc, rows, m, l, base, alpha);
    else online_softmax<T>(st, kBlockQ, bc, rows, m, l, base, alpha);
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
    if (ov == Overlap::full) {
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
  }
  T* o = out.at(b, h) + t0 * out.ld;
  for (int64_t r = 0; r < rows; ++r) {
    const T inv = l[r] > T(0) ? T(1) / l[r] : T(0);
    for (int64_t e = 0; e < D; ++e) o[r * out.ld + e] = w.acc[static_cast<size_t>(r * D + e)] * inv;
    lse[t0 + r] = lse_of(m[r], l[r]);
  }
}

template <typename T>
void sdpa_forward_t(const Dims& d, T scale, const std::vector<Visible>& vis, const DropMask& drop, const Heads<T>& q,
                    const Heads<T>& k, const Heads<T>& v, const Heads<T>& out, T* lse) {
  const int64_t blocks = (d.T + kBlockQ - 1) / kBlockQ;
  parallel_for(0, d.B * d.H * blocks, 1, [&](int64_t lo, int64_t hi) {
    ForwardScratch<T> w(d.D);
    for (int64_t unit = lo; unit < hi; ++unit) {
      const int64_t bh = unit / blocks, t0 = unit % blocks * kBlockQ, b = bh / d.H, h = bh % d.H;
      forward_block(d, scale, vis[static_cast<size_t>(b)], drop, q, k, v, out, lse + bh * d.T, b, h, t0,
                    std::min(kBlockQ, d.T - t0), w);
    }
  });
}

std::vector<Tensor> sdpa_forward(const OpCall& c) {
  Dims d = dims_of(c.inputs[0].shape(), c.inputs[1].shape());
  const bool causal = c.attrs.b("causal");
  double scale = scale_of(c.attrs, d.D);
  Tensor out = heads_major(d.B, d.H, d.T, d.D, c.outputs[0].dtype);
  Tensor lse = Tensor::empty(c.outputs[1]);
  const std::vector<Visible> vis = all_visible(d, causal, docs_of(c.inputs));
  TESSEL_DISPATCH_FLOAT(c.inputs[0].dtype(), "sdpa", [&]<typename T>() {
    Tensor kq, kk, kv, ko;
    Heads<T> q = heads_of<T>(c.inputs[0], kq), k = heads_of<T>(c.inputs[1], kk), v = heads_of<T>(c.inputs[2], kv);
    sdpa_forward_t<T>(d, static_cast<T>(scale), vis, drop_mask_of(c.attrs, d), q, k, v, heads_of<T>(out, ko),
                      lse.data<T>());
  });
  return {out, lse};
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
      std::array<Span, kBlockQ / kStrip> seen;  // keys seen by each strip of queries
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
    if (want.dk) std::copy_n(w.dk.data() + c * D, D, dk.at(b, kvh) + (j0 + c) * dk.ld);
    if (want.dv) std::copy_n(w.dv.data() + c * D, D, dv.at(b, kvh) + (j0 + c) * dv.ld);
  }
}

template <typename T>
void sdpa_backward_t(const Dims& d, T scale, const std::vector<Visible>& vis, const Heads<T>& q, const Heads<T>& k,
                     const Heads<T>& v, const Heads<T>& out, const T* lse, const Heads<T>& dO, T* delta,
                     const Heads<T>& dq, const Heads<T>& dk, const Heads<T>& dv, const BackwardArgs& want) {
  // delta[b, h, t] = rowsum(dO ⊙ O), and dQ zeroed for the accumulation, per (b, h).
  parallel_for(0, d.B * d.H, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t bh = lo; bh < hi; ++bh) {
      const int64_t b = bh / d.H, h = bh % d.H;
      for (int64_t t = 0; t < d.T; ++t) {
        const T* g = dO.at(b, h) + t * dO.ld;
        const T* o = out.at(b, h) + t * out.ld;
        delta[bh * d.T + t] = dot(g, o, d.D);
        if (want.dq) std::fill_n(dq.at(b, h) + t * dq.ld, d.D, T(0));
      }
    }
  });
  const int64_t key_blocks = (d.S + kBlockK - 1) / kBlockK;
  parallel_for(0, d.B * d.Hkv, 1, [&](int64_t lo, int64_t hi) {
    BackwardScratch<T> w(d.D);
    for (int64_t unit = lo; unit < hi; ++unit) {
      const int64_t b = unit / d.Hkv, kvh = unit % d.Hkv;
      for (int64_t kb = 0; kb < key_blocks; ++kb)
        backward_key_block(d, scale, vis[static_cast<size_t>(b)], q, k, v, dO, lse, delta, dq, dk, dv, want, b, kvh,
                           kb * kBlockK, w);
    }
  });
}

// When q, k and v are the heads of one fused projection — views of one buffer whose rows
// hold q's heads, k's and v's side by side, `row` elements apart — dq, dk and dv are laid out
// the same way in one new buffer, so split's backward joins them into the projection's
// gradient without a copy. Empty when they are not (separate projections, or q, k and v one
// tensor as in a test).
std::optional<std::array<Tensor, 3>> grads_like_fused_inputs(const GradCall& c) {
  // (sdpa_infer has checked that the three share B and the dtype.)
  const Tensor& q = c.inputs[0];
  if (!(c.needs_grad[0] && c.needs_grad[1] && c.needs_grad[2]) || q.numel() == 0) return std::nullopt;
  const int64_t row = q.stride(2), batch = q.stride(0);
  int64_t lo = q.offset();
  for (size_t i = 0; i < 3; ++i) {
    const Tensor& t = c.inputs[i];
    bool packed = t.storage() == q.storage() && t.numel() > 0 && t.stride(3) == 1 && t.stride(1) == t.size(3) &&
                  t.stride(2) == row && t.stride(0) == batch && t.size(2) * row <= batch;
    if (!packed) return std::nullopt;
    lo = std::min(lo, t.offset());
  }
  // Each tensor's columns within a row, [col, col + H·D): they must fit the row and not overlap.
  std::array<std::pair<int64_t, int64_t>, 3> cols;
  for (size_t i = 0; i < 3; ++i) {
    const Tensor& t = c.inputs[i];
    const int64_t col = t.offset() - lo, width = t.size(1) * t.size(3);
    if (col + width > row) return std::nullopt;
    cols[i] = {col, col + width};
  }
  std::sort(cols.begin(), cols.end());
  if (cols[0].second > cols[1].first || cols[1].second > cols[2].first) return std::nullopt;
  Tensor buf = Tensor::empty({q.size(0) * batch}, q.dtype());
  std::array<Tensor, 3> out;
  for (size_t i = 0; i < 3; ++i) {
    const Tensor& t = c.inputs[i];
    out[i] = view::as_strided(buf, t.shape(), t.strides(), t.offset() - lo);
  }
  return out;
}

std::vector<Tensor> sdpa_backward(const GradCall& c) {
  Dims d = dims_of(c.input_metas[0].shape, c.input_metas[1].shape);
  double scale = scale_of(c.attrs, d.D);
  DType dt = c.input_metas[0].dtype;
  Tensor dq, dk, dv;
  if (auto fused = grads_like_fused_inputs(c)) {
    dq = (*fused)[0];
    dk = (*fused)[1];
    dv = (*fused)[2];
  } else {
    // A contiguous input gets a contiguous gradient: the autograd engine keeps it as the
    // leaf's gradient as it is (a heads-major one it would copy, 3 × 32 MiB per call at
    // bench/attention_bench's shapes); any other layout gets the heads-major one, which the
    // usual [B, T, H, D] view of a projection takes back without a copy.
    auto grad_like = [&](size_t i, int64_t heads, int64_t rows) {
      if (!c.needs_grad[i]) return Tensor();
      if (c.inputs[i].is_contiguous()) return Tensor::empty({d.B, heads, rows, d.D}, dt);
      return heads_major(d.B, heads, rows, d.D, dt);
    };
    dq = grad_like(0, d.H, d.T);
    dk = grad_like(1, d.Hkv, d.S);
    dv = grad_like(2, d.Hkv, d.S);
  }
  const std::vector<Visible> vis = all_visible(d, c.attrs.b("causal"), docs_of(c.inputs));
  Tensor lse = kernels::contig(c.outputs[1]);
  Tensor delta = Tensor::empty({d.B, d.H, d.T}, dt);  // rowsum(dO ⊙ O)
  TESSEL_DISPATCH_FLOAT(dt, "sdpa", [&]<typename T>() {
    Tensor keep[8];
    Heads<T> q = heads_of<T>(c.inputs[0], keep[0]), k = heads_of<T>(c.inputs[1], keep[1]),
             v = heads_of<T>(c.inputs[2], keep[2]), dO = heads_of<T>(c.grad_outputs[0], keep[3]),
             out = heads_of<T>(c.outputs[0], keep[4]);
    Heads<T> hq, hk, hv;
    if (dq.defined()) hq = heads_of<T>(dq, keep[5]);
    if (dk.defined()) hk = heads_of<T>(dk, keep[6]);
    if (dv.defined()) hv = heads_of<T>(dv, keep[7]);
    sdpa_backward_t<T>(d, static_cast<T>(scale), vis, q, k, v, out, lse.data<T>(), dO, delta.data<T>(), hq, hk, hv,
                       BackwardArgs{dq.defined(), dk.defined(), dv.defined(), drop_mask_of(c.attrs, d)});
  });
  if (c.inputs.size() == 4) return {dq, dk, dv, Tensor()};
  return {dq, dk, dv};
}

// Two gemms of 2·T·S·D each per (b, h): 4·B·H·T·S·D, the full count even when causal or
// masked by documents (the model-FLOPs convention), plus ~5 per score for the softmax. The
// kernel computes only the blocks some query sees (about half when causal); an efficiency
// measured against this count, as `tessel cluster detect` does, absorbs that.
Cost sdpa_cost(const MetaCall& c, std::span<const TensorMeta> out) {
  Dims d = dims_of(c.inputs[0].shape, c.inputs[1].shape);
  double scores = static_cast<double>(d.B * d.H) * static_cast<double>(d.T * d.S);
  return Cost{4.0 * scores * static_cast<double>(d.D) + 5.0 * scores, kernels::io_bytes(c, out)};
}

// ---------------------------------------------------------------- SPMD rule
// q "bh..", k and v "bh..", docs "b." -> out "bh.." (and LSE "bh." alike, computed on each
// rank's pieces): the batch may be sharded (q, k, v and the document starts alike), and so
// may the heads — q's H and k/v's Hkv over the same mesh dims — when every rank's pieces keep
// the grouping: its query heads [h0, h0 + Hl) are exactly the groups of its kv heads
// [g0, g0 + Gl) (h0 = g0·G, Hl = Gl·G, G = H / Hkv) and it has a kv head at all. Uneven
// splits can break that (H=6, Hkv=3 over 2 ranks: kv [2, 1] but q [3, 3]); then heads stay
// whole. T, S and D are always whole; Partial inputs are reduced first (nonlinear).

bool heads_keep_groups(const SpmdCall& c, const SpmdDecision& d) {
  const Shape& q = c.inputs[0].shape;
  const Shape& k = c.inputs[1].shape;
  bool sharded = false;
  for (const Placement& p : d.inputs[0]) sharded = sharded || p.is_shard(1);
  if (!sharded) return true;
  if (k[1] <= 0 || q[1] % k[1] != 0) return false;  // infer rejects it
  const int64_t G = q[1] / k[1];
  const DistAttr qa(c.mesh(), d.inputs[0]), ka(c.mesh(), d.inputs[1]);
  for (int64_t r : c.mesh().process_ids()) {
    const int64_t h0 = qa.local_offset(q, r)[1], hl = qa.local_shape(q, r)[1];
    const int64_t g0 = ka.local_offset(k, r)[1], gl = ka.local_shape(k, r)[1];
    if (gl == 0 || h0 != g0 * G || hl != gl * G) return false;
  }
  return true;
}

// Batch and heads as above, for a call whose sequence is whole.
SpmdDecision sdpa_batch_heads(const SpmdCall& c) {
  const bool docs = c.inputs.size() == 4;
  auto labels = [docs](std::string qkv) {
    std::vector<std::string> in(3, qkv);
    if (docs) in.push_back(qkv.substr(0, 1) + ".");
    return in;
  };
  spmd::LabelRule r{labels("bh.."), "bh..", spmd::Linearity::none};
  SpmdDecision d = spmd::label_rule(c, r);
  if (heads_keep_groups(c, d)) return d;
  r = spmd::LabelRule{labels("b..."), "b...", spmd::Linearity::none};
  return spmd::label_rule(c, r);
}

// Context parallel: with the attribute "cp" (set by the model's layers under parallel.cp), the
// mesh dim named cp, when it splits q's sequence (T, dim 2), keeps it split, by the method it names
// (docs/attention.md); without it the sequence is gathered, as before:
//   ring                q, k, v "bhT." over that dim, out alike — the dist layer's ring
//                       attention (custom: key/value blocks pass around the dim's ranks). The
//                       attribute also says how the sequence is held: in the load-balanced
//                       order (rank r of n holds chunks r and 2n-1-r of 2n), as the data loader
//                       lays the tokens out for it; on one rank that is the natural order;
//   all_to_all          q, k, v and out "bH..": the reshard S(2) -> S(1) (an all_to_all over the
//                       dim) before the local kernel, which then sees whole sequences of fewer
//                       heads; the caller reshards the output back.
// The other mesh dims are decided as if the sequence were whole; the document starts are
// replicated over the sequence dims.
// With dropout the kernel draws each probability's mask at its global index: the local call
// gets the global batch row and head of its piece of q, and the global head count.
SpmdDecision with_drop_offsets(const SpmdCall& c, SpmdDecision d) {
  if (!c.attrs.has("dropout") || c.attrs.f("dropout") == 0.0) return d;
  const Shape& q = c.inputs[0].shape;
  const Shape at = DistAttr(c.mesh(), d.inputs[0]).local_offset(q, c.rank);
  Attrs a = c.attrs;
  a.set("b0", at[0]).set("h0", at[1]).set("heads", q[1]);
  d.local_attrs = a;
  return d;
}

SpmdDecision sdpa_spmd_placements(const SpmdCall& c);

SpmdDecision sdpa_spmd(const SpmdCall& c) {
  SpmdDecision d = sdpa_spmd_placements(c);
  return d.custom ? d : with_drop_offsets(c, std::move(d));
}

SpmdDecision sdpa_spmd_placements(const SpmdCall& c) {
  const Placements all_r = spmd::replicated(c);
  const bool docs = c.inputs.size() == 4;
  bool well_formed = c.inputs.size() == 3 || (docs && c.inputs[3].shape.size() == 2);
  for (size_t i = 0; i < 3 && i < c.inputs.size(); ++i) well_formed = well_formed && c.inputs[i].shape.size() == 4;
  if (!well_formed)  // infer rejects it
    return SpmdDecision{std::vector<Placements>(c.inputs.size(), all_r), {all_r}};
  // Only the mesh dim named cp: the loader lays the sequence out for it (the ring's order), and
  // a rule that put the sequence on another dim (dp, when a batch of one cannot be split over
  // it) leaves it in the natural order there, which the whole-sequence kernel then sees.
  std::vector<size_t> seq_dims;
  const Placements& qp = c.input_attrs[0].placements;
  const int64_t cp = c.attrs.has("cp") ? c.mesh().find_dim("cp") : -1;
  if (cp >= 0 && qp[static_cast<size_t>(cp)].is_shard(2) && c.mesh().dim_size(cp) > 1)
    seq_dims.push_back(static_cast<size_t>(cp));
  if (seq_dims.empty()) return sdpa_batch_heads(c);
  std::vector<DistAttr> whole(c.input_attrs.begin(), c.input_attrs.end());
  for (DistAttr& a : whole)
    for (size_t m : seq_dims) a.placements[m] = Replicate();
  const SpmdCall rest{c.op, c.inputs, whole, c.attrs, c.rank};
  SpmdDecision d = sdpa_batch_heads(rest);
  const std::string& method = c.attrs.s("cp");
  TESSEL_CHECK(method == "ring" || method == "all_to_all",
               "sdpa: context-parallel method (attribute cp) must be ring or all_to_all, got '{}'", method);
  const int64_t split = method == "ring" ? 2 : 1;
  for (size_t m : seq_dims) {
    for (size_t i = 0; i < 3; ++i) d.inputs[i][m] = Shard(split);
    d.outputs[0][m] = Shard(split);
  }
  if (method == "all_to_all") {
    TESSEL_CHECK(heads_keep_groups(c, d),
                 "sdpa: context parallel all_to_all splits the heads of q {} and k {} over the sequence's mesh dims "
                 "too, and their pieces do not keep whole query groups (H / Hkv) with a kv head each; use ring",
                 shape_str(c.inputs[0].shape), shape_str(c.inputs[1].shape));
    return d;
  }
  TESSEL_CHECK(seq_dims.size() == 1, "sdpa: ring attention splits the sequence over one mesh dim, got {} ({})",
               seq_dims.size(), placements_str(qp));
  d.custom = true;
  return d;
}

}  // namespace

// Hidden output 1: the log-sum-exp LSE [B, H, T] of each query's scores, saved with q, k, v,
// the document starts and out.
const OpDef op_sdpa{.name = "sdpa", .num_inputs = -1, .num_hidden = 1, .infer = sdpa_infer, .forward = sdpa_forward,
                    .backward = sdpa_backward, .cost = sdpa_cost, .spmd = sdpa_spmd, .save = {0b1111, 0b11}};

Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, double scale,
                                    bool /*recompute_probs: nothing quadratic is kept to drop*/) {
  return call_op1(op_sdpa, {q, k, v}, Attrs{{"causal", causal}, {"scale", scale}});
}

Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& doc_starts,
                                    bool causal, double scale, std::string_view cp_method, const SdpaDropout& dropout) {
  Attrs attrs{{"causal", causal}, {"scale", scale}};
  if (!cp_method.empty()) attrs.set("cp", std::string(cp_method));
  if (dropout.p != 0.0) {
    TESSEL_CHECK(dropout.p > 0.0 && dropout.p < 1.0, "sdpa: attention dropout p={} must be in [0, 1)", dropout.p);
    attrs.set("dropout", dropout.p)
        .set("seed", static_cast<int64_t>(dropout.seed))
        .set("stream", static_cast<int64_t>(dropout.stream))
        .set("row0", dropout.row0);
  }
  if (!doc_starts.defined()) return call_op1(op_sdpa, {q, k, v}, attrs);
  return call_op1(op_sdpa, {q, k, v, doc_starts}, attrs);
}

namespace {
Dims block_dims(const Tensor& q, const Tensor& k, const SdpaBlockPlace& at) {
  TESSEL_CHECK(q.dim() == 4 && k.dim() == 4 && q.size(0) == k.size(0) && q.size(3) == k.size(3) && k.size(1) > 0 &&
                   q.size(1) % k.size(1) == 0,
               "sdpa block: q {} and k {} must be [B, H, T, D] and [B, Hkv, S, D] with H a multiple of Hkv", q.str(),
               k.str());
  Dims d = dims_of(q.shape(), k.shape());
  d.q0 = at.q0;
  d.k0 = at.k0;
  d.total = at.total;
  return d;
}

// A block's dropout: its queries and keys at their global positions of a sequence of `total`.
DropMask block_drop(const SdpaBlockPlace& at, const Dims& d) {
  if (at.dropout.p == 0.0) return {};
  DropMask m = drop_mask(at.dropout, d, at.b0, at.h0, at.heads);
  m.q0 = at.q0;
  m.k0 = at.k0;
  m.queries = m.keys = at.total;
  return m;
}
}  // namespace

std::array<Tensor, 2> sdpa_block_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& doc_starts,
                                         bool causal, double scale, const SdpaBlockPlace& at) {
  const Dims d = block_dims(q, k, at);
  const double s = scale != 0.0 ? scale : 1.0 / std::sqrt(static_cast<double>(std::max<int64_t>(d.D, 1)));
  Tensor out = heads_major(d.B, d.H, d.T, d.D, q.dtype());
  Tensor lse = Tensor::empty({d.B, d.H, d.T}, q.dtype());
  const std::vector<Visible> vis =
      all_visible(d, causal, doc_starts.defined() ? kernels::contig(doc_starts) : Tensor());
  TESSEL_DISPATCH_FLOAT(q.dtype(), "sdpa", [&]<typename T>() {
    Tensor kq, kk, kv, ko;
    Heads<T> hq = heads_of<T>(q, kq), hk = heads_of<T>(k, kk), hv = heads_of<T>(v, kv);
    sdpa_forward_t<T>(d, static_cast<T>(s), vis, block_drop(at, d), hq, hk, hv, heads_of<T>(out, ko), lse.data<T>());
  });
  return {out, lse};
}

std::array<Tensor, 3> sdpa_block_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                                          const Tensor& lse, const Tensor& dout, const Tensor& doc_starts, bool causal,
                                          double scale, const SdpaBlockPlace& at) {
  const Dims d = block_dims(q, k, at);
  const double s = scale != 0.0 ? scale : 1.0 / std::sqrt(static_cast<double>(std::max<int64_t>(d.D, 1)));
  const DType dt = q.dtype();
  Tensor dq = heads_major(d.B, d.H, d.T, d.D, dt), dk = heads_major(d.B, d.Hkv, d.S, d.D, dt),
         dv = heads_major(d.B, d.Hkv, d.S, d.D, dt);
  const std::vector<Visible> vis =
      all_visible(d, causal, doc_starts.defined() ? kernels::contig(doc_starts) : Tensor());
  Tensor l = kernels::contig(lse);
  Tensor delta = Tensor::empty({d.B, d.H, d.T}, dt);
  TESSEL_DISPATCH_FLOAT(dt, "sdpa", [&]<typename T>() {
    Tensor keep[8];
    Heads<T> hq = heads_of<T>(q, keep[0]), hk = heads_of<T>(k, keep[1]), hv = heads_of<T>(v, keep[2]),
             hdo = heads_of<T>(dout, keep[3]), ho = heads_of<T>(out, keep[4]);
    Heads<T> gq = heads_of<T>(dq, keep[5]), gk = heads_of<T>(dk, keep[6]), gv = heads_of<T>(dv, keep[7]);
    sdpa_backward_t<T>(d, static_cast<T>(s), vis, hq, hk, hv, ho, l.data<T>(), hdo, delta.data<T>(), gq, gk, gv,
                       BackwardArgs{true, true, true, block_drop(at, d)});
  });
  return {dq, dk, dv};
}

}  // namespace tessel
