// The model as a plain object (`Net model;`, a torch::nn::Module subclass, no holder), trained
// by a train() function that takes the module and a torch::optim::Optimizer&, as LibTorch's
// MNIST example does. plain_object_plain.cpp is the plain LibTorch program, plain_object.cpp
// the same converted by the README's recipe (programs_test counts the changed lines).

#include <torch/torch.h>

#include "tests/programs/program.hpp"

using namespace programs;

constexpr std::int64_t kFeatures = 10;

struct Net : torch::nn::Module {
  Net()
      : fc1(register_module("fc1", torch::nn::Linear(kFeatures, 32))),
        fc2(register_module("fc2", torch::nn::Linear(32, kClasses))) {}
  torch::Tensor forward(torch::Tensor x) { return fc2(torch::tanh(fc1(x))); }
  torch::nn::Linear fc1, fc2;
};

// One epoch, or what is left of `steps`.
template <typename DataLoader>
void train(Net& model, DataLoader& loader, torch::optim::Optimizer& optimizer, int& steps_taken,
           int steps) {
  model.train();
  for (auto& batch : loader) {
    optimizer.zero_grad();
    auto output = model.forward(batch.data);
    auto loss = torch::nll_loss(torch::log_softmax(output, 1), batch.target);
    loss.backward();
    optimizer.step();
    print_loss(steps_taken, loss);
    if (++steps_taken == steps) return;
  }
}

int main(int argc, char** argv) {
  const Flags flags = parse_flags(argc, argv);
  torch::manual_seed(1);
  Net model;
  torch::optim::SGD optimizer(model.parameters(), torch::optim::SGDOptions(0.2).momentum(0.5));
  auto loader = torch::data::make_data_loader<torch::data::samplers::SequentialSampler>(
      InMemory(teacher_samples(128, kFeatures)).map(torch::data::transforms::Stack<>()),
      torch::data::DataLoaderOptions(flags.batch));
  int step = 0;
  while (step < flags.steps) train(model, *loader, optimizer, step, flags.steps);
  dump_parameters(model.parameters(), flags.dump);
}
