// The comm conformance suite.
#include "conformance.h"

#include <cstring>
#include <functional>
#include <numeric>

#include "tessel/core/convert.h"
#include "tessel/core/error.h"

namespace tessel::testing {

namespace {

// A small integer per (rank, index, salt): exactly representable in every dtype, so sums,
// products and extrema are exact and the expected result is computed locally.
int64_t value(int rank, int64_t i, int salt, ReduceOp op) {
  if (op == ReduceOp::prod) return 1 + ((rank + i + salt) % 2);  // 1 or 2: no overflow
  return ((rank + 1) * 7 + i * 3 + salt) % 11 - 3;                // -3..7
}

int64_t reduce_values(int64_t a, int64_t b, ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
    case ReduceOp::avg: return a + b;
    case ReduceOp::max: return std::max(a, b);
    case ReduceOp::min: return std::min(a, b);
    case ReduceOp::prod: return a * b;
  }
  return 0;
}

// Byte buffer of `n` elements of `dtype` set from integers.
struct Buf {
  DType dtype;
  std::vector<char> bytes;
  Buf(DType d, int64_t n) : dtype(d), bytes(static_cast<size_t>(n) * dtype_size(d), 0) {}
  void* data() { return bytes.data(); }
  int64_t size() const { return static_cast<int64_t>(bytes.size() / dtype_size(dtype)); }
  void set(int64_t i, double v) {
    TESSEL_DISPATCH_ALL(dtype, "buf", [&]<typename T>() { reinterpret_cast<T*>(bytes.data())[i] = convert_value<T>(v); });
  }
  double get(int64_t i) const {
    return TESSEL_DISPATCH_ALL(dtype, "buf", [&]<typename T>() {
      return convert_value<double>(reinterpret_cast<const T*>(bytes.data())[i]);
    });
  }
};

double as_dtype(double v, DType d) {  // what v becomes in dtype d (bool: nonzero)
  if (d == DType::b8) return v != 0 ? 1 : 0;
  return v;
}

void expect_eq(double got, double want, const std::string& what, int64_t i) {
  TESSEL_CHECK(got == want, "conformance: {} element {}: got {}, expected {}", what, i, got, want);
}

void check_all_reduce(ProcessGroup& g) {
  for (DType d : kAllDTypes)
    for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg, ReduceOp::max, ReduceOp::min, ReduceOp::prod}) {
      if (d == DType::b8 && op == ReduceOp::avg) continue;
      for (int64_t n : {1, 7, 1001}) {
        Buf b(d, n);
        for (int64_t i = 0; i < n; ++i) b.set(i, value(g.rank(), i, 1, op));
        g.all_reduce(b.data(), n, d, op);
        for (int64_t i = 0; i < n; ++i) {
          if (d == DType::b8) {
            bool any = false, all = true;
            for (int r = 0; r < g.size(); ++r) {
              bool v = value(r, i, 1, op) != 0;
              any = any || v;
              all = all && v;
            }
            bool want = (op == ReduceOp::sum || op == ReduceOp::max) ? any : all;
            expect_eq(b.get(i), want ? 1 : 0, fmt::format("all_reduce {} {} n={}", dtype_name(d), reduce_op_name(op), n), i);
            continue;
          }
          int64_t acc = value(0, i, 1, op);
          for (int r = 1; r < g.size(); ++r) acc = reduce_values(acc, value(r, i, 1, op), op);
          double want = static_cast<double>(acc);
          if (op == ReduceOp::avg) {
            want = is_integral(d) ? static_cast<double>(acc / g.size()) : static_cast<double>(acc) / g.size();
            if (d == DType::bf16) want = static_cast<double>(static_cast<float>(BFloat16(static_cast<float>(want))));
            if (d == DType::f32) want = static_cast<double>(static_cast<float>(want));
          }
          expect_eq(b.get(i), want, fmt::format("all_reduce {} {} n={}", dtype_name(d), reduce_op_name(op), n), i);
        }
      }
    }
}

void check_rooted(ProcessGroup& g) {
  for (DType d : {DType::f32, DType::i64, DType::bf16, DType::b8})
    for (int root : {0, g.size() - 1}) {
      const int64_t n = 13;
      // broadcast
      Buf b(d, n);
      for (int64_t i = 0; i < n; ++i) b.set(i, g.rank() == root ? value(root, i, 2, ReduceOp::sum) : 99);
      g.broadcast(b.data(), n, d, root);
      for (int64_t i = 0; i < n; ++i) expect_eq(b.get(i), as_dtype(value(root, i, 2, ReduceOp::sum), d), "broadcast", i);
      // reduce (sum) to root; non-roots keep their input
      if (d != DType::b8) {
        Buf r(d, n);
        for (int64_t i = 0; i < n; ++i) r.set(i, value(g.rank(), i, 3, ReduceOp::sum));
        g.reduce(r.data(), n, d, ReduceOp::sum, root);
        for (int64_t i = 0; i < n; ++i) {
          int64_t want = 0;
          for (int k = 0; k < g.size(); ++k) want += value(k, i, 3, ReduceOp::sum);
          expect_eq(r.get(i), g.rank() == root ? static_cast<double>(want) : value(g.rank(), i, 3, ReduceOp::sum), "reduce",
                    i);
        }
      }
      // gather and scatter
      Buf in(d, n), out(d, n * g.size());
      for (int64_t i = 0; i < n; ++i) in.set(i, value(g.rank(), i, 4, ReduceOp::sum));
      g.gather(in.data(), out.data(), n, d, root);
      if (g.rank() == root)
        for (int r = 0; r < g.size(); ++r)
          for (int64_t i = 0; i < n; ++i) expect_eq(out.get(r * n + i), as_dtype(value(r, i, 4, ReduceOp::sum), d), "gather", r * n + i);
      Buf all(d, n * g.size()), mine(d, n);
      if (g.rank() == root)
        for (int r = 0; r < g.size(); ++r)
          for (int64_t i = 0; i < n; ++i) all.set(r * n + i, value(r, i, 5, ReduceOp::sum));
      g.scatter(all.data(), mine.data(), n, d, root);
      for (int64_t i = 0; i < n; ++i) expect_eq(mine.get(i), as_dtype(value(g.rank(), i, 5, ReduceOp::sum), d), "scatter", i);
    }
}

// Per-rank sizes that differ, including zero.
std::vector<int64_t> uneven(int size, int salt) {
  std::vector<int64_t> c(static_cast<size_t>(size));
  for (int r = 0; r < size; ++r) c[static_cast<size_t>(r)] = (r * 5 + salt) % 7;
  return c;
}

void check_gathers_and_scatters(ProcessGroup& g) {
  const int P = g.size(), me = g.rank();
  for (DType d : {DType::f64, DType::i32, DType::bf16}) {
    // all_gather, equal counts (odd)
    const int64_t n = 9;
    Buf in(d, n), out(d, n * P);
    for (int64_t i = 0; i < n; ++i) in.set(i, value(me, i, 6, ReduceOp::sum));
    g.all_gather(in.data(), out.data(), n, d);
    for (int r = 0; r < P; ++r)
      for (int64_t i = 0; i < n; ++i) expect_eq(out.get(r * n + i), value(r, i, 6, ReduceOp::sum), "all_gather", r * n + i);
    // all_gather_v
    std::vector<int64_t> c = uneven(P, 1);
    int64_t total = std::accumulate(c.begin(), c.end(), int64_t{0});
    Buf vin(d, std::max<int64_t>(c[static_cast<size_t>(me)], 1)), vout(d, std::max<int64_t>(total, 1));
    for (int64_t i = 0; i < c[static_cast<size_t>(me)]; ++i) vin.set(i, value(me, i, 7, ReduceOp::sum));
    g.all_gather_v(vin.data(), vout.data(), c, d);
    for (int r = 0, at = 0; r < P; at += static_cast<int>(c[static_cast<size_t>(r)]), ++r)
      for (int64_t i = 0; i < c[static_cast<size_t>(r)]; ++i) expect_eq(vout.get(at + i), value(r, i, 7, ReduceOp::sum), "all_gather_v", at + i);
    // reduce_scatter, equal counts
    Buf rin(d, n * P), rout(d, n);
    for (int64_t i = 0; i < n * P; ++i) rin.set(i, value(me, i, 8, ReduceOp::sum));
    g.reduce_scatter(rin.data(), rout.data(), n, d, ReduceOp::sum);
    for (int64_t i = 0; i < n; ++i) {
      int64_t want = 0;
      for (int r = 0; r < P; ++r) want += value(r, me * n + i, 8, ReduceOp::sum);
      expect_eq(rout.get(i), static_cast<double>(want), "reduce_scatter", i);
    }
    // reduce_scatter_v with max
    Buf vrin(d, std::max<int64_t>(total, 1)), vrout(d, std::max<int64_t>(c[static_cast<size_t>(me)], 1));
    for (int64_t i = 0; i < total; ++i) vrin.set(i, value(me, i, 9, ReduceOp::max));
    g.reduce_scatter_v(vrin.data(), vrout.data(), c, d, ReduceOp::max);
    int64_t off = 0;
    for (int r = 0; r < me; ++r) off += c[static_cast<size_t>(r)];
    for (int64_t i = 0; i < c[static_cast<size_t>(me)]; ++i) {
      int64_t want = value(0, off + i, 9, ReduceOp::max);
      for (int r = 1; r < P; ++r) want = std::max(want, value(r, off + i, 9, ReduceOp::max));
      expect_eq(vrout.get(i), static_cast<double>(want), "reduce_scatter_v", i);
    }
    // The row forms: rank r's block is columns [Σ_{q<r} c[q], +c[r]) of every one of 3 rows.
    const int64_t rows = 3;
    Buf gin(d, std::max<int64_t>(rows * c[static_cast<size_t>(me)], 1)), gout(d, std::max<int64_t>(rows * total, 1));
    for (int64_t i = 0; i < rows * c[static_cast<size_t>(me)]; ++i) gin.set(i, value(me, i, 10, ReduceOp::sum));
    g.all_gather_v(gin.data(), gout.data(), c, d, rows);
    for (int64_t row = 0; row < rows; ++row)
      for (int r = 0, at = 0; r < P; at += static_cast<int>(c[static_cast<size_t>(r)]), ++r)
        for (int64_t i = 0; i < c[static_cast<size_t>(r)]; ++i)
          expect_eq(gout.get(row * total + at + i), value(r, row * c[static_cast<size_t>(r)] + i, 10, ReduceOp::sum),
                    "all_gather_v with rows", row * total + at + i);
    Buf sin(d, std::max<int64_t>(rows * total, 1)), sout(d, std::max<int64_t>(rows * c[static_cast<size_t>(me)], 1));
    for (int64_t i = 0; i < rows * total; ++i) sin.set(i, value(me, i, 11, ReduceOp::sum));
    g.reduce_scatter_v(sin.data(), sout.data(), c, d, ReduceOp::sum, rows);
    for (int64_t row = 0; row < rows; ++row)
      for (int64_t i = 0; i < c[static_cast<size_t>(me)]; ++i) {
        int64_t want = 0;
        for (int r = 0; r < P; ++r) want += value(r, row * total + off + i, 11, ReduceOp::sum);
        const int64_t at = row * c[static_cast<size_t>(me)] + i;
        expect_eq(sout.get(at), static_cast<double>(want), "reduce_scatter_v with rows", at);
      }
    // all_to_all: element i of the block for rank r encodes (me, r, i)
    const int64_t k = 3;
    Buf ain(d, k * P), aout(d, k * P);
    for (int r = 0; r < P; ++r)
      for (int64_t i = 0; i < k; ++i) ain.set(r * k + i, me * 10 + r + i * 50 % 7);
    g.all_to_all(ain.data(), aout.data(), k, d);
    for (int r = 0; r < P; ++r)
      for (int64_t i = 0; i < k; ++i) expect_eq(aout.get(r * k + i), as_dtype(r * 10 + me + i * 50 % 7, d), "all_to_all", r * k + i);
    // all_to_all_v: rank a sends (a + b) % 4 elements to rank b
    std::vector<int64_t> sc(static_cast<size_t>(P)), rc(static_cast<size_t>(P));
    for (int r = 0; r < P; ++r) {
      sc[static_cast<size_t>(r)] = (me + r) % 4;
      rc[static_cast<size_t>(r)] = (r + me) % 4;
    }
    int64_t st = std::accumulate(sc.begin(), sc.end(), int64_t{0}), rt = std::accumulate(rc.begin(), rc.end(), int64_t{0});
    Buf vi(d, std::max<int64_t>(st, 1)), vo(d, std::max<int64_t>(rt, 1));
    for (int r = 0, at = 0; r < P; at += static_cast<int>(sc[static_cast<size_t>(r)]), ++r)
      for (int64_t i = 0; i < sc[static_cast<size_t>(r)]; ++i) vi.set(at + i, me * 10 + r + i);
    g.all_to_all_v(vi.data(), sc, vo.data(), rc, d);
    for (int r = 0, at = 0; r < P; at += static_cast<int>(rc[static_cast<size_t>(r)]), ++r)
      for (int64_t i = 0; i < rc[static_cast<size_t>(r)]; ++i) expect_eq(vo.get(at + i), r * 10 + me + i, "all_to_all_v", at + i);
  }
}

void check_point_to_point(ProcessGroup& g) {
  const int P = g.size(), me = g.rank();
  if (P == 1) return;
  // A ring with two tags in flight at once, posted asynchronously in opposite orders.
  const int64_t n = 1001;
  std::vector<int64_t> out_a(n), out_b(n), in_a(n), in_b(n);
  for (int64_t i = 0; i < n; ++i) {
    out_a[static_cast<size_t>(i)] = me * 100000 + i;
    out_b[static_cast<size_t>(i)] = -(me * 100000 + i);
  }
  int next = (me + 1) % P, prev = (me + P - 1) % P;
  auto rb = g.recv_async(in_b.data(), n, DType::i64, prev, 2);
  auto sa = g.send_async(out_a.data(), n, DType::i64, next, 1);
  auto ra = g.recv_async(in_a.data(), n, DType::i64, prev, 1);
  auto sb = g.send_async(out_b.data(), n, DType::i64, next, 2);
  for (auto& w : {sa, sb, ra, rb}) w->wait();
  for (int64_t i = 0; i < n; ++i) {
    expect_eq(static_cast<double>(in_a[static_cast<size_t>(i)]), static_cast<double>(prev * 100000 + i), "send/recv tag 1", i);
    expect_eq(static_cast<double>(in_b[static_cast<size_t>(i)]), static_cast<double>(-(prev * 100000 + i)), "send/recv tag 2", i);
  }
  g.barrier();
}

void check_async_overlap(ProcessGroup& g) {
  // Several collectives in flight on one group, completed in issue order.
  const int64_t n = 257;
  std::vector<std::vector<float>> bufs(4, std::vector<float>(n));
  std::vector<WorkPtr> works;
  for (int k = 0; k < 4; ++k) {
    for (int64_t i = 0; i < n; ++i) bufs[static_cast<size_t>(k)][static_cast<size_t>(i)] = static_cast<float>(g.rank() + k + i % 3);
    works.push_back(g.all_reduce_async(bufs[static_cast<size_t>(k)].data(), n, DType::f32, ReduceOp::sum));
  }
  for (auto& w : works) w->wait();
  for (int k = 0; k < 4; ++k)
    for (int64_t i = 0; i < n; ++i) {
      double want = 0;
      for (int r = 0; r < g.size(); ++r) want += r + k + i % 3;
      expect_eq(bufs[static_cast<size_t>(k)][static_cast<size_t>(i)], want, "async all_reduce", i);
    }
  TESSEL_CHECK(works.back()->is_completed(), "conformance: a waited work reports not completed");
}

void check_subgroups(ProcessGroup& g) {
  const int P = g.size(), me = g.rank();
  // Even and odd ranks, made with one split; then a group of rank 0 alone.
  std::vector<int> even, odd;
  for (int r = 0; r < P; ++r) (r % 2 ? odd : even).push_back(r);
  std::vector<std::vector<int>> sets{even};
  if (!odd.empty()) sets.push_back(odd);
  auto mine = g.split(sets);
  TESSEL_CHECK(mine != nullptr, "conformance: split gave no group to rank {}", me);
  const std::vector<int>& members = me % 2 ? odd : even;
  TESSEL_CHECK(mine->size() == static_cast<int>(members.size()), "conformance: sub-group size {} != {}", mine->size(), members.size());
  int64_t v = me + 1;
  mine->all_reduce(&v, 1, DType::i64, ReduceOp::sum);
  int64_t want = 0;
  for (int r : members) want += r + 1;
  expect_eq(static_cast<double>(v), static_cast<double>(want), "sub-group all_reduce", 0);
  auto solo = g.new_group({0});
  TESSEL_CHECK((solo != nullptr) == (me == 0), "conformance: new_group({{0}}) membership wrong on rank {}", me);
  // Mesh groups on a 2-D shape when the size factors.
  if (P % 2 == 0 && P >= 4) {
    auto dims = g.mesh_groups({2, P / 2});
    int64_t a = me, b = me;
    dims[0]->all_reduce(&a, 1, DType::i64, ReduceOp::sum);  // along dim 0: me and me ± P/2
    dims[1]->all_reduce(&b, 1, DType::i64, ReduceOp::max);  // along dim 1: the row
    int row = me / (P / 2), col = me % (P / 2);
    expect_eq(static_cast<double>(a), static_cast<double>(col + (col + P / 2)), "mesh dim 0 all_reduce", 0);
    expect_eq(static_cast<double>(b), static_cast<double>(row * (P / 2) + P / 2 - 1), "mesh dim 1 all_reduce", 0);
    // Two groups in flight at once.
    std::vector<double> x(64, me), y(64, 1.0);
    auto w0 = dims[0]->all_reduce_async(x.data(), 64, DType::f64, ReduceOp::max);
    auto w1 = dims[1]->all_reduce_async(y.data(), 64, DType::f64, ReduceOp::sum);
    w1->wait();
    w0->wait();
    expect_eq(y[5], P / 2, "concurrent groups", 5);
    expect_eq(x[5], std::max(me, (me + P / 2) % P), "concurrent groups", 5);
  }
}

// A byte of the segment rank `src` sends rank `dst` (its byte `i`): a hash, so a segment that
// lands in the wrong place or with a neighbour's bytes cannot match by accident.
char a2a_byte(int src, int dst, int64_t i) {
  uint64_t x = (static_cast<uint64_t>(src) << 40) ^ (static_cast<uint64_t>(dst) << 20) ^ static_cast<uint64_t>(i);
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 29;
  return static_cast<char>(x);
}

// all_to_all_v with send counts `counts(src, dst)` under the group's current algorithm; checks
// every received byte and returns the output.
std::vector<char> a2a_checked(ProcessGroup& g, DType d, const std::function<int64_t(int, int)>& counts, bool equal,
                              const std::string& what) {
  const int P = g.size(), me = g.rank();
  const int64_t esz = static_cast<int64_t>(dtype_size(d));
  std::vector<int64_t> sc(static_cast<size_t>(P)), rc(static_cast<size_t>(P));
  for (int r = 0; r < P; ++r) {
    sc[static_cast<size_t>(r)] = counts(me, r);
    rc[static_cast<size_t>(r)] = counts(r, me);
  }
  const int64_t st = std::accumulate(sc.begin(), sc.end(), int64_t{0}), rt = std::accumulate(rc.begin(), rc.end(), int64_t{0});
  std::vector<char> in(static_cast<size_t>(std::max<int64_t>(st, 1) * esz)), out(static_cast<size_t>(std::max<int64_t>(rt, 1) * esz), 0);
  for (int r = 0, at = 0; r < P; at += static_cast<int>(sc[static_cast<size_t>(r)] * esz), ++r)
    for (int64_t i = 0; i < sc[static_cast<size_t>(r)] * esz; ++i) in[static_cast<size_t>(at + i)] = a2a_byte(me, r, i);
  if (equal) g.all_to_all(in.data(), out.data(), sc[0], d);
  else g.all_to_all_v(in.data(), sc, out.data(), rc, d);
  for (int r = 0, at = 0; r < P; at += static_cast<int>(rc[static_cast<size_t>(r)] * esz), ++r)
    for (int64_t i = 0; i < rc[static_cast<size_t>(r)] * esz; ++i)
      TESSEL_CHECK(out[static_cast<size_t>(at + i)] == a2a_byte(r, me, i),
                   "conformance: {} ({} all_to_all, {}): byte {} of the segment from rank {} is wrong", what,
                   all_to_all_algorithm_name(g.all_to_all_algorithm()), dtype_name(d), i, r);
  return out;
}

// On a group over several nodes: the hierarchical all_to_all is the default, and it and the
// flat one give the same bytes for equal counts, uneven counts with zeros, a rank that
// receives nothing, nothing at all, and segments of tens of kilobytes.
void check_all_to_all_algorithms(ProcessGroup& g) {
  if (!g.hierarchical()) {
    TESSEL_CHECK(!g.all_to_all_hierarchical(), "conformance: a one-node group reports a hierarchical all_to_all");
    return;
  }
  TESSEL_CHECK(g.all_to_all_hierarchical(), "conformance: group over nodes [{}] does not choose the hierarchical "
               "all_to_all", fmt::join(g.nodes(), ", "));
  const int P = g.size();
  struct Case {
    const char* name;
    std::function<int64_t(int, int)> counts;
    bool equal;
  };
  const std::vector<Case> cases = {
      {"equal counts", [](int, int) { return int64_t{5}; }, true},
      {"uneven counts with zeros", [](int a, int b) { return int64_t{(a * 3 + b * 5) % 7}; }, false},
      {"rank 1 receives nothing", [](int, int b) { return b == 1 ? int64_t{0} : int64_t{3 + b}; }, false},
      {"nothing at all", [](int, int) { return int64_t{0}; }, false},
      {"large segments", [P](int a, int b) { return int64_t{20000 + 97 * ((a + 2 * b) % P)}; }, false},
  };
  const AllToAllAlgorithm before = g.all_to_all_algorithm();
  for (DType d : {DType::b8, DType::bf16, DType::i32, DType::f64})
    for (const Case& c : cases) {
      g.set_all_to_all_algorithm(AllToAllAlgorithm::flat);
      std::vector<char> flat = a2a_checked(g, d, c.counts, c.equal, c.name);
      g.set_all_to_all_algorithm(AllToAllAlgorithm::hierarchical);
      std::vector<char> hier = a2a_checked(g, d, c.counts, c.equal, c.name);
      TESSEL_CHECK(flat == hier, "conformance: {} ({}): the hierarchical all_to_all's bytes differ from the flat one's",
                   c.name, dtype_name(d));
    }
  // Asynchronous calls of both algorithms queued together complete in issue order.
  std::vector<std::vector<int64_t>> ins(4), outs(4);
  std::vector<WorkPtr> works;
  for (int k = 0; k < 4; ++k) {
    g.set_all_to_all_algorithm(k % 2 ? AllToAllAlgorithm::flat : AllToAllAlgorithm::hierarchical);
    ins[static_cast<size_t>(k)].resize(static_cast<size_t>(3 * P));
    outs[static_cast<size_t>(k)].assign(static_cast<size_t>(3 * P), -1);
    for (int i = 0; i < 3 * P; ++i) ins[static_cast<size_t>(k)][static_cast<size_t>(i)] = k * 100000 + g.rank() * 1000 + i;
    works.push_back(g.all_to_all_async(ins[static_cast<size_t>(k)].data(), outs[static_cast<size_t>(k)].data(), 3, DType::i64));
  }
  for (auto& w : works) w->wait();
  for (int k = 0; k < 4; ++k)
    for (int r = 0; r < P; ++r)
      for (int i = 0; i < 3; ++i)
        expect_eq(static_cast<double>(outs[static_cast<size_t>(k)][static_cast<size_t>(r * 3 + i)]),
                  static_cast<double>(k * 100000 + r * 1000 + g.rank() * 3 + i), "queued all_to_all", r * 3 + i);
  g.set_all_to_all_algorithm(before);
}

}  // namespace

void run_conformance(ProcessGroup& g) {
  check_all_reduce(g);
  check_rooted(g);
  check_gathers_and_scatters(g);
  check_point_to_point(g);
  check_async_overlap(g);
  check_subgroups(g);
  check_all_to_all_algorithms(g);
  g.barrier();
}

}  // namespace tessel::testing
