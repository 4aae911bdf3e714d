#pragma once
// Activation checkpointing (PyTorch's torch.utils.checkpoint, the reentrant form): the block's
// forward runs without recording a graph, only its inputs are kept, and during backward the
// forward runs again, with the random state it first saw (dropout draws the same masks) and the
// autocast state it ran under, and is differentiated right there. Memory: the block's inner
// activations exist only while its backward runs. Gradients are the same bits as without it.
//  - Inputs that do not require grad (the data) still give the block's parameters their
//    gradients: an internal anchor that requires grad makes the result part of the graph.
//  - The parameters' gradients arrive through their AccumulateGrad nodes as usual, so DDP's and
//    ZeRO's hooks (grad_ready) run for them, inside the block's backward.
//  - The random state saved is the CPU generator's (the CUDA one's too, for CUDA inputs in a
//    CUDA build of LibTorch): restoring it is exact on one thread; under DATA_PARALLEL the
//    replicas draw from that one generator concurrently, as they do without checkpointing.

#include <concepts>
#include <functional>
#include <utility>
#include <vector>

#include <ATen/Tensor.h>

namespace accel {

using CheckpointedFn = std::function<at::Tensor(const std::vector<at::Tensor>&)>;

// fn(inputs) recomputed in backward; returns its result, part of the graph.
at::Tensor checkpoint_function(CheckpointedFn fn, std::vector<at::Tensor> inputs);

// A module (std::shared_ptr<M>, a ModuleHolder such as torch::nn::Linear) or any callable, with
// its tensor arguments: checkpoint(block, x), checkpoint([&](auto& a, auto& b) {...}, a, b).
template <typename Block, typename... Tensors>
requires(std::same_as<Tensors, at::Tensor>&&...) at::Tensor
    checkpoint(Block&& block, const Tensors&... inputs) {
  auto call = [block = std::forward<Block>(block)](const std::vector<at::Tensor>& v) mutable {
    return [&]<std::size_t... I>(std::index_sequence<I...>)->at::Tensor {
      if constexpr (requires { block->forward(v[I]...); })
        return block->forward(v[I]...);
      else
        return block(v[I]...);
    }
    (std::index_sequence_for<Tensors...>{});
  };
  return checkpoint_function(CheckpointedFn(std::move(call)), std::vector<at::Tensor>{inputs...});
}

}  // namespace accel
