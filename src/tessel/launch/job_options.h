// Internal to `tessel launch` (launcher.cc, job_options.cc): the job token.
#pragma once

#include <string>

#include "tessel/launch/launcher.h"

namespace tessel {

// 128 random bits as 32 hex characters (from /dev/urandom).
std::string random_token();
// The job token the options give: --token, else the first line of --token-file (a regular
// file; `warn`: say so when other users can read it), else $TESSEL_JOB_TOKEN, else "".
std::string token_of(const LaunchOptions& o, bool warn = false);

}  // namespace tessel
