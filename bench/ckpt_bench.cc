// Checkpoint speed beside the disk's own, measured in the same run: R thread ranks (dp=R, ZeRO
// stage 1: each rank holds 1/R of the optimizer states) of a GPT-2 of the given shape save a
// checkpoint (fsync'd, published) and load it back; the bytes each process wrote or read per
// second are printed beside a plain sequential write (write + fsync) and read of a file of the
// size one rank writes, in the same folder, just before; both reads come from the disk (the
// files are dropped from the page cache with posix_fadvise first). Per process, and all ranks
// together (they share the disk). Then a run with save_every = 1 saves in the background: how
// long each save held training (planning, and the next update waiting for the writer) beside
// the time of a synchronous save of the same state. Medians of --repeats.
//
//   build/release/bench/ckpt_bench [--ranks 2] [--layers 12] [--width 768] [--repeats 3] [--bg-seq 128] [--bg-every 2] [--dir DIR]
#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <vector>

#include "bench_util.h"
#include "tessel/cli/config.h"
#include "tessel/comm/thread_backend.h"
#include "tessel/comm/world.h"
#include "tessel/engine/engine.h"

using namespace tessel;

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using tessel::bench::median;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// Sequential write (fsync'd) and read of `bytes` in 8 MiB blocks: bytes per second.
std::pair<double, double> disk_rates(const std::string& path, int64_t bytes) {
  std::vector<char> block(8 << 20, 'x');
  auto t0 = Clock::now();
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  for (int64_t left = bytes; left > 0;) {
    const ssize_t w = ::write(fd, block.data(), static_cast<size_t>(std::min<int64_t>(left, static_cast<int64_t>(block.size()))));
    if (w <= 0) std::abort();
    left -= w;
  }
  ::fsync(fd);
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);  // written out: the read below comes from the disk
  ::close(fd);
  const double write_s = seconds_since(t0);
  t0 = Clock::now();
  fd = ::open(path.c_str(), O_RDONLY);
  while (::read(fd, block.data(), block.size()) > 0) {
  }
  ::close(fd);
  const double read_s = seconds_since(t0);
  fs::remove(path);
  return {static_cast<double>(bytes) / write_s, static_cast<double>(bytes) / read_s};
}

// Drops the folder's files from the page cache (they are written out), so that a load reads the disk.
void evict(const fs::path& dir) {
  for (const auto& e : fs::directory_iterator(dir)) {
    const int fd = ::open(e.path().c_str(), O_RDONLY);
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    ::close(fd);
  }
}

int64_t folder_bytes(const fs::path& dir) {
  int64_t total = 0;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.is_regular_file()) total += static_cast<int64_t>(e.file_size());
  return total;
}

}  // namespace

int main(int argc, char** argv) {
  int ranks = 2, layers = 12, width = 768, repeats = 3, bg_seq = 128, bg_every = 2;
  std::string dir = (fs::temp_directory_path() / "tessel-ckpt-bench").string();
  for (int i = 1; i < argc; ++i) {
    auto next = [&] { return i + 1 < argc ? argv[++i] : (std::exit(2), ""); };
    if (std::strcmp(argv[i], "--ranks") == 0) ranks = std::atoi(next());
    else if (std::strcmp(argv[i], "--layers") == 0) layers = std::atoi(next());
    else if (std::strcmp(argv[i], "--width") == 0) width = std::atoi(next());
    else if (std::strcmp(argv[i], "--repeats") == 0) repeats = std::atoi(next());
    else if (std::strcmp(argv[i], "--dir") == 0) dir = next();
    else if (std::strcmp(argv[i], "--bg-seq") == 0) bg_seq = std::atoi(next());
    else if (std::strcmp(argv[i], "--bg-every") == 0) bg_every = std::atoi(next());
    else {
      std::printf("usage: ckpt_bench [--ranks R] [--layers L] [--width W] [--repeats N] [--bg-seq T] [--bg-every K] [--dir DIR]\n"
                  "Checkpoint save/load throughput per process beside the disk's, and background-save blocking.\n");
      return std::strcmp(argv[i], "--help") == 0 ? 0 : 2;
    }
  }
  fs::remove_all(dir);
  fs::create_directories(dir);

  RunConfig cfg = load_run_config(std::string(TESSEL_SOURCE_DIR) + "/configs/gpt2-tiny.yaml",
                                  {fmt::format("model.n_layer={}", layers), fmt::format("model.n_embd={}", width),
                                   "model.n_head=12", "model.vocab_size=50257", "model.n_positions=1024",
                                   "train.seq_len=32", fmt::format("train.global_batch={}", 2 * ranks),
                                   fmt::format("train.micro_batch={}", 2 * ranks), "train.steps=4", "train.warmup=0",
                                   "train.save_every=0", "log.every=1000"});
  cfg.parallel.dp = ranks;
  cfg.parallel.sharding_stage = 1;
  cfg.train.threads = 1;

  // Each repeat measures the disk right before the save and the load, so that both see the
  // same load on a shared machine; the ratios are taken per repeat.
  std::vector<double> save_s, load_s, save_ratio, load_ratio, disk_w, disk_r;
  int64_t written = 0, read = 0;
  std::mutex mu;
  spawn(ranks, [&](int rank) {
    Engine engine(cfg);
    for (int r = 0; r < repeats; ++r) {
      const std::string out = fmt::format("{}/run{}", dir, r);
      std::pair<double, double> disk;
      if (rank == 0) {
        // A file of what one rank writes: the checkpoint's size over the ranks (a first save
        // gives it; before it, the parameters and optimizer states held).
        const int64_t bytes = written > 0 ? written : int64_t{256} << 20;
        disk = disk_rates(dir + "/disk-reference", bytes);
      }
      world_group()->barrier();
      auto t0 = Clock::now();
      const std::string step = engine.save(out);
      const double s = seconds_since(t0);
      if (rank == 0) evict(step);
      world_group()->barrier();
      t0 = Clock::now();
      engine.load(step);
      const double l = seconds_since(t0);
      world_group()->barrier();
      std::lock_guard<std::mutex> lock(mu);
      if (rank == 0) {
        written = folder_bytes(step) / ranks;
        read = engine.resume_bytes_read();
        save_s.push_back(s);
        load_s.push_back(l);
        disk_w.push_back(disk.first);
        disk_r.push_back(disk.second);
        save_ratio.push_back(static_cast<double>(written) / s / disk.first);
        load_ratio.push_back(static_cast<double>(read) / l / disk.second);
        fs::remove_all(out);
      }
    }
  });
  std::printf("checkpoint of GPT-2 %d layers x %d wide (%.1fM parameters with AdamW state: %.0f MiB per rank "
              "written), %d thread ranks, dp%d ZeRO-1, median of %d\n", layers, width,
              static_cast<double>(build_model(cfg)->num_parameters()) / 1e6, static_cast<double>(written) / (1 << 20),
              ranks, ranks, repeats);
  std::printf("  %-40s %12s %14s %12s %8s %8s\n", "", "MiB/s/rank", "all ranks", "disk MiB/s", "rank", "all");
  std::printf("  %-40s %12.0f %14.0f %12.0f %7.0f%% %7.0f%%\n", "save (fsync'd, published)",
              static_cast<double>(written) / median(save_s) / (1 << 20),
              static_cast<double>(ranks) * static_cast<double>(written) / median(save_s) / (1 << 20),
              median(disk_w) / (1 << 20), 100 * median(save_ratio), 100 * ranks * median(save_ratio));
  std::printf("  %-40s %12.0f %14.0f %12.0f %7.0f%% %7.0f%%\n", "load (checksums checked; from disk)",
              static_cast<double>(read) / median(load_s) / (1 << 20),
              static_cast<double>(ranks) * static_cast<double>(read) / median(load_s) / (1 << 20),
              median(disk_r) / (1 << 20), 100 * median(load_ratio), 100 * ranks * median(load_ratio));

  // Background saves every --bg-every steps of a run whose steps have real work (--bg-seq tokens
  // per row, 2 rows per rank): training is held for the plan, for whatever the writer has not
  // copied off the live tensors when the next update begins, and — when saves come faster than
  // the disk takes them — for the previous save to finish.
  RunConfig bg = cfg;
  bg.train.save_every = bg_every;
  bg.train.steps = 2 + bg_every * repeats;
  bg.train.seq_len = bg_seq;
  fs::remove_all(dir + "/bg");
  const ParallelTrainResult r = train_parallel_threads(
      bg, ranks, ParallelTrainOptions{.base = TrainOptions{.save_dir = dir + "/bg", .progress = false, .quiet = true}});
  std::vector<double> step_s;
  for (const StepRecord& st : r.train.steps) step_s.push_back(st.seconds);
  std::printf("  background save every %d steps (steps of %d x %d tokens per rank, median %.2f s): training held %.3f s "
              "(median of %zu) vs a synchronous save %.3f s: %.1f%%\n", bg_every, 2, bg_seq, median(step_s),
              median(r.save_block_seconds),
              r.save_block_seconds.size(), median(save_s), 100 * median(r.save_block_seconds) / median(save_s));
  fs::remove_all(dir);
  return 0;
}
