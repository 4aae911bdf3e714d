#pragma once
// Collectives on a few host values (a gradient norm, an overflow flag, a seed, a metric) over
// any communicator. NCCL moves only GPU memory, so under a CUDA communicator the values travel
// through a device buffer of their size (a DeviceBuffer on the communicator's device, copied in
// and out on its compute stream); CPU communicators, and buffers already on the GPU, are called
// directly. The front end's, clip_grad_norm's, the loss scaler's and the checkpoints' small
// collectives all go through here. Needs the CUDA runtime (ACCEL_WITH_NCCL brings it), not the
// kernels.

#include <string>
#include <vector>

#include "backends/comm/communicator.hpp"

namespace accel {

void all_reduce_values(Communicator& comm, Buffer values, ReduceOp op);
void broadcast_values(Communicator& comm, Buffer values, int root);
void all_gather_values(Communicator& comm, Buffer input, Buffer output);
// Every rank's string, indexed by rank (descriptions, small blobs): their lengths, then their
// bytes padded to the longest.
std::vector<std::string> all_gather_strings(Communicator& comm, const std::string& mine);

}  // namespace accel
