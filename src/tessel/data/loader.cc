// Background batch assembly.
#include "tessel/data/loader.h"

#include <algorithm>

#include "tessel/core/context.h"
#include "tessel/core/error.h"
#include "tessel/core/view.h"

namespace tessel {

PackedDocuments pack_documents(const Tensor& inputs, int64_t eot) {
  TESSEL_CHECK(inputs.dim() == 2 && inputs.dtype() == DType::i64, "pack_documents: token ids must be i64 [rows, S], "
               "got {}", inputs.str());
  const int64_t rows = inputs.size(0), S = inputs.size(1);
  DeviceScope on(inputs.device());  // the results go where the ids are
  if (inputs.is_meta()) return {Tensor::empty({rows, S}, DType::i64), Tensor::empty({rows, S}, DType::i64)};
  // Host work on a host copy of the ids (they may live on a device).
  const std::vector<int64_t> x = inputs.to_vector<int64_t>();
  std::vector<int64_t> starts(x.size()), pos(x.size());
  for (int64_t r = 0; r < rows; ++r) {
    int64_t n = 0, start = 0;
    starts[r * S + n++] = 0;
    for (int64_t i = 0; i < S; ++i) {
      pos[r * S + i] = i - start;
      if (x[r * S + i] == eot && i + 1 < S) {
        start = i + 1;
        starts[r * S + n++] = start;
      }
    }
    std::fill(starts.begin() + r * S + n, starts.begin() + (r + 1) * S, S);
  }
  return {Tensor::from_vector(starts, {rows, S}), Tensor::from_vector(pos, {rows, S})};
}

Batch make_batch(const TokenDataset& data, const Sampler& sampler, int64_t step, int64_t first_row, int64_t rows) {
  const int64_t S = sampler.seq_len();
  TESSEL_CHECK(first_row >= 0 && rows >= 0 && first_row + rows <= sampler.global_batch(),
               "data loader: rows [{}, {}) outside the global batch of {}", first_row, first_row + rows,
               sampler.global_batch());
  Batch b;
  b.step = step;
  if (meta_mode()) {  // tracing: the batch's shape is all there is
    b.inputs = Tensor::empty({rows, S}, DType::i64);
    b.targets = Tensor::empty({rows, S}, DType::i64);
    return b;
  }
  // Assembled on the host, then placed on the rank's current device.
  std::vector<int64_t> in(static_cast<size_t>(rows * S)), tg(static_cast<size_t>(rows * S));
  std::vector<int64_t> buf(static_cast<size_t>(S + 1));
  for (int64_t r = 0; r < rows; ++r) {
    data.read(sampler.start(step, first_row + r), S + 1, buf.data());
    std::copy(buf.begin(), buf.end() - 1, in.begin() + r * S);
    std::copy(buf.begin() + 1, buf.end(), tg.begin() + r * S);
  }
  b.inputs = Tensor::from_vector(in, {rows, S});
  b.targets = Tensor::from_vector(tg, {rows, S});
  return b;
}

DataLoader::DataLoader(std::shared_ptr<const TokenDataset> data, Sampler sampler, LoaderOptions options)
    : data_(std::move(data)), sampler_(sampler), options_(options) {
  if (options_.rows < 0) options_.rows = sampler_.global_batch() - options_.first_row;
  options_.prefetch = std::max(1, options_.prefetch);
  // Validate on the caller's thread so a bad slice fails here, not later.
  TESSEL_CHECK(options_.first_row >= 0 && options_.first_row + options_.rows <= sampler_.global_batch(),
               "data loader: rows [{}, {}) outside the global batch of {}", options_.first_row,
               options_.first_row + options_.rows, sampler_.global_batch());
  thread_ = std::thread([this] { produce(); });
}

DataLoader::~DataLoader() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  changed_.notify_all();
  thread_.join();
}

void DataLoader::produce() {
  for (int64_t step = options_.start_step;; ++step) {
    {
      std::unique_lock lock(mutex_);
      changed_.wait(lock, [&] { return stop_ || static_cast<int>(ready_.size()) < options_.prefetch; });
      if (stop_) return;
    }
    try {
      Batch b = make_batch(*data_, sampler_, step, options_.first_row, options_.rows);
      std::lock_guard lock(mutex_);
      ready_.push_back(std::move(b));
    } catch (...) {
      std::lock_guard lock(mutex_);
      error_ = std::current_exception();
      changed_.notify_all();
      return;
    }
    changed_.notify_all();
  }
}

Batch DataLoader::next() {
  std::unique_lock lock(mutex_);
  changed_.wait(lock, [&] { return !ready_.empty() || error_ != nullptr; });
  if (ready_.empty()) std::rethrow_exception(error_);
  Batch b = std::move(ready_.front());
  ready_.pop_front();
  changed_.notify_all();
  return b;
}

}  // namespace tessel
