// Published large-scale training runs the cost model is checked against.
#pragma once

#include <string>
#include <vector>

#include "tessel/plan/planner.h"

namespace tessel::plan {

struct PublishedRun {
  std::string model;       // model preset
  std::string cluster;     // cluster preset with its device count
  int64_t global_batch = 0;
  Layout layout;           // as published (micro-batches follow from the batch)
  double tflops_per_device = 0;  // reported achieved TFLOP/s per GPU
  std::string source;
};

// Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU Clusters Using
// Megatron-LM", Table 1: GPT 1.7B to 1T on A100-80GB (DGX A100 nodes), full activation
// recomputation, the interleaved schedule where pipelined. The paper gives tp, pp, the GPU count
// and the batch; micro-batch size 1 and the chunk count per rank (vpp: the smallest divisor > 1
// of the layers per stage) are our assumptions where the table is silent.
std::vector<PublishedRun> narayanan2021_table1();

}  // namespace tessel::plan
