#pragma once
// A test buffer on the device the communicator wants: for CPU communicators the host
// buffer itself; for NCCL a CUDA mirror filled before the operation and read back after it.

#include "backends/comm/communicator.hpp"
#include "tests/support/typed_values.hpp"

namespace accel::test {

class Staged {
 public:
  Staged(const Communicator& comm, OwnedBuffer& host);
  ~Staged();
  Staged(const Staged&) = delete;
  Staged& operator=(const Staged&) = delete;

  Buffer view() const { return device_view_; }
  void upload();    // host -> device
  void download();  // device -> host

 private:
  OwnedBuffer& host_;
  Buffer device_view_;
  bool on_device_ = false;
};

// Number of CUDA devices this process sees (0 without CUDA support or a driver).
int cuda_device_count();

}  // namespace accel::test
