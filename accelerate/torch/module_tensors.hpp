#pragma once
// What prepare needs of a model, whatever form it comes in (a torch::nn::Module, or a
// TorchScript torch::jit::Module loaded with torch::jit::load): its trainable parameters and
// its buffers by name, in module order, and how to save and load them for checkpoints.
// Parameters with requires_grad false (a frozen backbone) are not trainable: they are neither
// synchronised nor given to the strategy, and are saved with the model.

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include <ATen/Tensor.h>

namespace torch::nn {
class Module;
}
namespace torch::jit {
struct Module;
}

namespace accel {

struct ModuleTensors {
  std::vector<std::pair<std::string, at::Tensor>> trainable;  // a tied parameter once
  std::vector<std::pair<std::string, at::Tensor>> buffers;
  std::function<std::string()> save;  // every parameter and buffer, a LibTorch archive
  std::function<void(const std::string&)> load;
  // The torch::nn::Module (DataParallel clones it), or null for TorchScript.
  torch::nn::Module* module = nullptr;
};

ModuleTensors module_tensors(torch::nn::Module& module);
// The module handle is copied (it shares the module: a torch::jit::Module is a reference).
ModuleTensors module_tensors(const torch::jit::Module& module);

}  // namespace accel
