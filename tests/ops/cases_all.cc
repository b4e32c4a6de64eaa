// Concatenates the per-family tables.
#include "op_cases.h"

namespace tessel::testing {

std::vector<OpCase> all_cases() {
  std::vector<OpCase> all;
#define TESSEL_APPEND(f)                       \
  for (OpCase& c : f##_cases()) all.push_back(std::move(c));
  TESSEL_OP_FAMILIES(TESSEL_APPEND)
#undef TESSEL_APPEND
  return all;
}

std::vector<ErrorCase> error_cases() {
  std::vector<ErrorCase> all;
#define TESSEL_APPEND(f)                          \
  for (ErrorCase& c : f##_errors()) all.push_back(std::move(c));
  TESSEL_OP_FAMILIES(TESSEL_APPEND)
#undef TESSEL_APPEND
  return all;
}

}  // namespace tessel::testing
