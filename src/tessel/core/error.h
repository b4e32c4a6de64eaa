// Errors of the library. Every failure a user can cause is a tessel::Error (or subclass)
// whose message names the op, tensor, key or rank involved and both sides of a mismatch.
// The library never aborts or exits: elastic recovery must be able to catch everything.
//
// The command line's exit status follows the class (cli/main.cc): InputError (a config, flag,
// data file, checkpoint or cluster file the user must fix) exits 2, except
// CheckpointWriteError; every other Error is a run that failed and exits 1.
#pragma once

#include <stdexcept>
#include <string>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace tessel {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// What the user gave is malformed, missing or does not fit together: a config or its values, a
// data file, a checkpoint, a cluster description. Retrying the same command cannot succeed.
class InputError : public Error {
 public:
  using Error::Error;
};

// Communication failed: a peer died, never arrived, or a transport broke.
class CommError : public Error {
 public:
  using Error::Error;
};

// A collective, store call or other wait exceeded its deadline.
class TimeoutError : public CommError {
 public:
  using CommError::CommError;
};

// A checkpoint is missing, malformed or incompatible with what is being loaded.
class CheckpointError : public InputError {
 public:
  using InputError::InputError;
};

// Writing a checkpoint failed (disk full, an I/O error, the folder removed under the run): the
// run failed, its input was fine. Save paths throw this rather than CheckpointError.
class CheckpointWriteError : public CheckpointError {
 public:
  using CheckpointError::CheckpointError;
};

// An internal invariant did not hold: a bug in tessel, not in the caller's input.
class InternalError : public Error {
 public:
  using Error::Error;
};

namespace detail {
template <typename E>
[[noreturn]] void throw_error(std::string message) {
  throw E(std::move(message));
}
[[noreturn]] void throw_internal(const char* cond, const char* file, int line, std::string message);
}  // namespace detail

}  // namespace tessel

// TESSEL_CHECK(cond, "fmt {}", args...): validates user input; throws tessel::Error.
#define TESSEL_CHECK(cond, ...)                                                   \
  do {                                                                            \
    if (!(cond)) [[unlikely]]                                                     \
      ::tessel::detail::throw_error<::tessel::Error>(::fmt::format(__VA_ARGS__)); \
  } while (0)

// TESSEL_CHECK_AS(ErrorType, cond, "fmt {}", args...): as TESSEL_CHECK with a subclass.
#define TESSEL_CHECK_AS(type, cond, ...)                                 \
  do {                                                                   \
    if (!(cond)) [[unlikely]]                                            \
      ::tessel::detail::throw_error<type>(::fmt::format(__VA_ARGS__));   \
  } while (0)

// TESSEL_THROW("fmt {}", args...): unconditionally throws tessel::Error.
#define TESSEL_THROW(...) ::tessel::detail::throw_error<::tessel::Error>(::fmt::format(__VA_ARGS__))

// TESSEL_ASSERT(cond, "fmt {}", args...): internal invariant; throws InternalError.
#define TESSEL_ASSERT(cond, ...)                                                              \
  do {                                                                                        \
    if (!(cond)) [[unlikely]]                                                                 \
      ::tessel::detail::throw_internal(#cond, __FILE__, __LINE__, ::fmt::format(__VA_ARGS__)); \
  } while (0)
