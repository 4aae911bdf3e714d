#include "backends/comm/host_collectives.hpp"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>

#include "foundation/device_memory.hpp"

namespace accel {
namespace {

bool needs_staging(const Communicator& comm, const Buffer& b) {
  return !comm.accepts_host_buffers() && b.device == DeviceKind::cpu && b.count > 0;
}

// A device copy of a host buffer for the length of one collective, on the communicator's
// device, filled and read back on its compute stream (device_memory.hpp's DeviceBuffer and
// copy_buffer, as everything else that moves device memory).
class DeviceCopy {
 public:
  DeviceCopy(Communicator& comm, const Buffer& host, bool fill)
      : comm_(comm),
        host_(host),
        device_(host.count, host.dtype, MemoryKind::cuda, comm.cuda_device()) {
    if (fill) copy_buffer(device_.view(), host_, comm_.compute_stream());
  }
  Buffer view() const { return device_.view(); }
  // After the collective (the host waits for it, so its error names it), the host waits for
  // the compute stream too (bounded by the communicator's timeout), so the copy into pageable
  // memory below finds it idle.
  void copy_back(Work& work, const char* what) {
    work.wait(comm_.timeout());
    synchronize_stream(compute_context(comm_), "rank " + std::to_string(comm_.rank()) + ": " +
                                                   what + " (staged through GPU memory)");
    copy_buffer(host_, device_.view(), comm_.compute_stream());
  }

 private:
  Communicator& comm_;
  Buffer host_;
  DeviceBuffer device_;
};

}  // namespace

void all_reduce_values(Communicator& comm, Buffer values, ReduceOp op) {
  if (!needs_staging(comm, values)) {
    comm.all_reduce(values, op)->wait();
    return;
  }
  DeviceCopy staged(comm, values, true);
  staged.copy_back(*comm.all_reduce(staged.view(), op), "all_reduce of host values");
}

void broadcast_values(Communicator& comm, Buffer values, int root) {
  if (!needs_staging(comm, values)) {
    comm.broadcast(values, root)->wait();
    return;
  }
  DeviceCopy staged(comm, values, true);
  staged.copy_back(*comm.broadcast(staged.view(), root), "broadcast of host values");
}

void all_gather_values(Communicator& comm, Buffer input, Buffer output) {
  if (!needs_staging(comm, input) && !needs_staging(comm, output)) {
    comm.all_gather(input, output)->wait();
    return;
  }
  DeviceCopy in(comm, input, true);
  DeviceCopy out(comm, output, false);
  out.copy_back(*comm.all_gather(in.view(), out.view()), "all_gather of host values");
}

std::vector<std::string> all_gather_strings(Communicator& comm, const std::string& mine) {
  const auto world = std::size_t(comm.world_size());
  const std::int64_t length = std::int64_t(mine.size());
  std::vector<std::int64_t> lengths(world);
  all_gather_values(comm, buffer_of(std::span(&length, 1)), buffer_of(std::span(lengths)));
  std::int64_t longest = 0;
  for (const std::int64_t n : lengths) longest = std::max(longest, n);
  std::vector<std::string> strings(world);
  if (longest == 0) return strings;
  // The bytes travel as 8-byte words (there is no byte dtype), each rank's padded alike.
  const auto words = std::size_t(longest + 7) / 8;
  std::vector<std::int64_t> padded(words, 0), all(words * world);
  std::memcpy(padded.data(), mine.data(), mine.size());
  all_gather_values(comm, buffer_of(std::span(padded)), buffer_of(std::span(all)));
  for (std::size_t r = 0; r < world; ++r)
    strings[r].assign(reinterpret_cast<const char*>(all.data() + r * words),
                      std::size_t(lengths[r]));
  return strings;
}

}  // namespace accel
