// The registry's single list of ops, in family order. Adding an op: define op_<name> in its
// family's file, add one line here, and add a case to the op test table (tests/ops/), which
// fails on any op without one.
#pragma once

#include "tessel/ops/op.h"

// clang-format off
#define TESSEL_OP_LIST(X)                                                                     \
  /* matmul.cc */      X(matmul) X(linear)                                                    \
  /* grouped_matmul.cc */ X(grouped_matmul)                                                   \
  /* elementwise.cc */ X(add) X(sub) X(mul) X(div) X(scale) X(neg) X(exp) X(log) X(sqrt)     \
                       X(rsqrt) X(tanh) X(gelu) X(silu) X(relu) X(cast)                       \
                       X(eq) X(ne) X(lt) X(le) X(gt) X(ge)                                    \
  /* select.cc */      X(where) X(masked_fill) X(triu)                                        \
  /* reduce.cc */      X(sum) X(mean) X(max) X(min) X(argmax) X(topk) X(cumsum)               \
  /* softmax.cc */     X(softmax) X(log_softmax) X(cross_entropy)                             \
  /* norm.cc */        X(layer_norm) X(rms_norm)                                              \
  /* shape.cc */       X(reshape) X(permute) X(expand) X(contiguous) X(cat) X(split) X(slice) \
  /* index.cc */       X(embedding) X(one_hot)                                                \
  /* random.cc */      X(dropout)                                                             \
  /* attention.cc */   X(sdpa)
// clang-format on

namespace tessel {
#define TESSEL_DECLARE_OP(name) extern const OpDef op_##name;
TESSEL_OP_LIST(TESSEL_DECLARE_OP)
#undef TESSEL_DECLARE_OP

#define TESSEL_COUNT_OP(name) +1
inline constexpr int kNumOps = 0 TESSEL_OP_LIST(TESSEL_COUNT_OP);
#undef TESSEL_COUNT_OP
}  // namespace tessel
