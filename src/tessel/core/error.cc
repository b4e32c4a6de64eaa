// Out-of-line pieces of error.h.
#include "tessel/core/error.h"

namespace tessel::detail {

void throw_internal(const char* cond, const char* file, int line, std::string message) {
  throw InternalError(fmt::format("internal error at {}:{}: `{}` failed: {} (this is a bug in tessel)",
                                  file, line, cond, message));
}

}  // namespace tessel::detail
