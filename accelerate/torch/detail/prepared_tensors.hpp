#pragma once
// One model the LibTorch adapter prepared (TorchAccelerator::prepare): its tensors as the
// strategy sees them, the hooks reporting their gradients, and its wrapped optimizer. Private
// to the adapter's .cpp files; the adapter holds one per prepared model, index for index with
// the Accelerator's.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include <ATen/Tensor.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include "accelerate/torch/accelerated_optimizer.hpp"
#include "accelerate/torch/detail/model_gradients.hpp"
#include "accelerate/torch/zero3/detail/zero3_units.hpp"

namespace torch::autograd {
struct Node;
}

namespace accel {

struct PreparedTensors {
  std::size_t index = 0;                      // the Accelerator's model index
  const torch::nn::Module* module = nullptr;  // the root module (null: TorchScript)
  std::vector<at::Tensor> params;             // the trainable parameters, in strategy order
  // ZeRO: the optimizer whose groups hold this rank's slices, and the slices.
  torch::optim::Optimizer* sharded_optimizer = nullptr;
  std::vector<at::Tensor> slices;
  std::vector<at::Tensor> buffers;
  std::vector<void*> buffer_data;  // to detect buffers replaced after prepare
  // Kept alive: the hooks live on them.
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators;
  std::vector<std::uintptr_t> hook_keys;
  std::unique_ptr<AcceleratedOptimizer> optimizer;
  // Its units (a torch::nn::Module's; null for TorchScript): ZeRO-3, and the ShardedUnit
  // blocks' activation checkpointing under every strategy.
  std::unique_ptr<Zero3Units> units;
  // Its gradients' storage (slots or lent); after params and accumulators, which it uses.
  std::unique_ptr<ModelGradients> gradients;
};

}  // namespace accel
