// Reshard planning (Dijkstra over placement lists) and execution (local moves, collectives
// along mesh dims, send/recv between meshes).
#include "tessel/dist/reshard.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <queue>

#include "tessel/comm/world.h"
#include "tessel/core/context.h"
#include "tessel/core/error.h"
#include "tessel/core/philox.h"
#include "tessel/core/view.h"
#include "tessel/dist/mesh_comm.h"
#include "tessel/sharding/spmd_rules.h"

namespace tessel {

// ---------------------------------------------------------------- printing

std::string ReshardStep::name() const {
  switch (kind) {
    case Kind::slice: return "slice";
    case Kind::to_partial: return "to_partial";
    case Kind::all_gather: return "all_gather";
    case Kind::all_to_all: return "all_to_all";
    case Kind::all_reduce: return "all_reduce";
    case Kind::reduce_scatter: return "reduce_scatter";
    case Kind::send_recv: return "send_recv";
  }
  return "?";
}

int64_t ReshardPlan::bytes_for(int64_t rank) const {
  int64_t n = 0;
  for (const ReshardStep& s : steps) {
    auto it = s.bytes.find(rank);
    if (it != s.bytes.end()) n += it->second;
  }
  return n;
}

int64_t ReshardPlan::max_bytes() const {
  std::map<int64_t, int64_t> per;
  for (const ReshardStep& s : steps)
    for (const auto& [r, b] : s.bytes) per[r] += b;
  int64_t m = 0;
  for (const auto& [r, b] : per) m = std::max(m, b);
  return m;
}

std::string ReshardPlan::str() const {
  std::string out = fmt::format("reshard {} {} : {} -> {}\n", dtype, shape_str(shape), src.str(), dst.str());
  if (steps.empty()) return out + "  (no steps: the layouts are the same)\n";
  for (const ReshardStep& s : steps) {
    const ProcessMesh& mesh = s.dst_mesh ? dst.mesh : src.mesh;
    std::string where = s.mesh_dim >= 0
                            ? fmt::format("mesh dim {} '{}' ({} ranks)", s.mesh_dim, mesh.dim_names()[static_cast<size_t>(s.mesh_dim)],
                                          mesh.dim_size(s.mesh_dim))
                            : fmt::format("{} -> {}", src.mesh.str(), dst.mesh.str());
    std::string dims;
    if (s.kind == ReshardStep::Kind::all_to_all) dims = fmt::format(", tensor dim {} -> {}", s.tensor_dim, s.tensor_dim2);
    else if (s.tensor_dim >= 0) dims = fmt::format(", tensor dim {}", s.tensor_dim);
    if (s.kind == ReshardStep::Kind::all_reduce || s.kind == ReshardStep::Kind::reduce_scatter)
      dims += fmt::format(", {}", s.reduce);
    int64_t lo = std::numeric_limits<int64_t>::max(), hi = 0;
    for (const auto& [r, b] : s.bytes) {
      lo = std::min(lo, b);
      hi = std::max(hi, b);
    }
    std::string bytes = !s.communicates() ? "no communication"
                        : s.bytes.empty() ? "0 B"
                        : lo == hi         ? fmt::format("{} B per rank", hi)
                                           : fmt::format("{}-{} B per rank", lo, hi);
    if (s.kind == ReshardStep::Kind::send_recv)
      out += fmt::format("  {} on {}: {}\n", s.name(), where, bytes);
    else
      out += fmt::format("  {} on {}{}: {} -> {}, {}\n", s.name(), where, dims, placements_str(s.before),
                         placements_str(s.after), bytes);
  }
  out += fmt::format("  total: {} B for the busiest rank\n", max_bytes());
  return out;
}

// ---------------------------------------------------------------- planning

namespace {

bool shards_after(const Placements& p, int64_t m, int64_t d) {
  for (size_t i = static_cast<size_t>(m) + 1; i < p.size(); ++i)
    if (p[i].is_shard(d)) return true;
  return false;
}

// The move of mesh dim m from p[m] to q, or nullopt when illegal.
std::optional<ReshardStep::Kind> move_kind(const Placements& p, int64_t m, const Placement& q) {
  const Placement& cur = p[static_cast<size_t>(m)];
  if (cur == q) return std::nullopt;
  if (cur.is_shard() && shards_after(p, m, cur.dim)) return std::nullopt;
  if (q.is_shard() && shards_after(p, m, q.dim)) return std::nullopt;
  using K = ReshardStep::Kind;
  if (cur.is_replicate()) return q.is_shard() ? K::slice : K::to_partial;
  if (cur.is_shard()) {
    if (q.is_replicate()) return K::all_gather;
    if (q.is_shard()) return K::all_to_all;
    return K::to_partial;
  }
  // Partial
  if (q.is_replicate()) return K::all_reduce;
  if (q.is_shard()) return K::reduce_scatter;
  return std::nullopt;  // Partial -> another Partial goes through Replicate
}

double move_cost(const Placements& p, int64_t m, const Placement& q, const DistAttr& attr, const Shape& shape, DType dtype) {
  // Data held along this mesh dim's group: the tensor divided by the other mesh dims' shards.
  double numel = static_cast<double>(shape_numel(shape));
  for (size_t i = 0; i < p.size(); ++i)
    if (static_cast<int64_t>(i) != m && p[i].is_shard()) numel /= static_cast<double>(attr.mesh.dim_size(static_cast<int64_t>(i)));
  TensorMeta meta{Shape{static_cast<int64_t>(std::ceil(numel))}, dtype, {}};
  double c = spmd::transition_cost(meta, p[static_cast<size_t>(m)], q, attr.mesh.dim_size(m));
  ReshardStep::Kind k = *move_kind(p, m, q);
  bool comm = k != ReshardStep::Kind::slice && k != ReshardStep::Kind::to_partial && attr.mesh.dim_size(m) > 1;
  return c + (comm ? 4096.0 : 1e-3);  // a collective's latency, in byte-equivalents; local steps nearly free
}

void fill_bytes(ReshardStep& s, const ProcessMesh& mesh, const Shape& shape, DType dtype) {
  if (!s.communicates() || mesh.dim_size(s.mesh_dim) == 1) {
    if (s.communicates())
      for (int64_t r : mesh.process_ids()) s.bytes[r] = 0;
    return;
  }
  DistAttr before(mesh, s.before);
  for (int64_t r : mesh.process_ids())
    s.bytes[r] = shape_numel(before.local_shape(shape, r)) * static_cast<int64_t>(dtype_size(dtype));
}

// Cheapest move sequences on src's mesh from src's placements (Dijkstra over placement lists,
// keyed by placements_str). Stops once `goal` is settled; without one it settles every list
// reachable through R, S(d) and src's own Partial kinds.
struct Moves {
  std::map<std::string, double> cost;
  std::map<std::string, std::pair<std::string, ReshardStep>> came_from;
  std::map<std::string, Placements> lists;
};

Moves search_moves(const DistAttr& src, const Placements* goal, const Shape& shape, DType dtype) {
  const int64_t M = src.mesh.ndim();
  // Candidate placements for any mesh dim: R, S(d) for every tensor dim, and the Partial kinds
  // of the two ends.
  std::vector<Placement> options{Replicate()};
  for (int64_t d = 0; d < static_cast<int64_t>(shape.size()); ++d) options.push_back(Shard(d));
  for (const Placements* ps : {&src.placements, goal})
    if (ps != nullptr)
      for (const Placement& p : *ps)
        if (p.is_partial() && std::find(options.begin(), options.end(), p) == options.end()) options.push_back(p);

  auto key = [](const Placements& p) { return placements_str(p); };
  Moves mv;
  using Item = std::pair<double, std::string>;
  std::priority_queue<Item, std::vector<Item>, std::greater<>> open;
  mv.cost[key(src.placements)] = 0;
  mv.lists[key(src.placements)] = src.placements;
  open.push({0, key(src.placements)});
  const std::string goal_key = goal != nullptr ? key(*goal) : "";
  while (!open.empty()) {
    auto [d, k] = open.top();
    open.pop();
    if (d > mv.cost[k]) continue;
    if (k == goal_key) break;
    const Placements p = mv.lists[k];
    for (int64_t m = 0; m < M; ++m)
      for (const Placement& q : options) {
        auto kind = move_kind(p, m, q);
        if (!kind) continue;
        Placements next = p;
        next[static_cast<size_t>(m)] = q;
        double nd = d + move_cost(p, m, q, src, shape, dtype);
        std::string nk = key(next);
        auto it = mv.cost.find(nk);
        if (it != mv.cost.end() && it->second <= nd) continue;
        mv.cost[nk] = nd;
        mv.lists[nk] = next;
        ReshardStep step{.kind = *kind, .mesh_dim = m, .before = Placements(p.begin(), p.end()),
                         .after = Placements(next.begin(), next.end())};
        const Placement& cur = p[static_cast<size_t>(m)];
        step.tensor_dim = cur.is_shard() ? cur.dim : (q.is_shard() ? q.dim : -1);
        if (step.kind == ReshardStep::Kind::all_to_all) step.tensor_dim2 = q.dim;
        if (step.kind == ReshardStep::Kind::reduce_scatter) step.tensor_dim = q.dim;
        step.reduce = cur.is_partial() ? cur.reduce : (q.is_partial() ? q.reduce : ReduceOp::sum);
        mv.came_from[nk] = {k, step};
        open.push({nd, nk});
      }
  }
  return mv;
}

// The steps of `mv` from src's placements to `goal` (settled), with their bytes.
std::vector<ReshardStep> steps_to(const Moves& mv, const DistAttr& src, const Placements& goal, const Shape& shape,
                                  DType dtype) {
  std::vector<ReshardStep> steps;
  const std::string start = placements_str(src.placements);
  for (std::string k = placements_str(goal); k != start; k = mv.came_from.at(k).first)
    steps.push_back(mv.came_from.at(k).second);
  std::reverse(steps.begin(), steps.end());
  for (ReshardStep& s : steps) fill_bytes(s, src.mesh, shape, dtype);
  return steps;
}

// An element's owner among replicas: the rank at coordinate 0 of every replicated mesh dim.
bool owns(const DistAttr& a, int64_t rank) {
  if (!a.mesh.contains(rank)) return false;
  std::vector<int64_t> c = a.mesh.coord(rank);
  for (size_t m = 0; m < a.placements.size(); ++m)
    if (a.placements[m].is_replicate() && c[m] != 0) return false;
  return true;
}

struct Box {
  Shape offset, shape;
  bool empty() const { return shape_numel(shape) == 0; }
};

Box box_of(const DistAttr& a, const Shape& shape, int64_t rank) { return Box{a.local_offset(shape, rank), a.local_shape(shape, rank)}; }

Box intersect(const Box& a, const Box& b) {
  Box r;
  for (size_t d = 0; d < a.offset.size(); ++d) {
    int64_t lo = std::max(a.offset[d], b.offset[d]);
    int64_t hi = std::min(a.offset[d] + a.shape[d], b.offset[d] + b.shape[d]);
    r.offset.push_back(lo);
    r.shape.push_back(std::max<int64_t>(0, hi - lo));
  }
  return r;
}

Placements drop_partial(const Placements& p) {
  Placements out = p;
  for (Placement& x : out)
    if (x.is_partial()) x = Replicate();
  return out;
}

// The send_recv that hands every owned piece of `from` to the ranks of `to` that need it, with
// the bytes each source rank sends.
ReshardStep pieces_to(const DistAttr& from, const DistAttr& to, const Shape& shape, DType dtype) {
  ReshardStep xfer;
  xfer.kind = ReshardStep::Kind::send_recv;
  xfer.before = from.placements;
  xfer.after = to.placements;
  for (int64_t s : from.mesh.process_ids()) {
    if (!owns(from, s)) continue;
    Box own = box_of(from, shape, s);
    int64_t sent = 0;
    for (int64_t d : to.mesh.process_ids()) {
      if (d == s) continue;
      sent += shape_numel(intersect(own, box_of(to, shape, d)).shape) * static_cast<int64_t>(dtype_size(dtype));
    }
    xfer.bytes[s] = sent;
  }
  return xfer;
}

}  // namespace

ReshardPlan plan_reshard(const DistAttr& src, const DistAttr& dst, const Shape& shape, DType dtype) {
  src.check(shape, "reshard source");
  dst.check(shape, "reshard destination");
  ReshardPlan plan{src, dst, shape, dtype, {}, 0};
  if (src.mesh == dst.mesh) {
    Moves mv = search_moves(src, &dst.placements, shape, dtype);
    auto it = mv.cost.find(placements_str(dst.placements));
    TESSEL_CHECK(it != mv.cost.end(), "reshard: no plan from {} to {} for shape {}", src.str(),
                 placements_str(dst.placements), shape_str(shape));
    plan.cost = it->second;
    plan.steps = steps_to(mv, src, dst.placements, shape, dtype);
    return plan;
  }
  // 1. On the source mesh, to the layout the pieces leave from: no Partial, and the cheapest
  // of them counting the move that follows (a Partial reduce-scattered rather than all-reduced,
  // or a replicated dim sliced so that every replica sends a part). Ties keep the list that
  // only drops Partial, then the first by name.
  Moves mv = search_moves(src, nullptr, shape, dtype);
  DistAttr to(dst.mesh, drop_partial(dst.placements));
  std::vector<Placements> leaving{drop_partial(src.placements)};
  for (const auto& [k, p] : mv.lists)
    if (std::none_of(p.begin(), p.end(), [](const Placement& x) { return x.is_partial(); }) && p != leaving.front())
      leaving.push_back(p);
  double best = std::numeric_limits<double>::infinity();
  Placements mid;
  ReshardStep xfer;
  for (const Placements& p : leaving) {
    ReshardStep move = pieces_to(DistAttr(src.mesh, p), to, shape, dtype);
    double moved = 0;
    for (const auto& [rank, bytes] : move.bytes) moved = std::max(moved, static_cast<double>(bytes));
    const double total = mv.cost.at(placements_str(p)) + moved;
    if (total >= best) continue;
    best = total;
    mid = p;
    xfer = std::move(move);
  }
  plan.steps = steps_to(mv, src, mid, shape, dtype);
  // 2. The pieces to the destination ranks that need them.
  plan.steps.push_back(xfer);
  // 3. Partial destinations are made locally.
  Placements cur = to.placements;
  for (size_t m = 0; m < dst.placements.size(); ++m)
    if (dst.placements[m].is_partial()) {
      ReshardStep s;
      s.kind = ReshardStep::Kind::to_partial;
      s.mesh_dim = static_cast<int64_t>(m);
      s.dst_mesh = true;
      s.before = cur;
      cur[m] = dst.placements[m];
      s.after = cur;
      s.reduce = dst.placements[m].reduce;
      plan.steps.push_back(s);
    }
  plan.cost = best;
  return plan;
}

// ---------------------------------------------------------------- execution

namespace {

// x with tensor dim d moved to the front, contiguous.
Tensor front(const Tensor& x, int64_t d) {
  std::vector<int64_t> order{d};
  for (int64_t i = 0; i < x.dim(); ++i)
    if (i != d) order.push_back(i);
  return view::contiguous(view::permute(x, order));
}

// The inverse of front(): dim 0 back to position d.
Tensor unfront(const Tensor& x, int64_t d) {
  std::vector<int64_t> order;
  for (int64_t i = 1; i <= d; ++i) order.push_back(i);
  order.insert(order.begin() + d, 0);
  for (int64_t i = d + 1; i < x.dim(); ++i) order.push_back(i);
  return view::contiguous(view::permute(x, order));
}

// The product of the dims before `d`: 1 when slices along d are contiguous runs in order.
int64_t outer_extent(const Shape& shape, int64_t d) {
  int64_t n = 1;
  for (int64_t i = 0; i < d; ++i) n *= shape[static_cast<size_t>(i)];
  return n;
}

// The product of the dims after `d`: the elements of one index of d within one outer row.
int64_t inner_extent(const Shape& shape, int64_t d) {
  int64_t n = 1;
  for (size_t i = static_cast<size_t>(d) + 1; i < shape.size(); ++i) n *= shape[i];
  return n;
}

double pad_value(ReduceOp op) {
  if (op == ReduceOp::max) return -std::numeric_limits<double>::infinity();
  if (op == ReduceOp::min) return std::numeric_limits<double>::infinity();
  return 0.0;
}

// Extents along `d` of every member of this rank's group along mesh dim m, in group order.
std::vector<int64_t> extents(const DistAttr& a, const Shape& shape, int64_t m, int64_t d, int64_t rank) {
  std::vector<int64_t> out;
  for (int64_t r : a.mesh.group_along(m, rank)) out.push_back(a.local_shape(shape, r)[static_cast<size_t>(d)]);
  return out;
}

Tensor run_step(const Tensor& x, const ReshardStep& s, const ProcessMesh& mesh, const Shape& shape, int64_t rank) {
  using K = ReshardStep::Kind;
  DistAttr before(mesh, s.before), after(mesh, s.after);
  const int64_t m = s.mesh_dim;
  const int64_t k = mesh.dim_size(m);
  // Over one rank every step is the identity (a shard is the whole dim, a partial value is
  // complete): hand the piece on instead of copying it.
  if (k == 1) return x;
  const int64_t c = mesh.coord(rank)[static_cast<size_t>(m)];
  const DType dt = x.dtype();
  Shape out_shape = after.local_shape(shape, rank);
  switch (s.kind) {
    case K::slice: {
      int64_t d = s.tensor_dim, e = x.size(d);
      return view::clone(view::slice(x, d, split_offset(e, k, c), split_offset(e, k, c) + split_size(e, k, c)));
    }
    case K::to_partial: {
      const Placement& from = s.before[static_cast<size_t>(m)];
      ReduceOp op = s.reduce;
      if (from.is_replicate()) {
        if (op == ReduceOp::sum && c != 0) return Tensor::zeros(out_shape, dt);
        return view::clone(x);
      }
      // From S(d): pad the piece into the full extent (avg pieces scaled by k so the mean is exact).
      int64_t d = from.dim, e = out_shape[static_cast<size_t>(d)];
      Tensor out = Tensor::full(out_shape, pad_value(op), dt);
      Tensor piece = x;
      if (op == ReduceOp::avg) {
        piece = view::to_dtype(x, dt == DType::bf16 ? DType::f32 : dt);
        piece = view::clone(piece);
        TESSEL_DISPATCH_FLOAT(piece.dtype(), "reshard", [&]<typename T>() {
          T* p = piece.data<T>();
          for (int64_t i = 0; i < piece.numel(); ++i) p[i] *= static_cast<T>(k);
        });
      }
      view::copy(view::slice(out, d, split_offset(e, k, c), split_offset(e, k, c) + split_size(e, k, c)), piece);
      return out;
    }
    case K::all_reduce: {  // on a copy: x may still be needed (autograd keeps inputs)
      Tensor out = view::clone(x);
      mesh_dim_group(mesh, m)->all_reduce(out.raw_data(), out.numel(), dt, s.reduce);
      return out;
    }
    case K::all_gather: {
      // Seen as a matrix [outer, numel after outer] (outer: the product of the dims before d),
      // each rank's contiguous piece is a column block of the output: the collective lays the
      // rows out in place (one run per rank when d is the outermost non-trivial dim).
      const int64_t d = s.tensor_dim;
      std::vector<int64_t> ext = extents(before, shape, m, d, rank);
      Tensor piece = view::contiguous(x);
      Shape full = piece.shape();
      full[static_cast<size_t>(d)] = 0;
      for (int64_t e : ext) full[static_cast<size_t>(d)] += e;
      const int64_t rows = outer_extent(full, d), inner = inner_extent(full, d);
      std::vector<int64_t> widths;
      for (int64_t e : ext) widths.push_back(e * inner);
      Tensor out = Tensor::empty(full, dt);
      if (rows > 0) mesh_dim_group(mesh, m)->all_gather_v(piece.raw_data(), out.raw_data(), widths, dt, rows);
      return out;
    }
    case K::reduce_scatter: {
      // The inverse: this rank's block is its column range of every row of the contiguous input.
      const int64_t d = s.tensor_dim;
      std::vector<int64_t> ext = extents(after, shape, m, d, rank);
      Tensor full = view::contiguous(x);
      const int64_t rows = outer_extent(full.shape(), d), inner = inner_extent(full.shape(), d);
      std::vector<int64_t> widths;
      for (int64_t e : ext) widths.push_back(e * inner);
      Shape mine = full.shape();
      mine[static_cast<size_t>(d)] = ext[static_cast<size_t>(c)];
      Tensor out = Tensor::empty(mine, dt);
      if (rows > 0)
        mesh_dim_group(mesh, m)->reduce_scatter_v(full.raw_data(), out.raw_data(), widths, dt, s.reduce, rows);
      return out;
    }
    case K::all_to_all: {
      // S(a) -> S(b): split my piece along b into k chunks (chunk j to member j); receive each
      // member's a-piece of my b-chunk; concatenate along a.
      int64_t a = s.tensor_dim, b = s.tensor_dim2;
      std::vector<int64_t> a_ext = extents(before, shape, m, a, rank);
      int64_t eb = x.size(b);
      std::vector<Tensor> chunks;
      std::vector<int64_t> send_counts, recv_counts;
      for (int64_t j = 0; j < k; ++j) {
        Tensor ch = front(view::slice(x, b, split_offset(eb, k, j), split_offset(eb, k, j) + split_size(eb, k, j)), a);
        send_counts.push_back(ch.numel());
        chunks.push_back(ch);
      }
      Shape piece = x.shape();
      piece[static_cast<size_t>(b)] = split_size(eb, k, c);
      // Received pieces are [a_ext[i], ...rest with b = my chunk] with a moved to the front.
      Shape moved;
      moved.push_back(0);
      for (int64_t i = 0; i < x.dim(); ++i)
        if (i != a) moved.push_back(piece[static_cast<size_t>(i)]);
      int64_t rest = shape_numel(Shape(moved.begin() + 1, moved.end()));
      for (int64_t e : a_ext) {
        recv_counts.push_back(e * rest);
        moved[0] += e;
      }
      Tensor send = Tensor::empty({std::max<int64_t>(1, [&] {
                                     int64_t n = 0;
                                     for (int64_t v : send_counts) n += v;
                                     return n;
                                   }())},
                                  dt);
      int64_t at = 0;
      for (const Tensor& ch : chunks) {
        if (ch.numel() > 0)
          std::memcpy(static_cast<char*>(send.raw_data()) + at * static_cast<int64_t>(dtype_size(dt)), ch.raw_data(),
                      ch.nbytes());
        at += ch.numel();
      }
      Tensor out = Tensor::empty(moved, dt);
      mesh_dim_group(mesh, m)->all_to_all_v(send.raw_data(), send_counts, out.raw_data(), recv_counts, dt);
      return unfront(out, a);
    }
    case K::send_recv: break;
  }
  TESSEL_ASSERT(false, "reshard step {} is not a one-mesh step", s.name());
}

// A per-reshard tag agreed by every participant: reshards between the same two layouts are
// counted in order.
int cross_mesh_tag(const ReshardPlan& plan) {
  struct Counters {
    std::map<std::string, int> n;
  };
  RankContext& ctx = rank_context();
  auto counters = ctx.get_ext<Counters>();
  if (!counters) {
    counters = std::make_shared<Counters>();
    ctx.set_ext(counters);
  }
  std::string key = plan.src.str() + "->" + plan.dst.str() + shape_str(plan.shape);
  int n = ++counters->n[key];
  return static_cast<int>((stream_combine(std::hash<std::string>{}(key), static_cast<uint64_t>(n)) & 0x3fffffff) | 0x40000000);
}

Tensor transfer(const Tensor& x, const ReshardStep& s, const ReshardPlan& plan, int64_t rank, int tag) {
  DistAttr from(plan.src.mesh, s.before), to(plan.dst.mesh, s.after);
  auto world = world_group();
  const DType dt = plan.dtype;
  std::vector<WorkPtr> works;
  std::vector<Tensor> keep;
  // Sends: my owned piece's intersection with every destination piece.
  if (owns(from, rank)) {
    Box own = box_of(from, plan.shape, rank);
    for (int64_t d : plan.dst.mesh.process_ids()) {
      if (d == rank) continue;
      Box part = intersect(own, box_of(to, plan.shape, d));
      if (part.empty()) continue;
      Tensor piece = x;
      for (size_t i = 0; i < part.offset.size(); ++i)
        piece = view::slice(piece, static_cast<int64_t>(i), part.offset[i] - own.offset[i],
                            part.offset[i] - own.offset[i] + part.shape[i]);
      piece = view::clone(piece);
      keep.push_back(piece);
      works.push_back(world->send_async(piece.raw_data(), piece.numel(), dt, static_cast<int>(d), tag));
    }
  }
  Tensor out;
  if (plan.dst.mesh.contains(rank)) {
    Box need = box_of(to, plan.shape, rank);
    out = Tensor::empty(need.shape, dt);
    std::vector<std::pair<Box, Tensor>> incoming;
    for (int64_t src : plan.src.mesh.process_ids()) {
      if (!owns(from, src)) continue;
      Box part = intersect(box_of(from, plan.shape, src), need);
      if (part.empty()) continue;
      Tensor buf = Tensor::empty(part.shape, dt);
      if (src == rank) {  // my own piece: a local copy
        Box own = box_of(from, plan.shape, rank);
        Tensor piece = x;
        for (size_t i = 0; i < part.offset.size(); ++i)
          piece = view::slice(piece, static_cast<int64_t>(i), part.offset[i] - own.offset[i],
                              part.offset[i] - own.offset[i] + part.shape[i]);
        view::copy(buf, piece);
      } else {
        works.push_back(world->recv_async(buf.raw_data(), buf.numel(), dt, static_cast<int>(src), tag));
      }
      incoming.emplace_back(part, buf);
    }
    for (auto& w : works) w->wait();
    works.clear();
    for (auto& [part, buf] : incoming) {
      Tensor dst = out;
      for (size_t i = 0; i < part.offset.size(); ++i)
        dst = view::slice(dst, static_cast<int64_t>(i), part.offset[i] - need.offset[i], part.offset[i] - need.offset[i] + part.shape[i]);
      view::copy(dst, buf);
    }
  }
  for (auto& w : works) w->wait();
  return out;
}

}  // namespace

Tensor run_reshard(const Tensor& local, const ReshardPlan& plan) {
  const int64_t rank = current_world_rank();
  Tensor x = local;
  const bool in_src = plan.src.mesh.contains(rank);
  int tag = plan.cross_mesh() && (in_src || plan.dst.mesh.contains(rank)) ? cross_mesh_tag(plan) : 0;
  for (const ReshardStep& s : plan.steps) {
    if (s.kind == ReshardStep::Kind::send_recv) {
      if (in_src || plan.dst.mesh.contains(rank)) x = transfer(x, s, plan, rank, tag);
      continue;
    }
    const ProcessMesh& mesh = s.dst_mesh ? plan.dst.mesh : plan.src.mesh;
    if (!mesh.contains(rank) || (!s.dst_mesh && !in_src)) continue;
    x = run_step(x, s, mesh, plan.shape, rank);
  }
  if (!plan.dst.mesh.contains(rank)) return Tensor::zeros(Shape(plan.shape.size(), 0), plan.dtype);
  return x;
}

}  // namespace tessel
