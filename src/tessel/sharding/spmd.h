// SPMD rules: given the global metas and current DistAttrs of an op's inputs, the placements
// the op needs its inputs in and those its outputs will have. Each op's rule lives in its
// definition (the ops layer); the dist layer applies it: it reshards the inputs, runs the
// op's local kernel on the local pieces (with attrs the rule may rewrite for the piece, e.g.
// the offset of a shard), and wraps the outputs. A rule may instead hand the call to a
// composition of other ops (decompose) or to the dist layer's own implementation (custom).
//
// All inputs of one call live on one mesh; a rule returns placements for that mesh.
#pragma once

#include <optional>
#include <span>
#include <vector>

#include "tessel/core/attrs.h"
#include "tessel/core/tensor.h"
#include "tessel/sharding/dist_attr.h"

namespace tessel {

struct SpmdCall {
  std::string_view op;                   // for error messages
  std::span<const TensorMeta> inputs;    // global metas
  std::span<const DistAttr> input_attrs;
  const Attrs& attrs;
  int64_t rank = 0;  // this world rank, for local attrs that depend on its piece
  // Inputs (bit i, i < 64) that are parameters — leaves that require a gradient. Their
  // placements are the user's plan: at equal cost a rule moves another input rather than one
  // of these (an activation gathered once serves every consumer; a gathered weight sends the
  // consumers' activations around the mesh instead).
  uint64_t params = 0;
  const ProcessMesh& mesh() const { return input_attrs[0].mesh; }
  int64_t mesh_ndim() const { return mesh().ndim(); }
};

using Decomposition = std::vector<Tensor> (*)(const std::vector<Tensor>& inputs, const Attrs& attrs);

struct SpmdDecision {
  std::vector<Placements> inputs;    // what each input is resharded to
  std::vector<Placements> outputs;   // the placements of the visible outputs
  std::optional<Attrs> local_attrs;  // attrs for the local kernel on this rank's piece
  Decomposition decompose = nullptr; // run this composition of ops on the distributed inputs instead
  bool custom = false;               // the dist layer implements this op itself
};

using SpmdRule = SpmdDecision (*)(const SpmdCall&);

// What a rule weighed: every candidate layout it priced, with the price. Recorded only while a
// caller (the rule validator, `tessel explain-reshard`) has set spmd_audit() on this thread;
// rules skip their decision cache then.
struct SpmdCandidate {
  std::vector<Placements> inputs;  // the covered inputs' placements
  Placements output;
  double input_cost = 0;  // the reshard planner's cost of bringing every covered input there
  double owed_cost = 0;   // the reductions the output's Partial mesh dims still owe
  int changes = 0;        // input placements changed, a parameter's counted twice (the tie-break)
  double cost() const { return input_cost + owed_cost; }
};
struct SpmdAudit {
  struct Entry {
    std::string op;
    std::vector<TensorMeta> inputs;  // the covered inputs
    std::vector<Placements> current;
    TensorMeta output;  // as the rule estimated it (for the owed reductions)
    double owed_scale = 1.0;  // the owed reductions, as a multiple of owed_reduction_cost
    std::vector<SpmdCandidate> candidates;
    size_t chosen = 0;
  };
  std::vector<Entry> entries;
  // Every decision the dist layer applied while the audit was set, with what it applied it to.
  struct Decision {
    std::string op;
    std::vector<TensorMeta> inputs, outputs;  // global metas (visible outputs)
    std::vector<Placements> current;          // the inputs' placements before the call
    SpmdDecision decision;
  };
  std::vector<Decision> decisions;
};
// This thread's audit sink (null: nothing is recorded).
SpmdAudit*& spmd_audit();

// The distributed form of a tensor: its DistAttr and this rank's local piece. A tensor whose
// TensorImpl carries one is a distributed tensor: its shape is the global shape and its data
// live in `local` (empty on ranks outside the mesh).
struct DistSpec {
  DistAttr attr;
  Tensor local;
  // The layouts this tensor was resharded to on its own mesh by the ops that consumed it
  // (dist_call): a tracked activation read by several ops in one layout (q, k and v from one
  // normed input) is gathered once. Kept only for non-leaf tensors under autograd — values
  // nothing mutates in place — and freed with the tensor.
  mutable std::vector<std::pair<Placements, Tensor>> reshards;
};

}  // namespace tessel
