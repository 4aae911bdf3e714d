#pragma once
// Layers described, not built (DeepSpeed's LayerSpec): a pipeline builds a layer only on the
// stage that holds it, so no rank ever holds the whole model.
//
//   std::vector<accel::pipeline::LayerSpec> layers;
//   for (int i = 0; i < 48; ++i)
//     layers.push_back({"block" + std::to_string(i),
//                       [] { return torch::nn::AnyModule(Block(1024)); }});
//   TorchPipeline pipe(acc, layers, [](std::vector<at::Tensor> params) {
//     return std::make_unique<torch::optim::AdamW>(params, 1e-4);
//   }, options);

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <torch/torch.h>

namespace accel::pipeline {

struct LayerSpec {
  std::string name;                             // the child's name ("": its index)
  std::function<torch::nn::AnyModule()> build;  // called on the owning stage only
};

// Makes a stage's optimizer over its parameters, once they exist.
using OptimizerFactory =
    std::function<std::unique_ptr<torch::optim::Optimizer>(std::vector<at::Tensor> parameters)>;

}  // namespace accel::pipeline
