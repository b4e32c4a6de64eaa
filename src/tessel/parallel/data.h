// shard_dataloader: each data-parallel rank reads only its rows of the global batch. The global
// batch of step k is the same for every layout (the sampler's); micro-batch m is its rows
// [m·mb, (m+1)·mb), and data-parallel rank d reads its balanced slice of those rows — so a
// micro-batch is one distributed tensor [mb, S], batch-sharded over dp. With context parallel
// (cp > 1) the sequence is sharded over cp too: in order for all_to_all, and for ring in the
// load-balanced order (cp_order), whose token positions come with the batch.
#pragma once

#include <memory>
#include <vector>

#include "tessel/data/dataset.h"
#include "tessel/data/loader.h"
#include "tessel/parallel/layout.h"

namespace tessel::parallel {

struct MicroBatch {
  Tensor inputs, targets;  // distributed [mb, S] on the stage mesh, or undefined when not needed
  Tensor positions;        // distributed [mb, S] i64 like inputs when the tokens are out of order
                           // or documents are packed (positions restart per document)
  Tensor doc_starts;       // distributed [mb, S] i64, batch over dp, with packed documents
  int64_t first_row = 0;   // the micro-batch's first row in the global batch
};

// The order ring attention holds a sequence of `seq` tokens in over `cp` ranks: 2·cp chunks,
// rank r holding chunks r and 2·cp - 1 - r (one from each end, so a causal mask gives every
// rank the same work). Entry i is the position of the i-th token of that order; the identity
// for cp 1 or method all_to_all. The loss is a mean over tokens, so the order does not change it.
std::vector<int64_t> cp_order(int64_t seq, int64_t cp, const std::string& method);
// Columns `cols` of x [rows, S].
Tensor take_columns(const Tensor& x, const std::vector<int64_t>& cols);

class ShardedLoader {
 public:
  // want_inputs / want_targets: whether this rank's stages need them (first / last stage).
  ShardedLoader(std::shared_ptr<const TokenDataset> data, Sampler sampler, const Layout& layout, int64_t global_batch,
                bool want_inputs, bool want_targets);
  std::vector<MicroBatch> batch(int64_t step) const;
  // Packs documents separated by the end-of-text token `eot` (data.pack_documents): every
  // micro-batch then carries its document starts and positions, on every stage.
  void set_pack_documents(int64_t eot) { eot_ = eot; }

 private:
  std::shared_ptr<const TokenDataset> data_;
  Sampler sampler_;
  const Layout& layout_;
  int64_t global_batch_;
  bool want_inputs_, want_targets_;
  int64_t eot_ = -1;  // -1: no packing
};

}  // namespace tessel::parallel
