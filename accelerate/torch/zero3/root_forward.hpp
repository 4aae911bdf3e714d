#pragma once
// The prepared call's ZeRO-3 scope (PreparedModel's operator()): while it lives the model's
// root unit is gathered (and, with grad mode, until backward() ends); outside ZeRO-3 it does
// nothing. Zero3Units::root_forward makes it (zero3_units.hpp).

#include <cstddef>
#include <functional>
#include <utility>
#include <vector>

#include <ATen/Tensor.h>

namespace accel {

class Zero3Units;

class RootForward {
 public:
  using UnitFn = std::function<at::Tensor(const std::vector<at::Tensor>&)>;
  RootForward() = default;
  RootForward(Zero3Units* units, bool sequential) : units_(units), sequential_(sequential) {}
  RootForward(RootForward&& o) noexcept
      : units_(std::exchange(o.units_, nullptr)), sequential_(o.sequential_) {}
  RootForward& operator=(RootForward&&) = delete;
  ~RootForward();
  // Whether the call runs the root Sequential's children as units, through run_unit.
  bool sequential_units() const { return units_ != nullptr && sequential_; }
  // Zero3Units::run_unit: unit `unit` gathered around fn(inputs).
  at::Tensor run_unit(std::size_t unit, std::vector<at::Tensor> inputs, const UnitFn& fn,
                      bool checkpointable);

 private:
  Zero3Units* units_ = nullptr;
  bool sequential_ = false;
};

}  // namespace accel
