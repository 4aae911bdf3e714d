#pragma once
// What every strategy that keeps a full copy of the model on each rank (DDP, ZeRO stages 1
// and 2, DataParallel's replicas) does alike: check what it was given, start every rank from rank 0's values, and keep
// the non-trainable buffers (BatchNorm statistics) equal to rank 0's.

#include <algorithm>
#include <string>
#include <string_view>
#include <vector>

#include "backends/backend.hpp"
#include "backends/comm/device_memory.hpp"
#include "backends/comm/error.hpp"

namespace accel {

// Each gradient matches its parameter, and everything lives where the communicator works.
inline void check_replica_params(std::string_view strategy, const Communicator& comm,
                                 const std::vector<ParamRef>& params) {
  for (const ParamRef& p : params) {
    ACCEL_CHECK_ARG(p.data.dtype == p.grad.dtype && p.data.count == p.grad.count,
                    std::string(strategy) + ": parameter '" + p.name +
                        "' has a gradient of another shape or dtype");
    ACCEL_CHECK_ARG(p.data.device == comm.device(),
                    std::string(strategy) + ": parameter '" + p.name + "' is in " +
                        (p.data.device == DeviceKind::cuda ? "CUDA" : "CPU") +
                        " memory, but the " + std::string(comm.backend_name()) +
                        " communicator works on " +
                        (comm.device() == DeviceKind::cuda ? "CUDA" : "CPU") + " buffers");
    ACCEL_CHECK_ARG(p.grad.data == nullptr || p.grad.device == p.data.device,
                    std::string(strategy) + ": the gradient of '" + p.name +
                        "' is on another device than the parameter");
  }
}

// Where a strategy keeps its own buffers (buckets, flat buffers): beside the parameters,
// on the communicator's device.
inline MemoryKind replica_memory(const Communicator& comm) {
  return comm.device() == DeviceKind::cuda ? MemoryKind::cuda : MemoryKind::host;
}

// Every full parameter as a segment the optimizer updates, ordered by param group, then
// parameter order (what DDP and DataParallel hand the optimizer).
inline std::vector<ParamSegment> full_segments(const std::vector<ParamRef>& params) {
  std::size_t groups = 0;
  for (const ParamRef& p : params) groups = std::max(groups, p.group + 1);
  std::vector<ParamSegment> out;
  for (std::size_t g = 0; g < groups; ++g) {
    std::size_t offset = 0;
    for (const ParamRef& p : params)
      if (p.group == g) {
        out.push_back({g, p.data, p.grad, offset});
        offset += p.data.count;
      }
  }
  return out;
}

// Broadcasts from rank 0, all operations in flight at once, then waits for them.
inline void broadcast_from_rank0(Communicator& comm, const std::vector<ParamRef>& params,
                                 const std::vector<Buffer>& buffers) {
  std::vector<WorkPtr> works;
  for (const ParamRef& p : params) works.push_back(comm.broadcast(p.data, 0));
  for (const Buffer& b : buffers) works.push_back(comm.broadcast(b, 0));
  for (auto& w : works) w->wait();
}

}  // namespace accel
