// Every differentiable op of tessel, for users and for the layers above.
#pragma once

#include "tessel/ops/attention.h"
#include "tessel/ops/dispatch.h"
#include "tessel/ops/elementwise.h"
#include "tessel/ops/grouped_matmul.h"
#include "tessel/ops/index.h"
#include "tessel/ops/matmul.h"
#include "tessel/ops/norm.h"
#include "tessel/ops/random.h"
#include "tessel/ops/reduce.h"
#include "tessel/ops/select.h"
#include "tessel/ops/shape.h"
#include "tessel/ops/softmax.h"
