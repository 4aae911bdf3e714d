#pragma once
// Blocking collectives on LibTorch tensors over a communicator (every rank calls them with equal
// shapes): TorchAccelerator's gather, reduce, broadcast and pad_across_processes, and the
// adapter's own uses of them (full_optimizer_state.cpp). A dtype no communicator carries (bool,
// uint8 ...) travels as int.

#include <ATen/Tensor.h>

#include "backends/comm/communicator.hpp"

namespace accel::tensor_collectives {

// Every rank's tensor concatenated along dim 0, in rank order (a 0-dim tensor counts as one row).
at::Tensor gather(Communicator& comm, const at::Tensor& t);
// A reduced copy (sum, avg, min, max over ranks).
at::Tensor reduce(Communicator& comm, const at::Tensor& t, ReduceOp op);
// In place, from `root` (t must be contiguous).
void broadcast(Communicator& comm, at::Tensor& t, int root);
// Dim 0 padded with `value` up to the longest dim 0 on any rank.
at::Tensor pad_across_processes(Communicator& comm, const at::Tensor& t, double value);

}  // namespace accel::tensor_collectives
