// load_checkpoint on a checkpoint folder one of whose files is arbitrary bytes: a valid
// checkpoint of a tiny GPT-2 (with AdamW state) is saved once; each input's first byte picks
// the file it replaces — trainer.json, model.safetensors, optimizer.safetensors, the
// distributed-checkpoint index checkpoint.json or manifest.json — and the rest is that file's
// content. Unless the manifest itself is the input, it is left out, so that the other files
// reach their parsers instead of failing the manifest's size and checksum check. Loading must end in a tessel::Error or a loaded model, never a
// crash or a sanitizer report. With TESSEL_FUZZ_WRITE_SEEDS=DIR it writes its seeds there
// (the three files of the valid checkpoint, each after its selector byte) and exits.
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>

#include "fuzz_util.h"
#include "tessel/ckpt/checkpoint.h"
#include "tessel/core/error.h"
#include "tessel/core/log.h"

namespace {

namespace fs = std::filesystem;
using namespace tessel;

const char* const kFiles[] = {"trainer.json", "model.safetensors", "optimizer.safetensors", "checkpoint.json",
                              "manifest.json"};
constexpr int kCount = 5;

struct Setup {
  std::unique_ptr<nn::Gpt2> model;
  std::unique_ptr<optim::AdamW> optimizer;
  std::string step_dir;
  std::string original[kCount];

  Setup() {
    nn::Gpt2Config c;
    c.n_layer = 1;
    c.n_embd = 8;
    c.n_head = 2;
    c.vocab_size = 16;
    c.n_positions = 8;
    model = std::make_unique<nn::Gpt2>(c);
    model->materialize(1);
    std::vector<optim::ParamRef> refs;
    for (nn::Parameter* p : model->parameters()) {
      refs.push_back({p->name, p->value});
      p->value.set_grad(Tensor::zeros(p->value.shape()));
    }
    optimizer = std::make_unique<optim::AdamW>(refs, optim::AdamWOptions{});
    optimizer->step();  // step 1, with state
    step_dir = save_checkpoint(fuzz::scratch_dir(), *model, optimizer.get(), TrainerState{.step = 1, .seed = 7});
    for (int i = 0; i < kCount; ++i) {
      std::ifstream in(fs::path(step_dir) / kFiles[i], std::ios::binary);
      original[i].assign(std::istreambuf_iterator<char>(in), {});
    }
  }
};

void write(const fs::path& path, const char* data, size_t size) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(data, static_cast<std::streamsize>(size));
}

Setup& setup() {
  static Setup s;
  return s;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  set_log_level(LogLevel::error);
  if (const char* dir = std::getenv("TESSEL_FUZZ_WRITE_SEEDS")) {
    fs::create_directories(dir);
    for (int i = 0; i < kCount; ++i) {
      const std::string seed = std::string(1, static_cast<char>(i)) + setup().original[i];
      write(fs::path(dir) / kFiles[i], seed.data(), seed.size());
    }
    std::exit(0);
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static Setup& setup = ::setup();
  // The file the previous input replaced (-1: the folder as saved, manifest and all). Only it
  // is restored, and the manifest removed once: two file writes per input instead of five.
  static int replaced = -1;
  if (size == 0) return 0;
  const int which = data[0] % kCount;
  const fs::path dir(setup.step_dir);
  if (replaced == -1) {
    std::error_code ec;
    fs::remove(dir / kFiles[kCount - 1], ec);  // no manifest: every file is parsed (see the top of the file)
  } else if (replaced != which) {
    const fs::path path = dir / kFiles[replaced];
    if (replaced == kCount - 1) {
      std::error_code ec;
      fs::remove(path, ec);
    } else {
      write(path, setup.original[replaced].data(), setup.original[replaced].size());
    }
  }
  write(dir / kFiles[which], reinterpret_cast<const char*>(data + 1), size - 1);
  replaced = which;
  try {
    load_checkpoint(setup.step_dir, *setup.model, setup.optimizer.get());
  } catch (const Error&) {
  }
  return 0;
}
