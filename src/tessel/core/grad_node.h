// The autograd tape's vocabulary: a GradNode is one recorded operation; its edges point at
// the nodes (or leaves) that produced its inputs. The ops layer records OpNodes, higher
// layers record their own (reshard, pipeline send/recv); the autograd engine runs them in
// reverse tape order (descending seq_nr).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tessel/core/tensor.h"

namespace tessel {

struct GradEdge {
  std::shared_ptr<GradNode> node;      // producer of the input, or null for a leaf / no grad
  int output_nr = 0;                   // which output of `node`
  std::shared_ptr<AutogradMeta> leaf;  // set when the input is a leaf that requires grad
  bool active() const { return node != nullptr || leaf != nullptr; }
};

class GradNode {
 public:
  virtual ~GradNode() = default;
  // Gradients of the inputs (one per next edge; undefined where none) from the gradients of
  // the outputs (undefined where no gradient flowed to that output).
  virtual std::vector<Tensor> apply(std::vector<Tensor>&& grad_outputs) = 0;
  virtual std::string name() const = 0;
  // Drops saved tensors once a backward without retain_graph has used them.
  virtual void release_saved() {}

  // Whether apply() honours grad_mask (computes only the gradients of inputs the mask keeps).
  // Nodes that do can have their parameter gradients deferred (zero-bubble pipelines).
  virtual bool supports_grad_mask() const { return false; }
  // Per input: is its gradient wanted (empty: every active edge). Set by the engine around a
  // call of apply().
  std::vector<char> grad_mask;
  bool wants_grad(size_t i) const { return next_edges[i].active() && (grad_mask.empty() || grad_mask[i] != 0); }

  std::vector<GradEdge> next_edges;     // one per input
  std::vector<TensorMeta> input_metas;  // to check gradient shapes
  std::vector<TensorMeta> output_metas;
  uint64_t seq_nr = 0;
  bool released = false;
};

// Gradient edge for using `t` as an op input: its producer, its leaf slot, or inactive.
GradEdge gradient_edge(const Tensor& t);
// Makes `outputs[i]` the i-th output of `node` (sets grad_fn, requires_grad).
void set_history(const std::vector<Tensor>& outputs, const std::shared_ptr<GradNode>& node);
// Takes the next tape position of the calling rank.
uint64_t next_sequence_nr();

}  // namespace tessel
