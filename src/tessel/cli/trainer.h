// `tessel train` on one rank: the engine (engine.h) on a world of one — model, data,
// AdamW/SGD, schedule, gradient accumulation over micro-batches, clipping, JSONL metrics, a live
// progress line on a terminal, and checkpoints that resume the exact trajectory in any layout.
// The plain loop it replaced is the layout tests' oracle (tests/support/reference_trainer.h).
#pragma once

#include <functional>

#include "tessel/engine/training.h"

namespace tessel {

// Runs the config; `on_step` (optional) sees every step's record.
TrainResult train(const RunConfig& config, const TrainOptions& options,
                  const std::function<void(const StepRecord&)>& on_step = {});

}  // namespace tessel
