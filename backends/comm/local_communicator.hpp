#pragma once
// The world of one: every collective is a copy or nothing, so a single process runs through
// exactly the same calls as a distributed one instead of a special branch.

#include "backends/comm/communicator.hpp"

namespace accel {

class LocalCommunicator final : public Communicator {
 public:
  explicit LocalCommunicator(Milliseconds timeout = kDefaultCommTimeout);
  ~LocalCommunicator() override;
  std::string_view backend_name() const override { return "local"; }

  // The world of one works wherever the parameters are. It starts on the CPU; the Accelerator
  // switches it to CUDA memory on `device` when it prepares parameters on a GPU, so the
  // strategies keep their buffers beside them, and its copies then run on the compute stream.
  void use_cuda_device(int device);
  DeviceKind device() const override {
    return cuda_device_ >= 0 ? DeviceKind::cuda : DeviceKind::cpu;
  }
  int cuda_device() const override { return cuda_device_; }
  // Its collectives move nothing between ranks: host values never need staging.
  bool accepts_host_buffers() const override { return true; }

 protected:
  void run_all_reduce(Buffer data, ReduceOp op, Milliseconds timeout) override;
  void run_broadcast(Buffer data, int root, Milliseconds timeout) override;
  void run_all_gather(Buffer input, Buffer output, const Parts& parts,
                      Milliseconds timeout) override;
  void run_reduce_scatter(Buffer input, Buffer output, ReduceOp op, const Parts& parts,
                          Milliseconds timeout) override;
  void run_barrier(Milliseconds timeout) override;
  void run_send(Buffer data, int dst, std::uint32_t tag, Milliseconds timeout) override;
  void run_recv(Buffer data, int src, std::uint32_t tag, Milliseconds timeout) override;

 private:
  int cuda_device_ = -1;  // -1: CPU buffers
};

}  // namespace accel
