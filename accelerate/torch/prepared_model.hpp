#pragma once
// What TorchAccelerator::prepare returns for the model: the user's module (operator-> and
// operator* reach it, so model->train(), model->parameters() ... work as before) plus a call
// operator that is the forward a strategy may fan out. Under DDP and ZeRO `model(x)` is just
// model->forward(x); under DATA_PARALLEL it is torch.nn.DataParallel's forward: every tensor
// argument is split along dim 0 (chunk_rows), replica k runs its chunk on worker thread k, and
// the outputs are concatenated along dim 0 (see TorchAccelerator::replica_forward).
// Call the prepared model, `model(x)`, in the training loop: `model->forward(x)` runs replica 0
// alone, which still trains correctly but on one thread.

#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <utility>

#include <ATen/Tensor.h>
#include <torch/nn/module.h>

#include "foundation/reduce.hpp"

namespace accel {

class TorchAccelerator;

namespace detail {
// Row count of the first tensor argument (dim 0), or -1 when none is a tensor.
inline std::int64_t first_rows() { return -1; }
template <typename First, typename... Rest>
std::int64_t first_rows(const First& first, const Rest&... rest) {
  if constexpr (std::is_same_v<std::remove_cvref_t<First>, at::Tensor>)
    return first.dim() > 0 ? first.size(0) : -1;
  else
    return first_rows(rest...);
}
// Whether every tensor argument with a dim 0 has `rows` rows.
template <typename... Args>
bool same_rows(std::int64_t rows, const Args&... args) {
  auto ok = [rows](const auto& arg) {
    if constexpr (std::is_same_v<std::remove_cvref_t<decltype(arg)>, at::Tensor>)
      return arg.dim() == 0 || arg.size(0) == rows;
    else
      return true;
  };
  return (ok(args) && ...);
}
// A tensor argument's rows [chunk.offset, +chunk.count); anything else as it is.
template <typename Arg>
decltype(auto) chunk_of(Arg&& arg, Shard chunk) {
  if constexpr (std::is_same_v<std::remove_cvref_t<Arg>, at::Tensor>)
    return arg.narrow(0, std::int64_t(chunk.offset), std::int64_t(chunk.count));
  else
    return std::forward<Arg>(arg);
}
}  // namespace detail

template <typename Model>
class PreparedModel {
 public:
  using Impl = std::remove_cvref_t<decltype(*std::declval<Model&>())>;

  PreparedModel(Model model, TorchAccelerator& accelerator)
      : model_(std::move(model)), accelerator_(&accelerator) {}

  Impl* operator->() const { return &*model_; }
  Impl& operator*() const { return *model_; }
  // The user's model (holder or shared_ptr), e.g. to pass where a Model (or Model&) is
  // expected: the same module, so code written for the bare model keeps compiling.
  Model& get() const { return model_; }
  operator Model&() const { return model_; }

  // The forward: model->forward(args...), or DataParallel's split-run-concatenate.
  template <typename... Args>
  auto operator()(Args&&... args) const;

 private:
  mutable Model model_;  // a const holder's -> gives a const module; ours gives the module
  TorchAccelerator* accelerator_;
};

}  // namespace accel
