// The plain single-rank training loop — model, data, AdamW/SGD, schedule, gradient
// accumulation, clipping, validation, checkpoints — written without the engine, as the oracle
// that every layout (and the engine on one rank) is compared with.
#pragma once

#include <functional>

#include "tessel/engine/training.h"

namespace tessel {

TrainResult reference_train(const RunConfig& config, const TrainOptions& options,
                            const std::function<void(const StepRecord&)>& on_step = {});

}  // namespace tessel
