// Config readers refuse bad input early and by name (issue 31): YAML aliases bounded before any
// walk, only regular files read, no infinite or NaN numbers, no key given twice or not a plain
// name, sizes bounded, every error an InputError naming the file and the key.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>

#include "tessel/cli/config.h"
#include "tessel/cli/plan_support.h"
#include "tessel/core/error.h"

namespace tessel {
namespace {

namespace fs = std::filesystem;

const std::string kModel = "model: {arch: gpt2, n_layer: 2, n_embd: 32, n_head: 2, vocab_size: 256, n_positions: 32}\n";
const std::string kLlama =
    "model: {arch: llama, num_hidden_layers: 2, hidden_size: 32, num_attention_heads: 4, num_key_value_heads: 2,"
    " intermediate_size: 48, vocab_size: 256, max_position_embeddings: 32}\n";
const std::string kRest = "data: {path: tokens.txt}\ntrain: {steps: 2, global_batch: 4, seq_len: 16}\n";

class TempDir {
 public:
  TempDir() : path_(fs::temp_directory_path() / fmt::format("tessel_cfgin_{}_{}", ::getpid(), counter_++)) {
    fs::create_directories(path_);
  }
  ~TempDir() { fs::remove_all(path_); }
  fs::path path() const { return path_; }
  std::string file(const std::string& name, const std::string& text) const {
    std::ofstream(path_ / name) << text;
    return (path_ / name).string();
  }

 private:
  static inline int counter_ = 0;
  fs::path path_;
};

// The error of a config (and that it is an InputError: exit status 2), or "<no error>".
std::string input_error(const std::string& yaml, const std::vector<std::string>& sets = {},
                        const std::string& base_dir = "", ConfigUse use = ConfigUse::training) {
  try {
    parse_run_config(yaml, sets, base_dir, "cfg.yaml", use);
  } catch (const InputError& e) {
    return e.what();
  } catch (const std::exception& e) {
    return std::string("<not an InputError> ") + e.what();
  }
  return "<no error>";
}

// Ten aliases of ten aliases, nine levels deep, under a key the reader does not know: under a
// kilobyte of text, 10^9 nodes expanded. Refused by counting, before any walk.
std::string alias_bomb() {
  std::string text = "bomb:\n  a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n";
  for (int i = 1; i < 9; ++i) {
    text += fmt::format("  a{}: &a{} [", i, i);
    for (int k = 0; k < 10; ++k) text += fmt::format("{}*a{}", k ? "," : "", i - 1);
    text += "]\n";
  }
  return text;
}

TEST(ConfigInput, RefusesAnAliasBombInUnderASecond) {
  const std::string yaml = kModel + kRest + alias_bomb();
  ASSERT_LT(yaml.size(), 1024u);
  const auto t0 = std::chrono::steady_clock::now();
  const std::string e = input_error(yaml);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(seconds, 1.0);
  EXPECT_NE(e.find("cfg.yaml:"), std::string::npos) << e;
  EXPECT_NE(e.find("more than 100000 nodes with its aliases"), std::string::npos) << e;
  EXPECT_NE(e.find("config 'bomb"), std::string::npos) << e;
  // The same bomb in a --set value, and a few aliases that expand to little, which are fine.
  EXPECT_NE(input_error(kModel + kRest, {"train.betas=" + std::string("[&a [1, 2], *a]")}).find("'train.betas' must be"),
            std::string::npos);
  EXPECT_EQ(input_error(kModel + kRest + "log: &l {every: 1}\n"), "<no error>");
}

// Every floating-point key: infinity and NaN refused by key, in the file and in --set.
TEST(ConfigInput, RefusesNonFiniteNumbersForEveryFloatingPointKey) {
  struct Case {
    const std::string& model;
    std::string key;
  };
  const std::vector<Case> cases = {
      {kModel, "model.layer_norm_epsilon"}, {kModel, "model.initializer_range"}, {kModel, "model.resid_pdrop"},
      {kLlama, "model.rope_theta"},         {kLlama, "model.rms_norm_eps"},      {kLlama, "model.initializer_range"},
      {kModel, "train.lr"},                 {kModel, "train.min_lr"},            {kModel, "train.weight_decay"},
      {kModel, "train.eps"},                {kModel, "train.grad_clip"},         {kModel, "train.dropout"},
      {kModel, "train.momentum"},           {kModel, "data.val_fraction"}};
  for (const Case& c : cases)
    for (const char* value : {".inf", "-.inf", ".nan", "+.Inf", ".NaN"}) {
      const std::string e = input_error(c.model + kRest, {fmt::format("{}={}", c.key, value)});
      EXPECT_NE(e.find(fmt::format("config '{}' must be a finite number, got '{}'", c.key, value)), std::string::npos)
          << c.key << "=" << value << ": " << e;
    }
  std::string e = input_error(kModel + kRest, {"train.betas=[0.9, .inf]"});
  EXPECT_NE(e.find("config 'train.betas' must be a list of finite numbers"), std::string::npos) << e;
  // In the file itself, with its line.
  e = input_error(kModel + "data: {path: t.txt}\ntrain:\n  steps: 2\n  lr: .inf\n");
  EXPECT_NE(e.find("cfg.yaml:5: config 'train.lr' must be a finite number"), std::string::npos) << e;
}

// Keys that are not names, and keys given twice deep inside a section.
TEST(ConfigInput, RefusesKeysThatAreNotNamesOrGivenTwice) {
  std::string e = input_error(kModel + kRest + "log: {[a, b]: 1}\n");
  EXPECT_NE(e.find("cfg.yaml:4: a key must be a plain name, not a mapping or a list (in config 'log')"),
            std::string::npos) << e;
  e = input_error(kModel + kRest + "? {a: 1}\n: 2\n");
  EXPECT_NE(e.find("cfg.yaml:4: a key must be a plain name"), std::string::npos) << e;
  e = input_error(kModel + kRest + "log: {~: 1}\n");
  EXPECT_NE(e.find("a key must be a name, not null"), std::string::npos) << e;
  e = input_error(kModel + kRest + "parallel:\n  mesh: [pp, dp, tp]\n  dp: 1\n  dp: 2\n");
  EXPECT_NE(e.find("cfg.yaml:7: config 'parallel.dp' is given twice (first at line 6)"), std::string::npos) << e;
  e = input_error(kModel + kRest, {"parallel={dp: 1, dp: 2}"});
  EXPECT_NE(e.find("--set 'parallel={dp: 1, dp: 2}'"), std::string::npos) << e;
  EXPECT_NE(e.find("is given twice"), std::string::npos) << e;
}

// Files a config names: only regular files, refused by name without opening them (a named pipe
// would block forever), an over-long name reported with its key; all InputErrors.
TEST(ConfigInput, ReadsOnlyRegularFilesAndNamesTheKey) {
  TempDir dir;
  const std::string fifo = (dir.path() / "pipe").string();
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  auto hf_error = [&](const std::string& path) {
    return input_error("data: {path: t.txt}\nmodel: {hf_config: " + path + "}\n", {}, dir.path().string());
  };
  std::string e = hf_error(fifo);
  EXPECT_NE(e.find("cfg.yaml: model.hf_config '" + fifo + "': a named pipe, not a regular file"), std::string::npos)
      << e;
  e = hf_error(dir.path().string());
  EXPECT_NE(e.find("model.hf_config '" + dir.path().string() + "': a folder, not a file"), std::string::npos) << e;
  e = hf_error("/dev/null");
  EXPECT_NE(e.find("model.hf_config '/dev/null': a device, not a regular file"), std::string::npos) << e;
  const std::string long_name = "/tmp/" + std::string(5000, 'x');
  e = hf_error(long_name);
  EXPECT_NE(e.find("model.hf_config '/tmp/xxx"), std::string::npos) << e;
  EXPECT_NE(e.find("(5005 characters)': the name is longer than this system allows"), std::string::npos) << e;
  e = hf_error("{a: 1}");
  EXPECT_NE(e.find("config 'model.hf_config' must be a file name"), std::string::npos) << e;
  // A duplicate key and a non-scalar model_type in config.json.
  dir.file("dup.json", R"({"model_type": "gpt2", "n_layer": 2, "n_layer": 3})");
  e = hf_error("dup.json");
  EXPECT_NE(e.find("'n_layer' is given twice"), std::string::npos) << e;
  dir.file("type.json", R"({"model_type": ["gpt2"], "n_layer": 2})");
  e = hf_error("type.json");
  EXPECT_NE(e.find("\"model_type\" must be a name"), std::string::npos) << e;
  // A long data.path parses (the run's file check names it); the config file itself is read
  // only when it is a regular file.
  EXPECT_EQ(input_error(kModel + kRest, {"data.path=" + long_name}), "<no error>");
  for (const std::string& path : {fifo, dir.path().string(), long_name}) {
    const auto t0 = std::chrono::steady_clock::now();
    try {
      load_run_config(path);
      ADD_FAILURE() << path << " was read";
    } catch (const InputError& err) {
      EXPECT_NE(std::string(err.what()).find("config '"), std::string::npos) << err.what();
    }
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 1.0);
  }
}

// Sizes multiply in 64 bits, checked: products past 2^48 elements are refused naming the keys.
TEST(ConfigInput, RefusesSizesWhoseProductsWouldOverflow) {
  std::string e = input_error(kModel + kRest, {"model.vocab_size=4294967296", "model.n_embd=4294967296"});
  EXPECT_NE(e.find("config the token embedding = 'model.vocab_size' (4294967296) x 'model.n_embd' (4294967296) is "
                   "more than 281474976710656 elements"),
            std::string::npos) << e;
  e = input_error(kLlama + kRest, {"model.intermediate_size=9223372036854775807"});
  EXPECT_NE(e.find("the blocks' MLP weights"), std::string::npos) << e;
  e = input_error(kModel + kRest, {"train.global_batch=4611686018427387904", "train.micro_batch=1"});
  EXPECT_NE(e.find("a step's activations"), std::string::npos) << e;
  // The run's tokens are a count, not a tensor: only 64 bits bound them (issue 52: 2^48 did).
  e = input_error(kModel + kRest, {"train.steps=9223372036854775807"});
  EXPECT_NE(e.find("tokens overflow the run's 64-bit token counter"), std::string::npos) << e;
  EXPECT_EQ(input_error(kModel + kRest, {"train.steps=281474976710656"}), "<no error>");
  e = input_error(kModel + kRest, {"parallel.dp=4294967296", "parallel.tp=4294967296", "parallel.pp=4294967296"});
  EXPECT_NE(e.find("is more than 1048576 ranks"), std::string::npos) << e;
}

// tessel plan reads a config for its model: a config of a `model` section alone plans (at the
// model's full context); training still needs the data section.
TEST(ConfigInput, PlanningNeedsOnlyTheModelSection) {
  EXPECT_EQ(input_error(kModel, {}, "", ConfigUse::planning), "<no error>");
  RunConfig c = parse_run_config(kModel, {}, "", "m.yaml", ConfigUse::planning);
  EXPECT_EQ(c.train.seq_len, 32);
  EXPECT_TRUE(c.data.path.empty());
  EXPECT_NE(input_error(kModel).find("config has no 'data' section"), std::string::npos);
  // A data section that is there is still read strictly.
  EXPECT_NE(input_error(kModel + "data: {path: x, pth: x}\n", {}, "", ConfigUse::planning).find("'data.pth'"),
            std::string::npos);
  TempDir dir;
  const std::string path = dir.file("model.yaml", kModel);
  plan::ModelSpec m = resolve_model(path);
  EXPECT_EQ(m.layers, 2);
  EXPECT_EQ(m.seq, 32);
}

}  // namespace
}  // namespace tessel
