// The shape of an SPMD rule: given the global metas and current DistAttrs of an op's inputs,
// the DistAttrs the op needs its inputs in and those its outputs will have. Each op's rule
// lives in its definition (ops layer); the dist layer applies it.
#pragma once

#include <span>
#include <vector>

#include "tessel/core/attrs.h"
#include "tessel/core/tensor.h"
#include "tessel/sharding/dist_attr.h"

namespace tessel {

struct SpmdCall {
  std::span<const TensorMeta> inputs;  // global metas
  std::span<const DistAttr> input_attrs;
  const Attrs& attrs;
};

struct SpmdDecision {
  std::vector<DistAttr> inputs;   // what each input must be resharded to
  std::vector<DistAttr> outputs;  // what the local kernel's outputs then are
};

using SpmdRule = SpmdDecision (*)(const SpmdCall&);

}  // namespace tessel
