// Layering probe: compiled with only the core layer's include root this must fail, because
// core may not see the ops layer above it.
#include "tessel/ops/op.h"

int layering_probe() { return static_cast<int>(sizeof(tessel::OpDef)); }
