#pragma once
// DataParallel (torch.nn.DataParallel, in one process with the local communicator): K replicas
// of the model, the batch split along dim 0, each replica's forward and backward on its own
// worker thread; at the boundary the gradients are summed into replica 0, the optimizer steps
// replica 0 and its parameters are copied to the others.
//  - replica 0 is the prepared model; replicas 1..K-1 are the front end's copies
//    (DataParallelOptions::replica_params: same parameters, order, dtypes and counts);
//  - sync_gradients(): replica 0's gradient becomes sum_k weight_k x gradient_k (set_weights,
//    default 1) over element ranges in parallel; the others are zeroed. Between boundaries each
//    replica accumulates its own. A second backward before the step adds to replica 0's
//    synchronised gradient, which set_weights first divides by replica 0's new weight;
//  - a ParamRef without gradient storage gets it here (grad_slot(replica, i));
//  - after_optimizer_step() / reload_parameters() copy replica 0's parameters, sync_buffers()
//    its buffers, to the others.
// GPU replicas (DataParallelOptions::cuda_devices): worker k runs with its device current;
// replica 0 computes on the communicator's compute stream, the others on their default
// streams, ordered by events; other devices' gradients are copied into staging buffers
// allocated once, summed by elementwise.hpp's weighted_sum, and copies back are queued on
// replica 0's stream, with no host waits.

#include <cstddef>
#include <functional>
#include <vector>

#include "backends/backend.hpp"
#include "backends/dataparallel/replica_pool.hpp"
#include "foundation/device_memory.hpp"
#include "foundation/reduce.hpp"

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
