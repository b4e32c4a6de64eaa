// tessel train: exact resume, metrics, checkpoint contents and strict config errors.
#include <gtest/gtest.h>
#include <signal.h>

#include <filesystem>
#include <fstream>

#include "tessel/ckpt/safetensors.h"
#include "tessel/cli/config.h"
#include "tessel/cli/trainer.h"
#include "tessel/core/view.h"
#include "tessel/data/loader.h"
#include "tessel/launch/signals.h"
#include "tessel/core/context.h"
#include "tiny_train.h"

namespace tessel {
namespace {

namespace fs = std::filesystem;
using testing::corpus;
using testing::losses;
using testing::tiny_yaml;

class TempDir {
 public:
  TempDir() : path_(fs::temp_directory_path() / fmt::format("tessel_train_{}_{}", ::getpid(), counter_++)) {
    fs::create_directories(path_);
  }
  ~TempDir() { fs::remove_all(path_); }
  std::string str() const { return path_.string(); }
  fs::path path() const { return path_; }

 private:
  static inline int counter_ = 0;
  fs::path path_;
};

class Resume : public ::testing::TestWithParam<std::string> {};

// 20 steps straight, or 10 + save + resume + 10: identical losses, bit for bit (one thread).
TEST_P(Resume, ContinuesTheExactTrajectory) {
  RunConfig cfg = parse_run_config(tiny_yaml(GetParam()), {}, "", "test");
  TrainResult straight = train(cfg, TrainOptions{.quiet = true});
  ASSERT_EQ(straight.steps.size(), 20u);

  TempDir dir;
  // Written before the step goes on (a background save still being written when the job dies
  // is lost, and the resume would start from the one before).
  RunConfig first = parse_run_config(tiny_yaml(GetParam()), {"train.save_every=10", "train.async_save=false"}, "",
                                     "test");
  // The first job saves at step 10 and then dies (an exception from the step callback).
  EXPECT_THROW(train(first, TrainOptions{.save_dir = dir.str(), .quiet = true},
                     [](const StepRecord& s) {
                       if (s.step == 12) throw std::runtime_error("the job was killed");
                     }),
               std::runtime_error);
  ASSERT_TRUE(fs::exists(dir.path() / "step-000010" / "model.safetensors"));
  ASSERT_TRUE(fs::exists(dir.path() / "step-000010" / "optimizer.safetensors"));
  ASSERT_TRUE(fs::exists(dir.path() / "step-000010" / "trainer.json"));
  TrainResult resumed = train(first, TrainOptions{.resume_dir = dir.str(), .quiet = true});
  ASSERT_EQ(resumed.steps.size(), 10u);
  EXPECT_EQ(resumed.steps.front().step, 10);
  std::vector<double> all = losses(straight);
  std::vector<double> want(all.begin() + 10, all.end());
  EXPECT_EQ(losses(resumed), want);  // exact equality, not approximate
  EXPECT_LT(straight.steps.back().loss, straight.steps.front().loss);
}

INSTANTIATE_TEST_SUITE_P(Models, Resume, ::testing::Values("gpt2", "llama"));

// Ctrl-C with --save: the step in progress finishes, a checkpoint of it is written, the run
// ends early, and resuming from it continues the trajectory of the run nobody stopped.
TEST(Train, StopsOnSigintWithACheckpointThatResumesExactly) {
  RunConfig cfg = parse_run_config(tiny_yaml("gpt2"), {"train.save_every=5"}, "", "test");
  TrainResult straight = train(cfg, TrainOptions{.quiet = true});
  TempDir dir;
  TrainResult stopped = train(cfg, TrainOptions{.save_dir = dir.str(), .quiet = true, .stop_on_signal = true},
                              [](const StepRecord& s) {
                                if (s.step == 6) ::raise(SIGINT);  // during the seventh step
                              });
  EXPECT_EQ(stopped.stopped_by, SIGINT);
  ASSERT_EQ(stopped.steps.size(), 7u);
  EXPECT_EQ(stopped.last_checkpoint, (dir.path() / "step-000007").string());
  EXPECT_TRUE(fs::exists(dir.path() / "step-000005"));   // the interval's save before it
  EXPECT_FALSE(fs::exists(dir.path() / "step-000020"));  // not the end of the run
  TrainResult resumed = train(cfg, TrainOptions{.resume_dir = dir.str(), .quiet = true});
  ASSERT_EQ(resumed.steps.size(), 13u);
  EXPECT_EQ(resumed.steps.front().step, 7);
  std::vector<double> all = losses(straight);
  EXPECT_EQ(losses(resumed), std::vector<double>(all.begin() + 7, all.end()));

  // The handlers are gone after the run: without stop_on_signal a signal is not intercepted.
  struct sigaction now {};
  ::sigaction(SIGINT, nullptr, &now);
  EXPECT_EQ(now.sa_handler, SIG_DFL);
}

// A second signal does not wait for the step: the process dies of it.
TEST(Train, ASecondSignalStopsAtOnce) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        StopSignals stop("stopping after this step");
        ::raise(SIGTERM);
        if (stop.requested() != SIGTERM) std::_Exit(3);
        ::raise(SIGTERM);
        std::_Exit(4);
      },
      ::testing::KilledBySignal(SIGTERM), "SIGTERM: stopping after this step");
}

TEST(Train, WritesMetricsAndHuggingFaceNamedCheckpoints) {
  TempDir dir;
  RunConfig cfg = parse_run_config(tiny_yaml("gpt2"), {"train.steps=4", "train.save_init=true"}, "", "test");
  std::string metrics = (dir.path() / "m.jsonl").string();
  TrainResult r = train(cfg, TrainOptions{.metrics_path = metrics, .save_dir = dir.str(), .quiet = true});
  std::ifstream in(metrics);
  int lines = 0;
  for (std::string line; std::getline(in, line); ++lines) {
    Json j = Json::parse(line);
    EXPECT_EQ(j.at("step").as_int(), lines);
    for (const char* key : {"loss", "lr", "grad_norm", "tokens_per_s"}) EXPECT_TRUE(j.find(key)) << key;
  }
  EXPECT_EQ(lines, 4);
  EXPECT_TRUE(fs::exists(dir.path() / "step-000000" / "model.safetensors"));  // save_init
  SafetensorsFile f = SafetensorsFile::open((dir.path() / "step-000004" / "model.safetensors").string());
  EXPECT_TRUE(f.contains("transformer.h.1.attn.c_attn.weight"));
  EXPECT_EQ(f.entry("transformer.h.1.attn.c_attn.weight").shape, (Shape{32, 96}));
  EXPECT_EQ(f.metadata().at("format"), "pt");
}

// A run that cannot write its checkpoints fails before its first step, not at its first save.
TEST(Train, AnUnusableSaveFolderFailsBeforeTheFirstStep) {
  TempDir dir;
  std::ofstream(dir.path() / "a-file") << "not a folder";
  RunConfig cfg = parse_run_config(tiny_yaml("gpt2"), {"train.steps=2"}, "", "test");
  int steps = 0;
  std::string error = "<no error>";
  try {
    train(cfg, TrainOptions{.save_dir = (dir.path() / "a-file" / "ckpt").string(), .quiet = true},
          [&](const StepRecord&) { ++steps; });
  } catch (const Error& e) {
    error = e.what();
  }
  EXPECT_NE(error.find("a-file/ckpt' cannot be created"), std::string::npos) << error;
  EXPECT_EQ(steps, 0);
  EXPECT_EQ(fs::directory_iterator(dir.path())->path().filename(), "a-file");  // no probe file left behind
}

// Resuming with other settings is allowed (a lower rate after a spike), but the run says which
// differ, as it will not continue the saved trajectory. A longer run, another save interval or
// a rate written another way ("3e-3" for "3.0e-3") is not a difference.
TEST(Train, ResumingWithOtherSettingsNamesThem) {
  TempDir dir;
  RunConfig first = parse_run_config(tiny_yaml("gpt2"), {"train.steps=2"}, "", "test");
  train(first, TrainOptions{.save_dir = dir.str(), .quiet = true});
  auto resume_log = [&](const std::vector<std::string>& sets) {
    RunConfig again = parse_run_config(tiny_yaml("gpt2"), sets, "", "test");
    ::testing::internal::CaptureStderr();
    train(again, TrainOptions{.resume_dir = dir.str(), .quiet = true});
    return ::testing::internal::GetCapturedStderr();
  };
  std::string log = resume_log({"train.steps=3", "train.global_batch=8", "train.micro_batch=4", "train.seed=6"});
  EXPECT_NE(log.find("differ from the checkpoint's"), std::string::npos) << log;
  EXPECT_NE(log.find("train.global_batch 4 -> 8, train.seed 5 -> 6"), std::string::npos)
      << log;
  EXPECT_EQ(resume_log({"train.steps=3", "train.lr=3e-3", "train.save_every=1"}), "");
  // Compared as the run uses them: a default given explicitly is no change.
  EXPECT_EQ(resume_log({"train.steps=3", "train.weight_decay=0.1", "train.optimizer=adamw"}), "");
  log = resume_log({"train.steps=3", "train.dropout=0", "train.min_lr=1e-4"});
  EXPECT_NE(log.find("model.dropout 0.1 -> 0, train.min_lr 0.0003 -> 0.0001"), std::string::npos) << log;
}

// Evaluating on validation tokens reads nothing the training reads and changes no state:
// the training losses are those of the run without it, bit for bit, and the validation loss
// comes at step 0, every eval_every steps and at the end.
TEST(Train, ValidationLeavesTheTrajectoryAlone) {
  RunConfig plain = parse_run_config(tiny_yaml("gpt2"), {"train.steps=12"}, "", "test");
  RunConfig with = parse_run_config(tiny_yaml("gpt2"), {"train.steps=12", "data.val_path=" + corpus(),
                                                        "train.eval_every=5", "train.eval_batches=2"}, "", "test");
  TrainResult a = train(plain, TrainOptions{.quiet = true});
  TrainResult b = train(with, TrainOptions{.quiet = true});
  EXPECT_EQ(losses(a), losses(b));
  ASSERT_EQ(b.validation.size(), 4u);
  std::vector<int64_t> at;
  for (const auto& [step, loss] : b.validation) at.push_back(step);
  EXPECT_EQ(at, (std::vector<int64_t>{0, 5, 10, 12}));
  EXPECT_LT(b.validation.back().second, b.validation.front().second);  // it learns the same text
  for (const StepRecord& r : b.steps) EXPECT_EQ(r.val_loss.has_value(), r.step == 4 || r.step == 9 || r.step == 11);
  EXPECT_TRUE(a.validation.empty());
}

// The validation loss is the mean loss over global batches 0, 1, ... of the sequential order
// of the validation tokens, in micro-batches, without dropout: here recomputed by hand on the
// model as initialised (the step-0 evaluation).
TEST(Train, ValidationLossIsTheMeanOverFixedBatchesWithoutDropout) {
  RunConfig cfg = parse_run_config(tiny_yaml("gpt2"), {"train.steps=1", "data.val_path=" + corpus(),
                                                       "train.eval_batches=3"}, "", "test");
  ASSERT_GT(cfg.model.gpt2.dropout, 0);  // tiny_yaml trains with dropout, evaluation must not
  TrainResult r = train(cfg, TrainOptions{.quiet = true});
  ASSERT_FALSE(r.validation.empty());

  std::unique_ptr<nn::LanguageModel> model = build_model(cfg);
  model->materialize(cfg.train.seed);
  model->train(false);
  NoGradGuard no_grad;
  TokenDataset val = TokenDataset::open(corpus(), TokenFormat::text);
  Sampler order(val.size(), cfg.train.seq_len, cfg.train.global_batch, SampleOrder::sequential, cfg.train.seed);
  double sum = 0;
  int n = 0;
  for (int64_t b = 0; b < 3; ++b) {
    Batch batch = make_batch(val, order, b, 0, cfg.train.global_batch);
    for (int64_t row = 0; row < cfg.train.global_batch; row += cfg.train.micro_batch, ++n)
      sum += nn::lm_loss(*model, view::slice(batch.inputs, 0, row, row + cfg.train.micro_batch),
                         view::slice(batch.targets, 0, row, row + cfg.train.micro_batch))
                 .item();
  }
  EXPECT_EQ(r.validation.front().first, 0);
  // The engine's forward sums in its own order: the same value to float32 rounding.
  EXPECT_NEAR(r.validation.front().second, sum / n, 1e-6 * sum / n);
}

// data.val_fraction holds out the tail of the file: training reads exactly what it would read
// from a file of the part before it.
TEST(Train, AHeldOutTailIsNotTrainedOn) {
  TempDir dir;
  std::ifstream in(corpus(), std::ios::binary);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const int64_t held = static_cast<int64_t>(static_cast<double>(text.size()) * 0.1);
  std::string head = (dir.path() / "head.txt").string();
  std::ofstream(head, std::ios::binary) << text.substr(0, text.size() - static_cast<size_t>(held));
  RunConfig split = parse_run_config(tiny_yaml("gpt2"), {"train.steps=6", "data.val_fraction=0.1"}, "", "test");
  RunConfig cut = parse_run_config(tiny_yaml("gpt2"), {"train.steps=6", "data.path=" + head}, "", "test");
  TrainResult a = train(split, TrainOptions{.quiet = true});
  EXPECT_EQ(losses(a), losses(train(cut, TrainOptions{.quiet = true})));
  EXPECT_EQ(a.validation.size(), 2u);  // before training and at the end
}

std::string config_error(const std::string& yaml, const std::vector<std::string>& sets = {}) {
  try {
    parse_run_config(yaml, sets, "", "cfg.yaml");
  } catch (const Error& e) {
    return e.what();
  }
  return "<no error>";
}

TEST(Config, RejectsUnknownKeysAndBadValuesNamingTheKeyPath) {
  std::string ok = tiny_yaml("gpt2");
  EXPECT_EQ(config_error(ok), "<no error>");
  std::string e = config_error(ok + "optimiser: {lr: 1}\n");
  EXPECT_NE(e.find("'optimiser'"), std::string::npos) << e;
  e = config_error(ok, {"train.learning_rate=0.1"});
  EXPECT_NE(e.find("'train.learning_rate'"), std::string::npos) << e;
  EXPECT_NE(e.find("lr"), std::string::npos) << e;  // lists the known keys
  e = config_error(ok, {"train.lr=fast"});
  EXPECT_NE(e.find("'train.lr' must be a number"), std::string::npos) << e;
  e = config_error(ok, {"train.micro_batch=3"});
  EXPECT_NE(e.find("train.global_batch"), std::string::npos) << e;
  e = config_error(ok, {"model.arch=rnn"});
  EXPECT_NE(e.find("model.arch"), std::string::npos) << e;
  e = config_error(ok, {"train.seq_len=64"});
  EXPECT_NE(e.find("n_positions"), std::string::npos) << e;
  e = config_error("model: {arch: gpt2}\n");
  EXPECT_NE(e.find("'data'"), std::string::npos) << e;
  e = config_error("model: {arch: gpt2\n");
  EXPECT_NE(e.find("not valid YAML"), std::string::npos) << e;
  e = config_error(ok, {"train.betas=[0.9]"});
  EXPECT_NE(e.find("train.betas"), std::string::npos) << e;
  e = config_error(ok, {"train.warmup=-1"});
  EXPECT_NE(e.find("'train.warmup'"), std::string::npos) << e;
  e = config_error(ok, {"train.dropout=-0.5"});
  EXPECT_NE(e.find("'train.dropout' must be in [0, 1)"), std::string::npos) << e;
}

// Model sizes and constants the model cannot be built or trained with: named by key path at
// load time, not later by the model in its own words or by a diverged loss.
TEST(Config, RejectsModelSizesNamingTheKeyPath) {
  const std::string gpt2 = tiny_yaml("gpt2"), llama = tiny_yaml("llama");
  struct Case {
    const std::string& yaml;
    std::string set, want;
  };
  const std::vector<Case> cases = {
      {gpt2, "model.n_head=3", "'model.n_embd' (32) must be a multiple of 'model.n_head' (3)"},
      {gpt2, "model.n_layer=0", "'model.n_layer' must be positive, got 0"},
      {gpt2, "model.layer_norm_epsilon=-1", "'model.layer_norm_epsilon' must be positive"},
      {gpt2, "model.resid_pdrop=1.5", "'model.resid_pdrop' must be in [0, 1)"},
      {gpt2, "model.initializer_range=-0.02", "'model.initializer_range' must be 0 or more"},
      {llama, "model.num_key_value_heads=3",
       "'model.num_attention_heads' (4) must be a multiple of 'model.num_key_value_heads' (3)"},
      {llama, "model.rope_theta=0", "'model.rope_theta' must be positive"},
      {llama, "model.rms_norm_eps=0", "'model.rms_norm_eps' must be positive"},
      {llama, "model.hidden_size=36", "'model.hidden_size' / 'model.num_attention_heads' = 36 / 4 = 9, must be even"},
      {llama, "model.intermediate_size=-1", "'model.intermediate_size' must be positive"}};
  for (const Case& c : cases) {
    std::string e = config_error(c.yaml, {c.set});
    EXPECT_NE(e.find(c.want), std::string::npos) << c.set << ": " << e;
  }
  EXPECT_EQ(config_error(llama), "<no error>");
  EXPECT_NE(config_error(llama, {"train.dropout=0.1"}).find("llama has no dropout layers"), std::string::npos);
  EXPECT_EQ(config_error(llama, {"train.dropout=0"}), "<no error>");
}

// A mixture of experts splits its sequences over cp only with dropless routing: a capacity ranks
// a whole sequence's assignments, which no cp rank holds. Refused naming both keys.
TEST(Config, MixtureOfExpertsTakesContextParallelOnlyDropless) {
  const std::string mixtral =
      "model: {arch: mixtral, num_hidden_layers: 2, hidden_size: 32, num_attention_heads: 4, num_key_value_heads: 2,"
      " intermediate_size: 32, vocab_size: 256, max_position_embeddings: 32, num_local_experts: 4}\n"
      "data: {path: " +
      corpus() +
      ", format: text}\n"
      "train: {steps: 2, global_batch: 4, micro_batch: 2, seq_len: 16, threads: 1}\n";
  EXPECT_EQ(config_error(mixtral, {"parallel.cp=2"}), "<no error>");
  EXPECT_EQ(config_error(mixtral, {"model.capacity_factor=1.25"}), "<no error>");
  const std::string e = config_error(mixtral, {"parallel.cp=2", "model.capacity_factor=1.25"});
  EXPECT_NE(e.find("'parallel.cp' is 2 with 'model.capacity_factor' 1.25"), std::string::npos) << e;
}

// Optimizer and run values that parse but would train wrongly (a negative rate at the end of the
// decay, 0/0 in AdamW) or quietly not as asked (a parallel degree of 0 fell back to one rank).
TEST(Config, RejectsTrainAndParallelValuesNamingTheKeyPath) {
  const std::string gpt2 = tiny_yaml("gpt2");
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"train.weight_decay=-0.1", "'train.weight_decay' must be 0 or more, got -0.1"},
      {"train.grad_clip=-1", "'train.grad_clip' must be 0 or more, got -1"},
      {"train.save_every=-5", "'train.save_every' must be 0 or more, got -5"},
      {"train.threads=-2", "'train.threads' must be 0 or more, got -2"},
      {"train.seed=-1", "'train.seed' must be 0 or more, got -1"},
      {"train.eps=0", "'train.eps' must be positive, got 0"},
      {"train.min_lr=-1e-4", "'train.min_lr' (-0.0001) must be in [0, 'train.lr' (0.003)]"},
      {"train.min_lr=1", "'train.min_lr' (1) must be in [0, 'train.lr' (0.003)]"},
      {"parallel.dp=0", "cfg.yaml: config parallel.dp must be at least 1, got 0"},
      {"parallel.tp=-1", "cfg.yaml: config parallel.tp must be at least 1, got -1"},
      {"parallel.tp=4", "config 'model.n_head' (2) must be a multiple of 'parallel.tp' (4)"},
      {"parallel.vpp=2", "parallel.vpp = 2 needs parallel.pp > 1"},
      {"parallel.sharding_stage=4", "parallel.sharding_stage must be 0, 1, 2 or 3, got 4"},
      {"parallel.schedule=GPipes", "unknown pipeline schedule 'GPipes'"},
      {"parallel.recompute=attention", "parallel.recompute must be none, selective or full, got 'attention'"},
      {"parallel.pp=3", "the model has 2 blocks, fewer than pp · vpp = 3 virtual stages"},
      {"train.eval_every=10", "'train.eval_every' needs validation tokens: 'data.val_path' or 'data.val_fraction'"},
      {"data.val_fraction=0.6", "'data.val_fraction' must be in [0, 0.5], got 0.6"},
      {"train.eval_batches=0", "'train.eval_batches' must be positive, got 0"},
      {"parallel.mesh=[pp, dp]", "--set 'parallel.mesh=[pp, dp]': parallel.mesh must name each of pp, dp and tp once"},
      {"parallel.mesh=[pp, dp, dp]", "parallel.mesh must name each of pp, dp and tp once (outermost first), got [pp, dp, dp]"},
      {"parallel.mesh=pp", "'parallel.mesh' must be a list"}};
  for (const auto& [set, want] : cases) {
    std::string e = config_error(gpt2, {set});
    EXPECT_NE(e.find(want), std::string::npos) << set << ": " << e;
  }
  // Each optimizer's own keys are checked only for that optimizer; the other ignores them and
  // says so (issue 52: momentum under AdamW was accepted without a word).
  EXPECT_EQ(config_error(gpt2, {"train.momentum=1.5"}), "<no error>");
  EXPECT_EQ(config_error(gpt2, {"train.optimizer=sgd", "train.eps=0"}), "<no error>");
  const std::string note = parse_run_config(gpt2, {"train.momentum=0.9"}, "", "test").train.optimizer_note;
  EXPECT_NE(note.find("'train.momentum' is a setting of train.optimizer sgd; this run's optimizer is adamw, which "
                      "ignores it (AdamW's momentum is train.betas[0])"),
            std::string::npos) << note;
  EXPECT_EQ(parse_run_config(gpt2, {}, "", "test").train.optimizer_note, "");
  std::string e = config_error(gpt2, {"train.optimizer=sgd", "train.momentum=1.5"});
  EXPECT_NE(e.find("'train.momentum' must be in [0, 1), got 1.5"), std::string::npos) << e;
  e = config_error(gpt2, {"train.optimizer=sgd", "train.momentum=0", "train.nesterov=true"});
  EXPECT_NE(e.find("'train.nesterov' needs 'train.momentum' above 0"), std::string::npos) << e;
  EXPECT_EQ(config_error(gpt2, {"train.optimizer=sgd", "train.momentum=0"}), "<no error>");
  EXPECT_EQ(config_error(gpt2, {"train.grad_clip=0", "train.weight_decay=0", "train.min_lr=0"}), "<no error>");
  EXPECT_EQ(config_error(gpt2, {"parallel.dp=2", "parallel.pp=2", "parallel.schedule=ZB-H1"}), "<no error>");
  for (const char* kind : {"none", "selective", "full"})
    EXPECT_EQ(config_error(gpt2, {fmt::format("parallel.recompute={}", kind)}), "<no error>") << kind;
  EXPECT_EQ(config_error(gpt2, {"parallel.dp=2", "parallel.mesh=[tp, dp, pp]"}), "<no error>");
  e = config_error(gpt2, {"data.val_fraction=0.1", "data.val_path=x.bin"});
  EXPECT_NE(e.find("'data.val_path' and 'data.val_fraction' are two sources of validation tokens"), std::string::npos)
      << e;
  EXPECT_EQ(config_error(gpt2, {"data.val_fraction=0.1", "train.eval_every=10"}), "<no error>");
}

// A value's error names where it came from: the --set that gave it, or its line in the file.
// Keys given twice, and settings that contradict each other, are refused rather than one of
// them silently winning.
TEST(Config, NamesTheOriginOfABadValueAndRefusesContradictions) {
  const std::string gpt2 = tiny_yaml("gpt2");
  std::string e = config_error(gpt2, {"train.lr=fast"});
  EXPECT_NE(e.find("--set 'train.lr=fast'"), std::string::npos) << e;
  e = config_error(gpt2, {"data.order=shuffled"});
  EXPECT_NE(e.find("--set 'data.order=shuffled': config 'data.order'"), std::string::npos) << e;
  e = config_error(gpt2, {"train.betas=[0.9, 1.5]"});
  EXPECT_NE(e.find("--set 'train.betas=[0.9, 1.5]': config 'train.betas' must be in [0, 1)"), std::string::npos) << e;
  e = config_error(gpt2 + "parallel: {dp: two}\n");
  EXPECT_NE(e.find("cfg.yaml:5: config 'parallel.dp' must be an integer, got 'two'"), std::string::npos) << e;
  e = config_error(gpt2, {"train.schedule=exponential"});
  EXPECT_NE(e.find("--set 'train.schedule=exponential'"), std::string::npos) << e;

  e = config_error(gpt2 + "log: {every: 2}\n");
  EXPECT_NE(e.find("cfg.yaml:5: config 'log' is given twice (first at line 4)"), std::string::npos) << e;
  e = config_error("train: {lr: 1, lr: 2}\n" + gpt2);
  EXPECT_NE(e.find("config 'train.lr' is given twice"), std::string::npos) << e;

  // parallel.micro_batches sets train.micro_batch (docs/parallel.md): a single-rank config
  // runs pipelined with --set parallel.micro_batches=N, as the demo does.
  EXPECT_EQ(parse_run_config(gpt2, {"parallel.micro_batches=4"}, "", "cfg.yaml").train.micro_batch, 1);
  e = config_error(gpt2, {"train.eval_batches=3"});
  EXPECT_NE(e.find("'train.eval_batches' needs validation tokens"), std::string::npos) << e;
  e = config_error(gpt2, {"train.threads=100000"});
  EXPECT_NE(e.find("'train.threads' is 100000"), std::string::npos) << e;

  // Several chunks per pipeline rank: the interleaved schedule is the default, another is refused.
  EXPECT_EQ(config_error(gpt2, {"model.n_layer=4", "parallel.pp=2", "parallel.vpp=2", "train.micro_batch=1"}),
            "<no error>");
  e = config_error(gpt2, {"model.n_layer=4", "parallel.pp=2", "parallel.vpp=2", "parallel.schedule=1F1B"});
  EXPECT_NE(e.find("only parallel.schedule VPP runs; got 1F1B"), std::string::npos) << e;
  e = config_error(gpt2, {"model.n_layer=4", "parallel.pp=2", "parallel.vpp=2", "train.micro_batch=4",
                          "train.global_batch=12"});
  EXPECT_NE(e.find("parallel.micro_batches (3) must be a multiple of parallel.pp (2)"), std::string::npos) << e;
}

// A short trial of a long run's config: warm-up may outlast the run, and the first log line says so.
TEST(Config, AcceptsAWarmUpLongerThanTheRunAndSaysSo) {
  RunConfig c = parse_run_config(tiny_yaml("gpt2"), {"train.steps=4", "train.warmup=30"}, "", "t");
  EXPECT_EQ(c.train.warmup, 30);
  std::string note = c.train.warmup_note();
  EXPECT_NE(note.find("train.warmup (30)"), std::string::npos) << note;
  EXPECT_NE(note.find("all 4 steps"), std::string::npos) << note;
  EXPECT_NE(note.find("0.0004"), std::string::npos) << note;  // 3e-3 * 4 / 30
  EXPECT_EQ(parse_run_config(tiny_yaml("gpt2"), {}, "", "t").train.warmup_note(), "");
}

TEST(Config, ReadsAHuggingFaceConfigJson) {
  TempDir dir;
  std::ofstream(dir.path() / "config.json") << R"({"model_type": "llama", "num_hidden_layers": 3, "hidden_size": 64,
    "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 96, "vocab_size": 300,
    "max_position_embeddings": 64, "rope_theta": 500000.0, "rms_norm_eps": 1e-05, "torch_dtype": "bfloat16",
    "architectures": ["LlamaForCausalLM"], "hidden_act": "silu"})";
  RunConfig c = parse_run_config("model: {hf_config: config.json}\ndata: {path: " + corpus() + "}\ntrain: {seq_len: 32}\n", {}, dir.str(), "t");
  EXPECT_EQ(c.model.arch, "llama");
  EXPECT_EQ(c.model.llama.num_hidden_layers, 3);
  EXPECT_EQ(c.model.llama.num_key_value_heads, 2);
  EXPECT_EQ(c.model.llama.rope_theta, 500000.0);
}

// GPT-2's three dropout rates as a config.json gives them (a fine-tune that turns attention
// dropout off, say); absent, embd_pdrop and attn_pdrop follow resid_pdrop; train.dropout sets
// all three.
TEST(Config, ReadsGpt2sThreeDropoutRates) {
  auto config = [](const std::string& rates, const std::vector<std::string>& sets = {}) {
    TempDir dir;
    std::ofstream(dir.path() / "config.json") << R"({"model_type": "gpt2", "n_layer": 2, "n_embd": 64, "n_head": 4,
      "vocab_size": 256, "n_positions": 64, )" << rates
                                              << "}";
    return parse_run_config("model: {hf_config: config.json}\ndata: {path: " + corpus() + "}\ntrain: {seq_len: 32}\n",
                            sets, dir.str(), "t.yaml");
  };
  auto parse = [&](const std::string& rates) { return config(rates).model.gpt2; };
  nn::Gpt2Config g = parse(R"("resid_pdrop": 0.1, "embd_pdrop": 0.2, "attn_pdrop": 0.0)");
  EXPECT_EQ(g.dropout, 0.1);
  EXPECT_EQ(g.embd_rate(), 0.2);
  EXPECT_EQ(g.attn_rate(), 0.0);
  g = parse(R"("resid_pdrop": 0.1)");
  EXPECT_EQ(g.embd_rate(), 0.1);
  EXPECT_EQ(g.attn_rate(), 0.1);
  // train.dropout replaces all three, and the run's log says which rates it replaced.
  RunConfig c = config(R"("resid_pdrop": 0.1, "embd_pdrop": 0.2, "attn_pdrop": 0.05)", {"train.dropout=0.05"});
  EXPECT_EQ(c.model.gpt2.dropout, 0.05);
  EXPECT_EQ(c.model.gpt2.embd_rate(), 0.05);
  EXPECT_EQ(c.model.gpt2.attn_rate(), 0.05);
  EXPECT_NE(c.train.dropout_note.find("train.dropout (0.05) replaces the model's dropout rates (model.resid_pdrop "
                                      "0.1, model.embd_pdrop 0.2)"),
            std::string::npos)
      << c.train.dropout_note;
  EXPECT_EQ(config(R"("resid_pdrop": 0.05)", {"train.dropout=0.05"}).train.dropout_note, "");
  try {
    parse(R"("resid_pdrop": 0.1, "attn_pdrop": 1.5)");
    ADD_FAILURE() << "attn_pdrop 1.5 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'model.attn_pdrop' must be in [0, 1), got 1.5"), std::string::npos)
        << e.what();
  }
}

// Mistral AI's Mixtral-8x7B-v0.1 config.json as Hugging Face publishes it: the MoE keys read as
// they are; what tessel does not build (router jitter, a sliding window) refused by key.
TEST(Config, ReadsMixtralsConfigJson) {
  const std::string mixtral = R"({"architectures": ["MixtralForCausalLM"], "attention_dropout": 0.0,
    "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02,
    "intermediate_size": 14336, "max_position_embeddings": 32768, "model_type": "mixtral",
    "num_attention_heads": 32, "num_experts_per_tok": 2, "num_hidden_layers": 32, "num_key_value_heads": 8,
    "num_local_experts": 8, "output_router_logits": false, "rms_norm_eps": 1e-05, "rope_theta": 1000000.0,
    "router_aux_loss_coef": 0.02, "sliding_window": null, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
    "transformers_version": "4.36.0.dev0", "use_cache": true, "vocab_size": 32000)";
  auto parse = [](const std::string& json) {
    TempDir dir;
    std::ofstream(dir.path() / "config.json") << json << "}";
    return parse_run_config("model: {hf_config: config.json}\ndata: {path: " + corpus() + "}\ntrain: {seq_len: 32}\n",
                            {}, dir.str(), "t.yaml");
  };
  RunConfig c = parse(mixtral);
  EXPECT_EQ(c.model.arch, "mixtral");
  EXPECT_EQ(c.model.llama.moe.num_experts, 8);
  EXPECT_EQ(c.model.llama.moe.top_k, 2);
  EXPECT_EQ(c.model.llama.moe.expert_hidden, 14336);
  EXPECT_EQ(c.model.llama.moe.aux_loss_coef, 0.02);
  EXPECT_EQ(c.model.llama.moe_every, 1);
  std::string windowed = mixtral;
  windowed.replace(windowed.find("\"sliding_window\": null"), 22, "\"sliding_window\": 4096");
  for (const auto& [json, want] : std::vector<std::pair<std::string, std::string>>{
           {mixtral + R"(, "router_jitter_noise": 0.01)", "\"router_jitter_noise\" is 0.01"},
           {windowed, "\"sliding_window\" is 4096"}}) {
    try {
      parse(json);
      ADD_FAILURE() << want << ": accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
    }
  }
  EXPECT_EQ(parse(mixtral + R"(, "router_jitter_noise": 0.0)").model.arch, "mixtral");
}

// A config.json whose architecture tessel does not build (another activation, untied or tied
// head against the family's rule, biases, scaled RoPE, other widths) is refused by key, not
// trained as something else under the same Hugging Face names; the family's own values pass.
TEST(Config, RefusesHuggingFaceConfigsOfAnotherArchitecture) {
  const std::string gpt2 = R"("model_type": "gpt2", "n_layer": 2, "n_embd": 64, "n_head": 4, "vocab_size": 256,
    "n_positions": 64)";
  const std::string llama = R"("model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64,
    "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 96, "vocab_size": 256,
    "max_position_embeddings": 64)";
  auto error_of = [](const std::string& json) {
    TempDir dir;
    std::ofstream(dir.path() / "config.json") << "{" << json << "}";
    try {
      parse_run_config("model: {hf_config: config.json}\ndata: {path: " + corpus() + "}\ntrain: {seq_len: 32}\n", {},
                       dir.str(), "t.yaml");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("<no error>");
  };
  const std::vector<std::pair<std::string, std::string>> refused = {
      {gpt2 + R"(, "activation_function": "relu")",
       "\"activation_function\" is relu, which tessel's gpt2 does not build: the MLP uses the tanh-approximated "
       "GELU (gelu_new or gelu_pytorch_tanh)"},
      {gpt2 + R"(, "n_inner": 100)",
       "\"n_inner\" is 100, which tessel's gpt2 does not build: the MLP is 4 x n_embd = 256"},
      {gpt2 + R"(, "tie_word_embeddings": false)", "\"tie_word_embeddings\" is false"},
      {llama + R"(, "hidden_act": "gelu")", "\"hidden_act\" is gelu"},
      {llama + R"(, "tie_word_embeddings": true)", "\"tie_word_embeddings\" is true"},
      {llama + R"(, "attention_bias": true)", "\"attention_bias\" is true"},
      {llama + R"(, "rope_scaling": {"rope_type": "llama3", "factor": 8.0})", "\"rope_scaling\" is "},
      {llama + R"(, "attention_dropout": 0.1)",
       "\"attention_dropout\" is 0.1, which tessel's llama does not build: attention has no dropout"},
      {llama + R"(, "head_dim": 32)",
       "\"head_dim\" is 32, which tessel's llama does not build: a head is hidden_size"}};
  for (const auto& [json, want] : refused) {
    std::string e = error_of(json);
    EXPECT_NE(e.find(want), std::string::npos) << json << ": " << e;
    EXPECT_NE(e.find("t.yaml: model.hf_config"), std::string::npos) << e;
  }
  EXPECT_EQ(error_of(gpt2 + R"(, "activation_function": "gelu_new", "n_inner": null, "tie_word_embeddings": true,
    "scale_attn_weights": true, "task_specific_params": {"text-generation": {"max_length": 50}})"), "<no error>");
  EXPECT_EQ(error_of(gpt2 + R"(, "n_inner": 256)"), "<no error>");
  EXPECT_EQ(error_of(llama +
                     R"(, "hidden_act": "silu", "rope_scaling": null, "attention_bias": false, "attention_dropout": 0.0,
    "mlp_bias": false, "tie_word_embeddings": false, "head_dim": 16)"),
            "<no error>");
}

}  // namespace
}  // namespace tessel
