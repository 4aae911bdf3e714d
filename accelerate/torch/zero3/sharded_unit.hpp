#pragma once
// ZeRO-3 units for LibTorch models (FSDP's wrapping). Under zero_stage 3 each rank keeps only
// its slices of the parameters; a unit's are gathered while it runs. What a unit is:
//  (1) any model: the root, gathered by the prepared call, model(x), from the forward to the
//      end of its backward (always works; the step's memory is then ZeRO-2's; alone under
//      auto_wrap_policy NO_WRAP);
//  (2) a torch::nn::Sequential model: each child is a unit (the prepared call runs them);
//      in any other model (auto_wrap_policy TRANSFORMER_BASED_WRAP, the default), each child
//      of its outermost ModuleLists and Sequentials, gathered when one of its parameters is
//      first used (sharded_parameter_access.hpp) and released when the next unit's is;
//  (3) ShardedUnit<BlockImpl>, the loop's own block type wrapped where the model defines it
//      (one changed line per block); its forward gathers the block, and is the block's
//      forward everywhere else (not prepared; another strategy, where activation_checkpointing
//      still recomputes it):
//        blocks->push_back(accel::ShardedUnit<BlockImpl>(width));  // was: Block(width)
//        x = blocks[i]->as<accel::ShardedUnitImpl<BlockImpl>>()->forward(x);  // as before
// The parameters outside every unit are the root's. A unit's forward takes tensors (and other
// arguments, passed through) and returns one tensor. With activation_checkpointing on, a unit
// whose arguments are all tensors is recomputed in backward, unless it shares a parameter with
// another unit (a tied embedding): the recomputes' backwards would each report it.
// How it works (zero3_units.cpp): the parameters keep their tensors, whose storage points
// into the strategy's gathered slot while their unit is gathered and is empty otherwise (a
// use then gathers an automatic unit, or fails naming the parameter); an autograd function on the
// unit's output gathers it again before its backward, and the unit is released once its gradients
// are accumulated.

#include <array>
#include <cstddef>
#include <functional>
#include <type_traits>
#include <utility>
#include <vector>

#include <ATen/Tensor.h>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

namespace accel {

class Zero3Units;

// What prepare finds among a model's modules and attaches to its units (zero3_units.hpp).
class ShardedUnitBase {
 public:
  virtual ~ShardedUnitBase() = default;
  // Set by prepare (null: not prepared, the forward is the block's).
  void attach(Zero3Units* units, std::size_t unit) {
    units_ = units;
    unit_ = unit;
  }

 protected:
  using UnitFn = std::function<at::Tensor(const std::vector<at::Tensor>&)>;
  // Zero3Units::run_unit (defined with it): gathers, runs fn on the inputs, attaches the
  // backward gather, releases.
  at::Tensor run(std::vector<at::Tensor> inputs, const UnitFn& fn, bool checkpointable);
  bool attached() const { return units_ != nullptr; }

 private:
  Zero3Units* units_ = nullptr;
  std::size_t unit_ = 0;
};

namespace detail {
template <typename Arg>
constexpr bool is_tensor_arg = std::is_same_v<std::remove_cvref_t<Arg>, at::Tensor>;
// For each argument: its index among the tensor arguments, or -1.
template <typename... Args>
constexpr std::array<int, sizeof...(Args)> tensor_positions() {
  constexpr std::array<bool, sizeof...(Args)> is_tensor = {is_tensor_arg<Args>...};
  std::array<int, sizeof...(Args)> out{};
  int k = 0;
  for (std::size_t i = 0; i < out.size(); ++i) out[i] = is_tensor[i] ? k++ : -1;
  return out;
}
template <int Position, typename Arg>
decltype(auto) unit_arg(const std::vector<at::Tensor>& tensors, Arg& arg) {
  if constexpr (Position >= 0)
    return tensors[std::size_t(Position)];
  else
    return std::forward<Arg>(arg);
}
}  // namespace detail

template <typename Block>
class ShardedUnitImpl : public Block, public ShardedUnitBase {
 public:
  using Block::Block;

  template <typename... Args>
  at::Tensor forward(Args&&... args) {
    if (!attached()) return Block::forward(std::forward<Args>(args)...);
    std::vector<at::Tensor> tensors;
    (
        [&] {
          if constexpr (detail::is_tensor_arg<Args>) tensors.push_back(args);
        }(),
        ...);
    return forward_on(std::move(tensors), std::index_sequence_for<Args...>{}, args...);
  }

 private:
  template <std::size_t... I, typename... Args>
  at::Tensor forward_on(std::vector<at::Tensor> tensors, std::index_sequence<I...>, Args&... args) {
    static constexpr auto positions = detail::tensor_positions<Args...>();
    if constexpr ((detail::is_tensor_arg<Args> && ...)) {
      // Only tensors: the block may be recomputed in backward (activation checkpointing).
      return run(
          std::move(tensors),
          [this](const std::vector<at::Tensor>& in) -> at::Tensor {
            return Block::forward(in[I]...);
          },
          true);
    } else {
      // Other arguments are used by reference, while this forward runs only.
      return run(
          std::move(tensors),
          [&](const std::vector<at::Tensor>& in) -> at::Tensor {
            return Block::forward(detail::unit_arg<positions[I]>(in, args)...);
          },
          false);
    }
  }
};

template <typename Block>
class ShardedUnit : public torch::nn::ModuleHolder<ShardedUnitImpl<Block>> {
 public:
  using torch::nn::ModuleHolder<ShardedUnitImpl<Block>>::ModuleHolder;
};

}  // namespace accel
