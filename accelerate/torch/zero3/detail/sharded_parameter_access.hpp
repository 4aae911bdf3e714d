#pragma once
// Every operation on a ZeRO-3 sharded parameter passes through one check first, so a parameter
// whose unit is not gathered is never read as an empty storage: its owner (Zero3Units)
// gathers the unit (automatic units: the children of a ModuleList or Sequential, touched in
// their forward or backward) or refuses, naming the parameter. LibTorch modules have no forward
// hooks; the dispatcher is the one place every use of a tensor goes through.

#include <cstddef>

#include <ATen/Tensor.h>

namespace accel {

// Answers a use of parameter `param` of model `model` (its storage released, or in place).
class ShardedParameterOwner {
 public:
  virtual void sharded_parameter_used(std::size_t model, std::size_t param, bool released) = 0;

 protected:
  ~ShardedParameterOwner() = default;
};

// From now on p's operations (and those of its views and detached aliases) are checked; p
// keeps its tensor and storage, so the model, the optimizer and autograd see the same one.
void watch_sharded_parameter(at::Tensor& p, ShardedParameterOwner& owner, std::size_t model,
                             std::size_t param);
// p's operations go straight to LibTorch again.
void unwatch_sharded_parameter(at::Tensor& p);

}  // namespace accel
