// Early stopping: training ends at the first step whose loss is below a target. Converted, the
// condition is each process's own (its batch's loss): that process sets the trigger and every
// process stops at the same step. early_stop_plain.cpp is the plain LibTorch program,
// early_stop.cpp the same converted by the README's recipe (programs_test counts the lines).

#include <torch/torch.h>

#include "accelerate/torch/torch_accelerator.hpp"
#include "tests/programs/program.hpp"

using namespace programs;

constexpr std::int64_t kFeatures = 10;

struct MlpImpl : torch::nn::Module {
  MlpImpl()
      : fc1(register_module("fc1", torch::nn::Linear(kFeatures, 32))),
        fc2(register_module("fc2", torch::nn::Linear(32, kClasses))) {}
  torch::Tensor forward(const torch::Tensor& x) { return fc2(torch::tanh(fc1(x))); }
  torch::nn::Linear fc1, fc2;
};
TORCH_MODULE(Mlp);

int main(int argc, char** argv) {
  const Flags flags = parse_flags(argc, argv);
  accel::TorchAccelerator acc;
  torch::manual_seed(1);
  Mlp net;
  torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(0.5));
  auto [model, optimizer] = acc.prepare(net, sgd);
  auto loader = acc.prepare_data_loader<torch::data::samplers::SequentialSampler>(
      InMemory(teacher_samples(128, kFeatures)).map(torch::data::transforms::Stack<>()),
      torch::data::DataLoaderOptions(flags.batch));
  int step = 0;
  bool stop = false;
  while (!stop) {
    for (auto& batch : *loader) {
      optimizer.zero_grad();
      auto loss = torch::nn::functional::cross_entropy(model(batch.data), batch.target);
      acc.backward(loss);
      optimizer.step();
      print_loss(step, loss);
      if (loss.item<double>() < flags.target) acc.set_trigger();  // this process's loss
      if (++step == flags.steps) stop = true;
      if (acc.check_trigger()) stop = true;
      if (stop) break;
    }
  }
  std::printf("stopped after %d steps\n", step);
  dump_parameters(acc.get_state_dict(model), flags.dump);  // whole under ZeRO-3 too
}
