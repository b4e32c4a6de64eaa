// SafetensorsFile::open on arbitrary bytes as a file, then every tensor it lists loaded and
// read to its last byte: a CheckpointError (or another tessel::Error), never a crash, a read
// outside the mapping or a sanitizer report.
#include <cstdint>

#include "fuzz_util.h"
#include "tessel/ckpt/safetensors.h"
#include "tessel/core/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  tessel::fuzz::MemFile file(data, size);
  try {
    const tessel::SafetensorsFile f = tessel::SafetensorsFile::open(file.path());
    for (const tessel::SafetensorsEntry& e : f.entries()) {
      const tessel::Tensor t = f.load(e.name);
      volatile double sink = 0;
      if (t.numel() <= (1 << 20))
        for (double v : t.to_doubles()) sink = sink + v;
    }
  } catch (const tessel::Error&) {
  }
  return 0;
}
