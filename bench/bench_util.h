// Helpers shared by the benchmarks in bench/.
#pragma once

#include <algorithm>
#include <vector>

namespace tessel::bench {

// The upper median (the middle element of an odd count); 0 for no samples.
inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

}  // namespace tessel::bench
