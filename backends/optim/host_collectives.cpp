#include "backends/optim/host_collectives.hpp"

#include <cstring>
#include <string>

#include "backends/comm/error.hpp"

#if ACCEL_HAVE_CUDA_KERNELS
#include "backends/optim/cuda/optim_kernels.hpp"
#endif

namespace accel {
namespace {

bool needs_staging(const Communicator& comm, const Buffer& b) {
  return comm.device() == DeviceKind::cuda && b.device == DeviceKind::cpu && b.count > 0;
}

// A device copy of a host buffer for the length of one collective.
class DeviceCopy {
 public:
  DeviceCopy(const Buffer& host, bool fill, const char* what) : host_(host) {
#if ACCEL_HAVE_CUDA_KERNELS
    (void)what;
    ptr_ = cuda::allocate_zeroed(host.bytes());
    if (fill) cuda::copy_to_device(ptr_, host.data, host.bytes());
#else
    (void)fill;
    throw InvalidArgument(std::string(what) +
                          ": the communicator moves CUDA memory, and this build has no CUDA "
                          "support to stage host values (ACCEL_WITH_CUDA=OFF)");
#endif
  }
  ~DeviceCopy() {
#if ACCEL_HAVE_CUDA_KERNELS
    cuda::free_device(ptr_);
#endif
  }
  DeviceCopy(const DeviceCopy&) = delete;
  DeviceCopy& operator=(const DeviceCopy&) = delete;
  Buffer view() const { return Buffer{ptr_, host_.count, host_.dtype, DeviceKind::cuda}; }
  void copy_back() {
#if ACCEL_HAVE_CUDA_KERNELS
    cuda::copy_to_host(host_.data, ptr_, host_.bytes());
#endif
  }

 private:
  Buffer host_;
  void* ptr_ = nullptr;
};

}  // namespace

void all_reduce_values(Communicator& comm, Buffer values, ReduceOp op) {
  if (!needs_staging(comm, values)) {
    comm.all_reduce(values, op)->wait();
    return;
  }
  DeviceCopy staged(values, true, "all_reduce of host values");
  comm.all_reduce(staged.view(), op)->wait();
  staged.copy_back();
}

void broadcast_values(Communicator& comm, Buffer values, int root) {
  if (!needs_staging(comm, values)) {
    comm.broadcast(values, root)->wait();
    return;
  }
  DeviceCopy staged(values, true, "broadcast of host values");
  comm.broadcast(staged.view(), root)->wait();
  staged.copy_back();
}

void all_gather_values(Communicator& comm, Buffer input, Buffer output) {
  if (!needs_staging(comm, input) && !needs_staging(comm, output)) {
    comm.all_gather(input, output)->wait();
    return;
  }
  DeviceCopy in(input, true, "all_gather of host values");
  DeviceCopy out(output, false, "all_gather of host values");
  comm.all_gather(in.view(), out.view())->wait();
  out.copy_back();
}

}  // namespace accel
