// DataLoader: builds the batches of successive steps on a background thread, a few steps
// ahead, so reading and assembling tokens overlaps the training step. A loader reads rows
// [first_row, first_row + rows) of each global batch — the whole batch on one rank, its own
// slice under data parallelism.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>

#include "tessel/core/tensor.h"
#include "tessel/data/dataset.h"

namespace tessel {

struct Batch {
  int64_t step = 0;
  Tensor inputs;   // i64 [rows, S]
  Tensor targets;  // i64 [rows, S]: inputs shifted by one token
};

struct LoaderOptions {
  int64_t first_row = 0;
  int64_t rows = -1;       // -1: the whole global batch
  int64_t start_step = 0;  // resume point
  int prefetch = 2;        // batches built ahead
};

// Packed documents (data.pack_documents): a row holds several documents, each ended by the
// end-of-text token `eot` (which belongs to the document it ends), and attends within them.
// doc_starts [rows, S]: per row the positions where its documents start, ascending from 0,
// padded with S (sdpa's document starts); positions [rows, S]: each token's place in its
// document, restarting at 0 after every end-of-text token.
struct PackedDocuments {
  Tensor doc_starts, positions;  // i64
};
PackedDocuments pack_documents(const Tensor& inputs, int64_t eot);

// The batch of `step` (rows [first_row, first_row+rows)) built directly, without a thread.
Batch make_batch(const TokenDataset& data, const Sampler& sampler, int64_t step, int64_t first_row, int64_t rows);

class DataLoader {
 public:
  DataLoader(std::shared_ptr<const TokenDataset> data, Sampler sampler, LoaderOptions options = {});
  ~DataLoader();
  DataLoader(const DataLoader&) = delete;
  DataLoader& operator=(const DataLoader&) = delete;

  // The next step's batch; rethrows an error of the background thread.
  Batch next();

 private:
  void produce();

  std::shared_ptr<const TokenDataset> data_;
  Sampler sampler_;
  LoaderOptions options_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<Batch> ready_;
  std::exception_ptr error_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace tessel
