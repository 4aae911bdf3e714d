#pragma once
// What TorchAccelerator::prepare returns for a TorchScript model (torch::jit::load's
// torch::jit::Module): the same module (operator-> and get() reach it) and a forward that
// runs it under the accelerator's autocast (mixed_precision bf16/fp16), returning fp32
// tensors, as the prepared torch::nn::Module's call does. A frozen part (parameters with
// requires_grad false) is neither synchronised nor stepped.

#include <utility>
#include <vector>

#include <torch/csrc/jit/api/module.h>

#include "accelerate/torch/autocast.hpp"

namespace accel {

class PreparedScriptModule {
 public:
  PreparedScriptModule(torch::jit::Module module, AutocastSettings autocast)
      : module_(std::move(module)), autocast_(autocast) {}

  // module.forward(inputs) under the accelerator's autocast; a tensor output comes back fp32.
  torch::jit::IValue forward(std::vector<torch::jit::IValue> inputs) const;
  torch::jit::IValue operator()(std::vector<torch::jit::IValue> inputs) const {
    return forward(std::move(inputs));
  }
  torch::jit::Module* operator->() const { return &module_; }
  torch::jit::Module& get() const { return module_; }
  operator torch::jit::Module&() const { return module_; }

 private:
  mutable torch::jit::Module module_;  // a handle: copies share the module
  AutocastSettings autocast_;
};

}  // namespace accel
