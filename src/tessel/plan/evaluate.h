// Inside the planner: the size checks, evaluating a layout with the cost cache a search shares,
// and the traced memory of a reported layout (planner.cc), for the search (search.cc).
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <string>
#include <tuple>

#include "tessel/plan/planner.h"

namespace tessel::plan::detail {

// Layer, embedding and head costs depend on few of a layout's fields; a search reuses them:
// micro-batch, tp, sp, recompute, tp span, busy devices, ep, ep span, cp, cp method, cp span.
using CostKey = std::tuple<int64_t, int, bool, std::string, int, int, int, int, int, int, std::string, int, int>;
// A dense layer, a sparse (mixture-of-experts) layer, the embedding, the head.
using CostCache = std::map<CostKey, std::array<LayerCost, 4>>;

// Refuse sizes whose products would wrap 64-bit element counts, and device counts past 2^20.
void check_sizes(const ModelSpec& m, int64_t global_batch, int64_t micro_batch);
void check_cluster_counts(const Cluster& c);
// evaluate() with a cost cache (null: none); with a traced step of the layout (tessel's own
// runtime), its data-parallel and pipeline traffic from the trace instead of the closed forms.
Estimate evaluate_with(const ModelSpec& m, const Cluster& c, const Layout& layout, int64_t global_batch, bool simulate,
                       CostCache* cache, const TracedStep* step = nullptr);
// Re-evaluates e from the runtime's traced steps of its layout where they apply (StepTracer):
// the traffic of the stage holding the most parameters, the memory of the fullest stage.
void trace_step(const ModelSpec& m, const Cluster& c, int64_t global_batch, bool simulate, CostCache* cache,
                Estimate& e);

}  // namespace tessel::plan::detail
