// Fault injection for tests: TESSEL_FAULT makes a chosen rank crash, hang or exit at a chosen
// step, or part-way through writing a checkpoint, so that recovery can be tested against real
// failures rather than simulated ones. Unset (the normal case), every check is one branch.
//
//   TESSEL_FAULT="rank=1,step=3,action=crash"                  before rank 1 runs step 3
//   TESSEL_FAULT="rank=0,step=4,action=crash,during=save,after_bytes=12345"
//                                                              rank 0's save at step 4, after it
//                                                              wrote 12345 bytes of its files
// Keys: rank (default: every rank), step (default: the first), action = crash (SIGKILL to the
// process, as `kill -9`), hang (SIGSTOP to the process, as a stopped or wedged host), exit
// (_exit(3): a clean but unannounced death) or error (a CheckpointWriteError thrown where the
// write is: a save that fails as on a full disk, the process going on), during = step
// (default) or save, after_bytes (save only; default 0). A malformed value is refused naming the key. See docs/checkpoint.md.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace tessel {

struct FaultSpec {
  int64_t rank = -1;  // -1: any rank
  int64_t step = -1;  // -1: the first step (or save) reached
  std::string action = "crash";  // crash | hang | exit | error
  std::string during = "step";   // step | save
  int64_t after_bytes = 0;       // during=save: bytes this rank writes before it fails
};

// Parses "key=value,..." (throws naming the key on a bad one).
FaultSpec parse_fault(const std::string& text);
// The spec in TESSEL_FAULT when it names `during`, `rank` and `step`; nullopt otherwise.
std::optional<FaultSpec> armed_fault(const char* during, int64_t rank, int64_t step);
// Carries out the spec's action on this process (does not return for crash and exit; throws
// CheckpointWriteError for error).
void inject_fault(const FaultSpec& spec);

}  // namespace tessel
