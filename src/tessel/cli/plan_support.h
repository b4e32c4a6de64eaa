// The planner from the command line's side: models from training configs, clusters from
// presets, files or this machine, and the automatic layout `tessel train --plan auto` uses.
#pragma once

#include <string>

#include "tessel/cli/config.h"
#include "tessel/engine/trace.h"  // apply_layout
#include "tessel/plan/planner.h"

namespace tessel {

// The planner's view of a config's model, at the config's sequence length.
plan::ModelSpec model_spec_of(const RunConfig& config);

// A model preset name or a training config path; `config_out` receives the config when the
// text named one (it is left untouched for a preset).
plan::ModelSpec resolve_model(const std::string& text, RunConfig* config_out = nullptr);

// "PRESET[:N]", "local[:N]" (this machine, measured, N thread ranks) or a cluster YAML file.
plan::Cluster resolve_cluster(const std::string& text, bool verbose);

// This machine measured for `ranks` thread ranks (0: one per core), as `tessel cluster detect`
// does. A measurement of the last 24 hours kept in the user's cache folder
// ($XDG_CACHE_HOME/tessel, else ~/.cache/tessel, one file per host and rank count) is used
// instead of measuring again (a few seconds, more on a busy machine); a new one is kept there.
// `fresh`: measure now regardless (tessel cluster detect).
plan::Cluster local_cluster(int ranks, bool verbose, bool fresh = false);

// The fastest layout for `ranks` thread ranks of this machine, with the planner's estimate;
// throws when none fits. `cluster`: the machine as measured before (null: measure it now).
plan::Estimate auto_layout(const RunConfig& config, int ranks, bool verbose, const plan::Cluster* cluster = nullptr);


}  // namespace tessel
