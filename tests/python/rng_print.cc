// Prints the C++ Philox draws the Python tests compare with: for each request on the command
// line, "uniform|normal SEED STREAM N", the N float32 draws' bit patterns in hex, one line.
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "tessel/core/philox.h"
#include "tessel/core/tensor.h"

int main(int argc, char** argv) {
  using namespace tessel;
  for (int i = 1; i + 3 < argc; i += 4) {
    const bool uniform = std::strcmp(argv[i], "uniform") == 0;
    const uint64_t seed = std::strtoull(argv[i + 1], nullptr, 10), stream = std::strtoull(argv[i + 2], nullptr, 10);
    const int64_t n = std::strtoll(argv[i + 3], nullptr, 10);
    Tensor t = Tensor::zeros({n});
    rng_fill(t, uniform ? Distribution::uniform : Distribution::normal, 0.0, 1.0, seed, stream);
    for (int64_t k = 0; k < n; ++k) {
      uint32_t bits = 0;
      std::memcpy(&bits, t.data<float>() + k, 4);
      std::printf("%s%08" PRIx32, k ? " " : "", bits);
    }
    std::printf("\n");
  }
  return 0;
}
