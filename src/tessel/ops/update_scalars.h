// The scalars of one AdamW step, computed once per parameter by the optimizer and read by
// every device's update kernel (plain C++: nvcc includes it too).
#pragma once

namespace tessel {

// p *= decay;  m += w1 (g' - m);  v = b2 v + w2 g'²;  p -= step_size · m / (sqrt(v)/bc2_sqrt + eps),
// with g' = g · grad_scale.
struct AdamWScalars {
  float decay, w1, b2, w2, step_size, bc2_sqrt, eps, grad_scale;
};

}  // namespace tessel
