#pragma once
// DataParallel's replicas for the LibTorch adapter (torch.nn.DataParallel's job): K-1 clones
// of the prepared module beside the module itself (replica 0), their forward fanned out and
// their own graphs run backward on the strategy's ReplicaSet workers.
// Contract:
//  - construction (before prepare_parameters): clones the module (module->clone(), so it must
//    be Cloneable, or the loop's factory builds each replica and the values are copied in) and
//    hands each clone's trainable parameters and buffers to the strategy
//    (DataParallelOptions::replica_params / replica_buffers) with a worker_init that gives each
//    worker its share of the intra-op threads; replicas run on CPU threads only;
//  - attach (after prepare_parameters): replica k's parameters' .grad() alias the strategy's
//    grad_slot(k, i), re-pointed whenever autograd replaced them (values kept);
//  - forward: replica 0's train/eval flags go to the others, the rows are split by
//    chunk_rows, each replica's output becomes a leaf of the caller's graph;
//  - backward: after the caller's backward reached those leaves, each replica's graph runs
//    backward from its leaf's gradient on its worker.
// Random ops (dropout) in the replicas draw from LibTorch's one CPU generator from several
// threads at once: which replica draws which numbers is not deterministic.
// The TorchAccelerator holds one TorchReplicas and delegates.

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <ATen/Tensor.h>
#include <torch/nn/module.h>

#include "backends/backend.hpp"

namespace accel {

// The module's trainable parameters (requires_grad; a tied one once) with their names, in
// module order: the order the strategy knows them in.
std::vector<std::pair<std::string, at::Tensor>> trainable_parameters(torch::nn::Module& module);

// Builds one more replica of a module that is not Cloneable (a plain torch::nn::Module): the
// loop's own constructor, e.g. [] { return Net(); }; prepare copies the values into it.
using ReplicaFactory = std::function<std::shared_ptr<torch::nn::Module>()>;

// The loop's factory as a ReplicaFactory, whether it returns a ModuleHolder (TORCH_MODULE
// types), a std::shared_ptr or a module object.
template <typename Factory>
ReplicaFactory replica_factory(Factory make) {
  return [make = std::move(make)]() mutable -> std::shared_ptr<torch::nn::Module> {
    auto built = make();
    using Built = decltype(built);
    if constexpr (std::derived_from<Built, torch::nn::Module>)
      return std::make_shared<Built>(std::move(built));
    else if constexpr (requires { built.ptr(); })
      return built.ptr();
    else
      return built;
  };
}

class TorchReplicas {
 public:
  // `trainable`: the module's trainable parameter count, which every replica must match.
  // Replicas are module.clone()s, or made by `factory` when there is one.
  TorchReplicas(torch::nn::Module& module, std::size_t trainable, DataParallelOptions& options,
                const ReplicaFactory& factory);

  // Replica k's module (k >= 1; replica 0 is the prepared module).
  torch::nn::Module& module(int k);
  // Whether attach() ran: the strategy replicates (DATA_PARALLEL).
  bool attached() const { return attached_; }
  bool has_copies() const { return !copies_.empty(); }

  void attach(const Strategy& strategy);
  // forward(k, chunk) on worker k for every replica with rows, in the caller's grad mode and
  // CPU autocast state; outputs concatenated along dim 0.
  at::Tensor forward(ReplicaSet& replicas, std::int64_t rows,
                     const std::function<at::Tensor(int, Shard)>& forward);
  // Before the caller's backward: the head's gradient already is the whole batch's mean, so
  // replicas sum with weight 1 (warns once when no output of forward() is in the graph).
  void begin_backward(ReplicaSet& replicas);
  // After it: every replica's own graph backward, on its worker.
  void backward(ReplicaSet& replicas);
  // Zeroes every replica's gradient slots (zero_grad).
  void zero_grads();

 private:
  // The graph output of a replica's forward, and the leaf given to the loop in its place.
  struct Output {
    int replica;
    at::Tensor output, leaf;
  };
  void add_replica(torch::nn::Module& module, int k, std::size_t trainable,
                   DataParallelOptions& options, const ReplicaFactory& factory);
  void point_grads(std::size_t k);  // replica k's .grad() at its slots
  void follow_training_flags();

  std::vector<std::shared_ptr<torch::nn::Module>> copies_;  // replicas 1..K-1
  std::vector<std::vector<at::Tensor>> params_, grads_;     // [k - 1][i]
  std::vector<std::vector<torch::nn::Module*>> modules_;    // [replica][module], pre-order
  std::vector<Output> outputs_;                             // the forwards' since the last backward
  bool attached_ = false;
  bool warned_forward_ = false;
};

}  // namespace accel
