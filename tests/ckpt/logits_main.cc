// tessel's logits for a fixed batch from a checkpoint, for the PyTorch check of an exported
// checkpoint (hf_export_torch.py): loads CONFIG's model from STEP_DIR (any layout's checkpoint,
// read on one rank) and writes the logits of token ids (b·7 + t·3) mod vocab, [2, T], to OUT as
// safetensors ("logits", and the "ids").
//   logits_main CONFIG STEP_DIR OUT [--set key=value]...
#include <cstdio>

#include "tessel/ckpt/checkpoint.h"
#include "tessel/ckpt/safetensors.h"
#include "tessel/cli/config.h"
#include "tessel/core/context.h"

using namespace tessel;

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: logits_main CONFIG STEP_DIR OUT [--set key=value]...\n");
    return 2;
  }
  std::vector<std::string> sets;
  for (int i = 4; i + 1 < argc; i += 2) sets.push_back(argv[i + 1]);
  const RunConfig cfg = load_run_config(argv[1], sets);
  std::unique_ptr<nn::LanguageModel> model = build_model(cfg);
  model->materialize(cfg.train.seed);
  load_checkpoint(argv[2], *model, nullptr);
  model->train(false);
  NoGradGuard no_grad;
  const int64_t B = 2, T = cfg.train.seq_len, V = model->vocab_size();
  Tensor ids = Tensor::empty({B, T}, DType::i64);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t) ids.data<int64_t>()[b * T + t] = (b * 7 + t * 3) % V;
  const Tensor logits = model->forward(ids);
  save_safetensors(argv[3], {{"logits", logits}, {"ids", ids}});
  std::printf("wrote logits %s of step %s to %s\n", shape_str(logits.shape()).c_str(), argv[2], argv[3]);
  return 0;
}
