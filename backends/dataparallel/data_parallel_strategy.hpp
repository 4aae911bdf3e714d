#pragma once
// DataParallel (torch.nn.DataParallel's scheme, in one process): K replicas of the model, the
// batch split along dimension 0, each replica's forward and backward on its own worker thread,
// then the replicas' gradients summed into replica 0, the optimizer stepping replica 0, and
// replica 0's parameters copied to the others. The world is one process (the local
// communicator). Replicas are CPU threads, or GPUs (DataParallelOptions::cuda_devices): then
// worker k runs with replica k's device current, and the reduction and copies are queued on
// replica 0's device without host waits:
//  - replica 0 computes on the communicator's compute stream (Accelerator::set_cuda_stream),
//    replica k > 0 on its device's legacy default stream; stream_wait orders them (events);
//  - a gradient of a replica on another device is copied to replica 0's device first
//    (cudaMemcpyAsync between devices: a peer copy where the GPUs allow it, else through the
//    host), into staging buffers allocated once; replicas sharing replica 0's device are read
//    in place;
//  - the weighted sum is elementwise.hpp's weighted_sum (a kernel on replica 0's stream), and
//    parameters and buffers go back with copies on replica 0's stream, which each replica's
//    stream then waits for.
//
// Replica 0 is the model the loop prepared (its ParamRefs as given to the Accelerator);
// replicas 1..K-1 are copies the front end made (DataParallelOptions::replica_params, same
// parameters in the same order, same dtypes and counts). Gradients:
//  - each replica's backward adds into its own gradient buffers; grad_ready does nothing (the
//    reduction waits for every replica anyway, so there is nothing to overlap);
//  - sync_gradients() at an accumulation boundary: replica 0's gradient becomes
//    sum_k weight_k x gradient_k (set_weights; 1 by default), over element ranges in
//    parallel on the workers, and the other replicas' gradients are zeroed. Between
//    boundaries (set_sync_enabled(false)) every replica accumulates its own, so the sum at the
//    boundary covers the whole accumulation window. A second backward before the optimizer
//    step (a GAN's discriminator: real, then fake batch) adds to replica 0's synchronised
//    gradient, which counts once: set_weights first divides it by the new weight of
//    replica 0, which the next reduction multiplies back;
//  - a ParamRef given without gradient storage (backend.hpp's contract: slots) gets storage
//    allocated here (grad_slot(replica, i)), which the LibTorch adapter makes the tensors'
//    .grad().
// Parameters: after_optimizer_step() and reload_parameters() copy replica 0's values to the
// others. Buffers (BatchNorm statistics): sync_buffers() copies replica 0's to the others; the
// front end calls it before each parallel forward, so buffers follow replica 0.

#include <cstddef>
#include <functional>
#include <vector>

#include "backends/backend.hpp"
#include "backends/dataparallel/replica_pool.hpp"
#include "core/device_memory.hpp"
#include "core/reduce.hpp"

namespace accel {

class DataParallelStrategy final : public Strategy, public ReplicaSet {
 public:
  // `comm` must be a world of one: DataParallel is one process.
  DataParallelStrategy(Communicator& comm, std::vector<ParamRef> params,
                       std::vector<Buffer> buffers, DataParallelOptions options);
  ~DataParallelStrategy() override;

  std::string_view name() const override { return "data_parallel"; }
  // Copies replica 0's parameters and buffers to the others.
  void prepare() override;
  void grad_ready(std::size_t) override {}
  void sync_gradients() override;
  void set_sync_enabled(bool enabled) override { sync_enabled_ = enabled; }
  bool sync_enabled() const override { return sync_enabled_; }
  // Copies replica 0's buffers to the other replicas.
  void sync_buffers() override;
  const std::vector<ParamRef>& params() const override { return replicas_[0]; }

  // Replica 0's full parameters, as DDP hands out in a world of one.
  std::vector<ParamSegment> segments() const override;
  bool gradients_sharded() const override { return false; }
  // Copies replica 0's updated parameters to the others.
  void after_optimizer_step() override {
    reduced_ = false;  // the loop zeroes its gradients for the next step
    copy_parameters();
  }
  void reload_parameters() override { copy_parameters(); }
  // The gradient storage allocated here (for ParamRefs given without one), and the staging
  // copies of other devices' gradients on replica 0's GPU.
  std::size_t gradient_bytes() const override { return gradient_bytes_; }

  GradientStorage gradient_storage() const override { return GradientStorage::slots; }
  // Parameter i's gradient storage of replica k (allocated here or the one given).
  Buffer grad_slot(int replica, std::size_t index) const override;
  ReplicaSet* replicas() override { return this; }

  int count() const override { return int(replicas_.size()); }
  const std::vector<ParamRef>& replica_params(int k) const { return replicas_[std::size_t(k)]; }
  // Runs fn(k) for every replica k on worker thread k, with replica k's CUDA device current
  // for GPU replicas; see ReplicaPool::run.
  void run(const std::function<void(int)>& fn) override;
  // Replica k's CUDA device, or -1 for CPU replicas.
  int cuda_device(int replica) const;
  // Where replica k's GPU work goes (see above); the default context for CPU replicas.
  DeviceContext replica_context(int replica) const;
  // The weight of each replica's gradient in the next reductions (K values; default all 1).
  // Changing them while gradients accumulate first folds what was accumulated under the old
  // weights into replica 0 (scaled so the final sum is still exact up to rounding).
  void set_weights(std::vector<double> weights) override;

 private:
  bool on_gpu() const { return !devices_.empty(); }
  void copy_parameters();
  // Copies replica 0's views[0][i] to every views[k][i]: on the workers (CPU) or on replica
  // 0's stream (GPU).
  void copy_from_replica0(const std::vector<std::vector<Buffer>>& views);
  // Replica 0's gradient := sum_k weight_k x gradient_k (divided by new_weight0 when folding
  // mid-accumulation), others zeroed.
  void reduce_into_replica0(double divide_by = 1.0);
  void reduce_on_gpu(double divide_by);

  Communicator& comm_;
  std::vector<std::vector<ParamRef>> replicas_;
  std::vector<std::vector<Buffer>> buffers_;
  std::vector<int> devices_;               // per replica; empty for CPU replicas
  std::vector<DeviceBuffer> owned_grads_;  // gradient storage for ParamRefs given without
  // GPU replicas on another device than replica 0: [k - 1][i], replica k's gradient i on
  // replica 0's device (empty vectors for replicas on replica 0's device).
  std::vector<std::vector<DeviceBuffer>> staging_;
  std::size_t gradient_bytes_ = 0;
  std::vector<double> weights_;
  bool sync_enabled_ = true;
  bool accumulated_ = false;  // backward ran since the last reduction
  bool reduced_ = false;      // replica 0 holds a reduction and no optimizer step followed yet
  ReplicaPool pool_;
};

}  // namespace accel
