#pragma once
// What every strategy that keeps a full copy of the model on each rank (DDP, ZeRO stages 1
// and 2, DataParallel's replicas) does alike: check what it was given, start every rank from rank
// 0's values, and keep the non-trainable buffers (BatchNorm statistics) equal to rank 0's.

#include <algorithm>
#include <string>
#include <string_view>
#include <vector>

#include "backends/backend.hpp"
#include "foundation/device_memory.hpp"
#include "foundation/error.hpp"

namespace accel {

// Each gradient matches its parameter, and everything is in `device`'s memory; `why` says why
// it must be ("the gloo communicator works on CPU buffers"). `who` starts the message.
inline void check_params_on(std::string_view who, const std::vector<ParamRef>& params,
                            DeviceKind device, std::string_view why) {
  for (const ParamRef& p : params) {
    ACCEL_CHECK_ARG(
        p.data.dtype == p.grad.dtype && p.data.count == p.grad.count,
        std::string(who) + ": parameter '" + p.name + "' has a gradient of another shape or dtype");
    ACCEL_CHECK_ARG(p.data.device == device,
                    std::string(who) + ": parameter '" + p.name + "' is in " +
                        (p.data.device == DeviceKind::cuda ? "CUDA" : "CPU") + " memory, but " +
                        std::string(why));
    ACCEL_CHECK_ARG(p.grad.data == nullptr || p.grad.device == p.data.device,
                    std::string(who) + ": the gradient of '" + p.name +
                        "' is on another device than the parameter");
  }
}

// check_params_on for a strategy over a communicator: everything where the communicator works.
inline void check_replica_params(std::string_view strategy, const Communicator& comm,
                                 const std::vector<ParamRef>& params) {
  check_params_on(strategy, params, comm.device(),
                  "the " + std::string(comm.backend_name()) + " communicator works on " +
                      (comm.device() == DeviceKind::cuda ? "CUDA" : "CPU") + " buffers");
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
