// The metrics of a mixture-of-experts model's training step: what its routers did, summed over
// every rank (each MoE block records its rank's tokens in nn::moe_step()).
#pragma once

#include "tessel/comm/process_group.h"
#include "tessel/core/json.h"
#include "tessel/nn/models.h"

namespace tessel {

// Starts a training step's record: the auxiliary losses' gradient share of one of `micro_batches`.
void begin_moe_step(int64_t micro_batches);
// The step's record summed over `world` (a collective: every rank calls it), or null when the
// model has no MoE blocks: {"aux_loss", "z_loss", "dropped_fraction" (means over the MoE layers'
// sequences, tokens and assignments), "layers": [{"layer", "aux_loss", "z_loss",
// "dropped_fraction", "tokens_per_expert": [...]}]}.
Json end_moe_step(const nn::LanguageModel& model, ProcessGroup& world);

}  // namespace tessel
