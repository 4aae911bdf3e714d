// Transfer learning: a frozen TorchScript backbone (torch::jit::Module, as torch::jit::load
// gives one; built here with define) computes features, and a torch::nn head on them is trained
// with Adam. transfer_plain.cpp is the plain LibTorch program, transfer.cpp the same converted
// by the README's recipe (programs_test counts the changed lines).

#include <torch/script.h>
#include <torch/torch.h>

#include "tests/programs/program.hpp"

using namespace programs;

constexpr std::int64_t kFeatures = 8, kHidden = 16;

// A pretrained feature extractor: tanh(x W + b), its parameters frozen.
torch::jit::Module backbone_module() {
  torch::jit::Module m("Backbone");
  m.register_parameter("weight", torch::randn({kFeatures, kHidden}) * 0.5, /*is_buffer=*/false);
  m.register_parameter("bias", torch::randn({kHidden}) * 0.1, false);
  for (const auto& p : m.parameters()) p.requires_grad_(false);
  m.define(R"(
    def forward(self, x):
        return torch.tanh(torch.matmul(x, self.weight) + self.bias)
  )");
  return m;
}

int main(int argc, char** argv) {
  const Flags flags = parse_flags(argc, argv);
  torch::manual_seed(1);
  torch::jit::Module backbone = backbone_module();
  torch::nn::Linear head(kHidden, kClasses);
  torch::optim::Adam optimizer(head->parameters(), torch::optim::AdamOptions(0.01));
  auto loader = torch::data::make_data_loader<torch::data::samplers::SequentialSampler>(
      InMemory(teacher_samples(128, kFeatures)).map(torch::data::transforms::Stack<>()),
      torch::data::DataLoaderOptions(flags.batch));
  int step = 0;
  for (int epoch = 0; step < flags.steps; ++epoch) {
    for (auto& batch : *loader) {
      optimizer.zero_grad();
      const torch::Tensor features = backbone.forward({batch.data}).toTensor();
      auto loss = torch::nll_loss(torch::log_softmax(head(features), 1), batch.target);
      loss.backward();
      optimizer.step();
      print_loss(step, loss);
      if (++step == flags.steps) break;
    }
  }
  dump_parameters(head->parameters(), flags.dump);
}
