// Distributed tensors: a global shape, a DistAttr (mesh + placements) and this rank's local
// piece. A distributed tensor is an ordinary tessel::Tensor whose shape is the global shape;
// every op accepts it and runs by its SPMD rule (dispatch.h). Ranks outside the mesh hold an
// empty piece and skip the work. Everything here is differentiable.
#pragma once

#include <functional>

#include "tessel/core/philox.h"
#include "tessel/core/tensor.h"
#include "tessel/sharding/dist_attr.h"

namespace tessel {

bool is_dist(const Tensor& t);
// The DistAttr of a distributed tensor; throws naming the tensor otherwise.
const DistAttr& dist_attr(const Tensor& t);
// This rank's piece (a plain tensor; empty outside the mesh). Its gradient is taken to be laid
// out as `t` is (Partial dims as whole gradients), or as `grad_placements` say — Partial where
// the piece is replicated but the code that uses it computes only this rank's share (a
// parameter used on this rank's tokens alone).
Tensor to_local(const Tensor& t);
Tensor to_local(const Tensor& t, const Placements& grad_placements);

// Every rank passes the same full tensor; each keeps its piece. (Partial placements keep the
// value on the first rank along that mesh dim and zeros elsewhere.)
Tensor shard_tensor(const Tensor& full, const ProcessMesh& mesh, const Placements& placements);
// Wraps this rank's piece. `global_shape` may be omitted when every sharded dim splits evenly
// (it is then the local shape times the shard counts).
Tensor dtensor_from_local(const Tensor& local, const ProcessMesh& mesh, const Placements& placements,
                          Shape global_shape = {});
// Creates only the local piece, calling fill(piece, box) with where it sits in the global
// tensor — how parameters of models too big for one rank are made. Not recorded by autograd.
Tensor make_dtensor(const Shape& global_shape, DType dtype, const ProcessMesh& mesh, const Placements& placements,
                    const std::function<void(const Tensor& local, const GlobalBox& box)>& fill);
// The same global tensor laid out by `placements` on `mesh` (any mesh: cross-mesh moves go by
// send/recv). Communicates as the reshard plan says.
Tensor reshard(const Tensor& t, const ProcessMesh& mesh, const Placements& placements);
// reshard() for an op's input on the tensor's own mesh: a tracked activation (a non-leaf that
// requires a gradient, with grad mode on) remembers each layout it was moved to, and a second
// consumer asking for the same layout gets the same tensor without communicating (its
// gradients then meet in one reshard backward). Anything else is resharded as by reshard().
Tensor reshard_for_op(const Tensor& t, const Placements& placements);
// The whole tensor as a plain tensor on every rank of the mesh (empty elsewhere).
Tensor full_tensor(const Tensor& t);

// Internal: a distributed tensor over `local` (not recorded). A `local` handed over as the only
// handle of a tensor without autograd state is kept as it is; anything else is detached first.
Tensor wrap_dtensor(Tensor local, const DistAttr& attr, const Shape& global_shape);
// Internal: the local piece itself (not recorded; to_local is the differentiable form).
const Tensor& local_piece(const Tensor& t);

}  // namespace tessel
