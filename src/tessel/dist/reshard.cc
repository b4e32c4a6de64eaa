// Reshard execution: local moves, collectives along mesh dims, send/recv between meshes.
#include "tessel/dist/reshard.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "tessel/comm/world.h"
#include "tessel/core/context.h"
#include "tessel/core/error.h"
#include "tessel/core/philox.h"
#include "tessel/core/view.h"
#include "tessel/dist/comm_buffers.h"
#include "tessel/ops/inplace.h"
#include "tessel/dist/mesh_comm.h"

namespace tessel {

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
        if (!piece.is_meta()) scale_(piece, static_cast<double>(k));  // tracing: no values to scale
      }
      view::copy(view::slice(out, d, split_offset(e, k, c), split_offset(e, k, c) + split_size(e, k, c)), piece);
      return out;
    }
    case K::all_reduce: {  // on a copy: x may still be needed (autograd keeps inputs)
      Tensor out = view::clone(x);
      CommBuffers cb;
      cb.finish(mesh_dim_group(mesh, m)->all_reduce_async(cb.inout(out), out.numel(), dt, s.reduce))->wait();
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
      if (rows > 0) {
        CommBuffers cb;
        cb.finish(mesh_dim_group(mesh, m)->all_gather_v_async(cb.in(piece), cb.out(out), widths, dt, rows))->wait();
      }
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
      if (rows > 0) {
        CommBuffers cb;
        cb.finish(mesh_dim_group(mesh, m)->reduce_scatter_v_async(cb.in(full), cb.out(out), widths, dt, s.reduce, rows))
            ->wait();
      }
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
        if (ch.numel() > 0 && !send.is_meta())
          view::copy(view::slice(send, 0, at, at + ch.numel()), view::reshape(ch, {ch.numel()}));
        at += ch.numel();
      }
      Tensor out = Tensor::empty(moved, dt);
      CommBuffers cb;
      cb.finish(mesh_dim_group(mesh, m)->all_to_all_v_async(cb.in(send), send_counts, cb.out(out), recv_counts, dt))
          ->wait();
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
    PieceBox own = box_of(from, plan.shape, rank);
    for (int64_t d : plan.dst.mesh.process_ids()) {
      if (d == rank) continue;
      PieceBox part = intersect(own, box_of(to, plan.shape, d));
      if (part.empty()) continue;
      Tensor piece = x;
      for (size_t i = 0; i < part.offset.size(); ++i)
        piece = view::slice(piece, static_cast<int64_t>(i), part.offset[i] - own.offset[i],
                            part.offset[i] - own.offset[i] + part.shape[i]);
      piece = view::clone(piece);
      keep.push_back(piece);
      CommBuffers cb;
      works.push_back(cb.finish(world->send_async(cb.in(piece), piece.numel(), dt, static_cast<int>(d), tag)));
    }
  }
  Tensor out;
  if (plan.dst.mesh.contains(rank)) {
    PieceBox need = box_of(to, plan.shape, rank);
    out = Tensor::empty(need.shape, dt);
    std::vector<std::pair<PieceBox, Tensor>> incoming;
    for (int64_t src : plan.src.mesh.process_ids()) {
      if (!owns(from, src)) continue;
      PieceBox part = intersect(box_of(from, plan.shape, src), need);
      if (part.empty()) continue;
      Tensor buf = Tensor::empty(part.shape, dt);
      if (src == rank) {  // my own piece: a local copy
        PieceBox own = box_of(from, plan.shape, rank);
        Tensor piece = x;
        for (size_t i = 0; i < part.offset.size(); ++i)
          piece = view::slice(piece, static_cast<int64_t>(i), part.offset[i] - own.offset[i],
                              part.offset[i] - own.offset[i] + part.shape[i]);
        view::copy(buf, piece);
      } else {
        CommBuffers cb;
        works.push_back(cb.finish(world->recv_async(cb.out(buf), buf.numel(), dt, static_cast<int>(src), tag)));
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
