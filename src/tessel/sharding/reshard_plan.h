// The reshard planner (pure values; the dist layer runs the plans). A plan is a printable value: the steps that turn one
// DistAttr into another for a tensor of a given shape, each with its mesh dim and the bytes
// each rank hands to the collective. On one mesh the planner searches over placement lists,
// one mesh dim at a time, for the cheapest sequence of legal moves:
//
//   R    -> S(d)   local slice              (no communication)
//   R    -> P      keep on the first rank   (no communication; zeros elsewhere)
//   S(d) -> R      all_gather
//   S(d) -> S(e)   all_to_all
//   S(d) -> P      zero-pad the piece       (no communication)
//   P    -> R      all_reduce
//   P    -> S(d)   reduce_scatter
//
// A mesh dim's shard of tensor dim d may change only when it is the innermost (last) mesh dim
// sharding d, and a new shard always becomes innermost: that keeps nested shards exact.
// Between different meshes the source is first made non-Partial on its mesh, then each
// destination rank receives, by send/recv, the intersection of its piece with each source
// piece (from one owner per replicated piece), and Partial destinations are formed locally.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "tessel/core/dtype.h"
#include "tessel/core/shape.h"
#include "tessel/sharding/dist_attr.h"

namespace tessel {

struct ReshardStep {
  enum class Kind { slice, to_partial, all_gather, all_to_all, all_reduce, reduce_scatter, send_recv };
  Kind kind = Kind::slice;
  int64_t mesh_dim = -1;            // -1 for send_recv between meshes
  bool dst_mesh = false;            // the step runs on the destination mesh (after a send_recv)
  Placements before, after;         // placements around the step (on the step's mesh)
  int64_t tensor_dim = -1;          // gathered / scattered dim (all_to_all: from this dim)
  int64_t tensor_dim2 = -1;         // all_to_all: to this dim
  ReduceOp reduce = ReduceOp::sum;  // all_reduce, reduce_scatter, to_partial
  std::map<int64_t, int64_t> bytes; // world rank -> bytes it hands to the collective (sends, for send_recv)

  bool communicates() const { return kind != Kind::slice && kind != Kind::to_partial; }
  std::string name() const;  // "all_gather", ...
};

struct ReshardPlan {
  DistAttr src, dst;
  Shape shape;
  DType dtype = DType::f32;
  std::vector<ReshardStep> steps;
  double cost = 0;  // the planner's estimate (bytes moved per rank, ring volumes)

  bool cross_mesh() const { return !(src.mesh == dst.mesh); }
  // Bytes `rank` hands to collectives over the whole plan.
  int64_t bytes_for(int64_t rank) const;
  int64_t max_bytes() const;
  // One line per step: "all_gather on mesh dim 0 'dp' (tensor dim 0): [S(0),R] -> [R,R], 24 B per rank".
  std::string str() const;
};

// Plans src -> dst for a tensor of `shape` and `dtype`; throws naming both when impossible
// (e.g. a dim sharded outside the tensor's rank).
ReshardPlan plan_reshard(const DistAttr& src, const DistAttr& dst, const Shape& shape, DType dtype);

// The planner's cost of src -> dst on src's mesh (ReshardPlan::cost: bytes per rank on ring
// volumes plus a latency per collective), without building the steps. Cached per thread by the
// mesh's dim sizes, both placement lists, shape and dtype: SPMD rules price every candidate
// layout with it on each distributed op call.
double reshard_cost(const DistAttr& src, const Placements& dst, const Shape& shape, DType dtype);

// The piece of a tensor of `shape` that `rank` holds under `a`: offset and extent per dim.
struct PieceBox {
  Shape offset, shape;
  bool empty() const { return shape_numel(shape) == 0; }
};
PieceBox box_of(const DistAttr& a, const Shape& shape, int64_t rank);
PieceBox intersect(const PieceBox& a, const PieceBox& b);
// Whether `rank` is the owner of its piece among the replicas (coordinate 0 of every
// replicated mesh dim): the one that sends it between meshes.
bool owns(const DistAttr& a, int64_t rank);

}  // namespace tessel
