#pragma once
// DataParallel's replicas for the raw API: K-1 copies of the loop's model beside the model
// itself (replica 0), and forward_backward fanned out over the strategy's ReplicaSet.
// Contract: the copies are made once, at prepare, copy-constructed with replica k's CUDA
// device current (a copy constructor that allocates with cudaMalloc puts replica k on its
// GPU); their parameters (params_of, the model's order) go to the strategy through
// DataParallelOptions::replica_params. Each forward_backward splits the rows by torch.chunk's
// rule (chunk_rows), weights replica k's gradient by its share of the rows and runs fn on
// replica k in worker thread k. The Accelerator holds one ReplicatedModel and delegates.

#include <cstddef>
#include <memory>
#include <type_traits>
#include <vector>

#include "backends/backend.hpp"
#include "foundation/device_memory.hpp"

namespace accel {

// The chunks of `rows` per replica (chunk_rows), each replica's gradient weighted by its share
// of the rows in the coming reduction (all of an empty batch's weight on replica 0).
inline std::vector<Shard> weighted_chunks(ReplicaSet& replicas, std::size_t rows) {
  std::vector<Shard> chunks = chunk_rows(rows, replicas.count());
  std::vector<double> weights(chunks.size(), 0.0);
  for (std::size_t k = 0; k < chunks.size(); ++k)
    weights[k] = rows == 0 ? (k == 0 ? 1.0 : 0.0) : double(chunks[k].count) / double(rows);
  replicas.set_weights(std::move(weights));
  return chunks;
}

// What the Accelerator holds: the Model type is known only to the templates that use it.
class ReplicatedModel {
 public:
  virtual ~ReplicatedModel() = default;
  // Replica 0: the model given to prepare.
  virtual const void* model() const = 0;
};

template <typename Model>
class ModelReplicas final : public ReplicatedModel {
 public:
  // Copies `model` options.replicas - 1 times and appends each copy's params_of to
  // options.replica_params.
  template <typename ParamsOf>
  ModelReplicas(Model& model, ParamsOf& params_of, DataParallelOptions& options) : model_(&model) {
    for (int k = 1; k < options.replicas; ++k) {
      CudaDeviceGuard on(options.cuda_devices.empty() ? -1 : options.cuda_devices[std::size_t(k)]);
      copies_.push_back(std::make_unique<Model>(model));
      options.replica_params.push_back(params_of(*copies_.back()));
    }
  }

  const void* model() const override { return model_; }

  // fn(Model& replica, first_row, row_count, ready) on each replica with rows (ready: `none`,
  // the strategy reduces after the fan-out); returns the mean loss over all rows.
  template <typename Fn, typename Ready>
  float forward_backward(ReplicaSet& replicas, std::size_t rows, Fn& fn, Ready none) {
    const std::vector<Shard> chunks = weighted_chunks(replicas, rows);
    std::vector<double> losses(chunks.size(), 0.0);
    replicas.run([&](int k) {
      const Shard c = chunks[std::size_t(k)];
      if (c.count == 0) return;
      Model& replica = k == 0 ? *model_ : *copies_[std::size_t(k) - 1];
      losses[std::size_t(k)] = double(fn(replica, c.offset, c.count, none));
    });
    double total = 0;
    for (std::size_t k = 0; k < chunks.size(); ++k) total += losses[k] * double(chunks[k].count);
    return rows == 0 ? 0.0f : float(total / double(rows));
  }

 private:
  Model* model_;
  std::vector<std::unique_ptr<Model>> copies_;  // replicas 1..K-1
};

}  // namespace accel
