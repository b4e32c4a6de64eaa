// The dist layer's own implementations of ops whose SPMD rule asks for one (custom decisions):
// calls whose result depends on data held by other ranks, so the local kernel cannot give it.
#pragma once

namespace tessel {

// Registers every implementation with register_dist_impl (called once, with the dispatcher).
void register_custom_ops();

}  // namespace tessel
