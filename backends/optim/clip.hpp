#pragma once
// PyTorch's clip_grad_norm_ over a strategy's synchronised gradients, whether each rank holds
// all of them (DDP) or its slice (ZeRO): the squares are summed in double in segment order,
// then over ranks when the gradients are sharded, so the norm is the same on every rank.

#include "backends/backend.hpp"

namespace accel {

// Scales every gradient by max_norm / (norm + 1e-6) when that is below 1; returns the norm
// before clipping.
double clip_grad_norm(Strategy& strategy, Communicator& comm, double max_norm);

}  // namespace accel
