// Expert parallelism: how a mixture-of-experts block (nn::MoeBlock) computes on distributed
// tensors. The block works on this rank's sequences (gathered over tp when sequence parallel
// splits them; under context parallel, this rank's part of each, the sequences' routing counts
// summed over cp); its experts are split over the `ep` mesh dim on their expert dim, and
// the tokens travel to the rank holding their expert and back by all_to_all with per-rank
// counts over the ep group (differentiable: the backward is the same exchange reversed).
#pragma once

#include <memory>
#include <vector>

#include "tessel/comm/process_group.h"
#include "tessel/nn/moe.h"
#include "tessel/parallel/layout.h"

namespace tessel::parallel {

// The ExpertComm of every MoE block of a model laid out by `layout` on the stage mesh `mesh`.
std::shared_ptr<const nn::ExpertComm> expert_comm(const Layout& layout, const ProcessMesh& mesh);

// Rows of x [n, C]: consecutive blocks of send_rows[r] rows go to group rank r; returns the
// rows received, recv_rows[r] from rank r, in rank order. Differentiable.
Tensor exchange_rows(const Tensor& x, const std::vector<int64_t>& send_rows, const std::vector<int64_t>& recv_rows,
                     std::shared_ptr<ProcessGroup> group);

}  // namespace tessel::parallel
