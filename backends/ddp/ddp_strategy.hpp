#pragma once
// DDP: every rank holds a full replica; gradients are averaged over ranks in buckets while
// backward is still running, as PyTorch's DistributedDataParallel reducer does.
//
// Buckets: parameters in reverse order (the order backward produces their gradients), one
// dtype per bucket, the first bucket small (first_bucket_bytes) so communication starts early,
// the rest up to bucket_cap_bytes. Each bucket is one flat buffer allocated (and touched) once.
// A bucket is all-reduced as soon as all its gradients are ready, but strictly in bucket order,
// so every rank issues the same collective sequence whatever order its hooks fire in.
//
// A parameter whose gradient never arrives in an iteration (not used by this forward)
// contributes what its gradient buffer holds (zeros after zero_grad, or what earlier
// micro-batches accumulated): sync_gradients() reduces it with what is left, so the job never
// waits for it (PyTorch needs find_unused_parameters=True for that; here it is always on, and
// costs nothing when every parameter is used).
//
// Memory: the buckets live in the communicator's symmetric memory where it gives some (the
// shared-memory communicator with ACCEL_SHM_SYMMETRIC=1: its all-reduce reads the peers'
// buckets in place, staging nothing). Constructing the strategy is collective, as in PyTorch.
//
// Devices: the buckets live where the communicator works (host memory, or CUDA memory on the
// NCCL communicator's device), and so must the parameters and gradients. Gradient copies are
// queued on the communicator's compute stream, each all-reduce is ordered after them by an
// event (no host wait), and sync_gradients() leaves the compute stream waiting for the
// all-reduces: the host does not wait for the GPU (communicator.hpp, "Device buffers and
// streams"). With a CPU communicator all of this is plain memcpy and wait.
//
// Gradient storage (backend.hpp's contract): slots. grad_slot(0, i) is the parameter's slot
// inside its bucket (on the bucket's device). A front end that makes the gradient live there
// (PyTorch's gradient_as_bucket_view) saves both copies; a loop's own gradient buffer is
// copied into the bucket when ready and back after the all-reduce.

#include <cstddef>
#include <memory>
#include <mutex>
#include <vector>

#include "backends/backend.hpp"
#include "foundation/device_memory.hpp"

namespace accel {

class DdpStrategy final : public Strategy {
 public:
  // `buffers` are non-trainable state kept equal to rank 0's (see sync_buffers).
  DdpStrategy(Communicator& comm, std::vector<ParamRef> params, std::vector<Buffer> buffers = {},
              DdpOptions options = {});
  ~DdpStrategy() override;

  std::string_view name() const override { return "ddp"; }
  void prepare() override;
  void grad_ready(std::size_t index) override;
  void sync_gradients() override;
  void set_sync_enabled(bool enabled) override { sync_enabled_ = enabled; }
  bool sync_enabled() const override { return sync_enabled_; }

  // Broadcasts the buffers from rank 0 (before each forward, when broadcast_buffers is on).
  void sync_buffers() override;

  // Every full parameter, ordered by param group, then parameter order.
  std::vector<ParamSegment> segments() const override;
  bool gradients_sharded() const override { return false; }
  void after_optimizer_step() override {}
  std::size_t gradient_bytes() const override;

  GradientStorage gradient_storage() const override { return GradientStorage::slots; }
  // The slot of parameter i's gradient inside its bucket (replica 0 only: one per rank).
  Buffer grad_slot(int replica, std::size_t index) const override;
  // Parameter indices per bucket, in launch order (for tests and benchmarks).
  std::vector<std::vector<std::size_t>> bucket_layout() const;
  const std::vector<ParamRef>& params() const override { return params_; }

 private:
  struct Bucket;
  void launch_ready_buckets();  // with mutex_ held
  void copy_into_bucket(std::size_t index);

  Communicator& comm_;
  std::vector<ParamRef> params_;
  std::vector<Buffer> buffers_;
  DdpOptions options_;
  DeviceBuffer symmetric_;  // every bucket, where the communicator has symmetric memory
  std::vector<std::unique_ptr<Bucket>> buckets_;
  std::vector<std::size_t> bucket_of_;  // param index -> bucket index
  std::vector<std::size_t> offset_of_;  // param index -> element offset in its bucket
  std::vector<bool> ready_;             // this iteration
  std::size_t next_launch_ = 0;
  bool sync_enabled_ = true;
  std::mutex mutex_;  // hooks may fire on autograd's threads
};

}  // namespace accel
