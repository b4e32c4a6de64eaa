// The comm conformance suite: every collective and point-to-point op, every dtype and
// reduction, odd element counts, sub-groups and concurrent asynchronous calls, checked
// against values each rank computes locally. Both backends run it: thread ranks in one
// process, and Gloo ranks as threads or as real processes under `tessel launch`.
#pragma once

#include "tessel/comm/process_group.h"

namespace tessel::testing {

// Runs the suite on `g`; throws tessel::Error describing the first mismatch.
void run_conformance(ProcessGroup& g);

}  // namespace tessel::testing
