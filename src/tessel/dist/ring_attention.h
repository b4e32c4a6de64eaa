// Ring attention: sdpa with its sequence split over one mesh dim (context parallel), the dist
// layer's implementation of the SPMD rule's custom decision (ring_attention.cc).
#pragma once

#include <cstdint>

namespace tessel {

// What the calling rank's ring attention did since the last reset: the key/value blocks it
// passed on (forward and backward), their bytes, and the seconds it waited for them after its
// block's compute was done (the transfer time not hidden behind compute).
struct RingAttentionStats {
  int64_t transfers = 0, bytes = 0;
  double wait_s = 0, compute_s = 0;
};
RingAttentionStats& ring_attention_stats();

// Registers it with register_dist_impl (called by register_custom_ops).
void register_ring_attention();

}  // namespace tessel
