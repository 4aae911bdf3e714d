#pragma once
// The hand-written MLP's layers as ZeRO-3 units (param_refs.hpp gives layer l unit l): the
// LayerScopes for Mlp::forward_backward gather each layer with acc.gather_parameters around its
// forward and its backward, and gather_all() leaves every layer's current values in the
// model's buffers (before predict() or writing them out). Under every other strategy the
// parameters are always whole and the scopes are empty (DataParallel's replicas run them on
// threads of their own). Construct it after prepare().

#include <cstddef>
#include <optional>
#include <vector>

#include "accelerate/accelerator.hpp"
#include "examples/raw_mlp/mlp.hpp"

namespace raw_mlp {

class UnitScopes {
 public:
  UnitScopes(accel::Accelerator& acc, std::size_t layers, std::size_t model = 0)
      : acc_(acc), model_(model), held_(layers) {
    if (!acc.strategy(model).parameters_sharded()) return;
    const auto enter = [this](accel::UnitPass pass) {
      return [this, pass](std::size_t l) {
        held_[l].emplace(acc_.gather_parameters(l, pass, model_));
      };
    };
    scopes_.enter_forward = enter(accel::UnitPass::forward);
    scopes_.enter_backward = enter(accel::UnitPass::backward);
    scopes_.leave_forward = scopes_.leave_backward = [this](std::size_t l) { held_[l].reset(); };
  }
  UnitScopes(const UnitScopes&) = delete;  // the scopes point at this object
  UnitScopes& operator=(const UnitScopes&) = delete;

  const LayerScopes& scopes() const { return scopes_; }
  void gather_all() {
    for (std::size_t l = 0; l < held_.size(); ++l) auto gathered = acc_.gather_parameters(l);
  }

 private:
  accel::Accelerator& acc_;
  std::size_t model_;
  std::vector<std::optional<accel::Accelerator::GatheredParameters>> held_;
  LayerScopes scopes_;
};

}  // namespace raw_mlp
