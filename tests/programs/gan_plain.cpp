// A GAN in DCGAN's shape (pytorch/examples cpp/dcgan): a generator and a discriminator, two
// Adams, the discriminator's two backwards (a real batch, then a detached fake one) before its
// step, then the generator's loss through the discriminator; gradients reset by the modules'
// zero_grad() as DCGAN's loop does (the generator's loss leaves a gradient in the
// discriminator that its next zero_grad() must drop). gan_plain.cpp is the plain
// LibTorch program, gan.cpp the same converted by the README's recipe (programs_test counts
// the lines).

#include <torch/torch.h>

#include "tests/programs/program.hpp"

using namespace programs;

constexpr std::int64_t kFeatures = 10, kNz = 4;  // DCGAN's nz: the latent size

struct GeneratorImpl : torch::nn::Module {
  GeneratorImpl()
      : fc1(register_module("fc1", torch::nn::Linear(kNz, 16))),
        fc2(register_module("fc2", torch::nn::Linear(16, kFeatures))) {}
  torch::Tensor forward(const torch::Tensor& z) { return fc2(torch::relu(fc1(z))); }
  torch::nn::Linear fc1, fc2;
};
TORCH_MODULE(Generator);

struct DiscriminatorImpl : torch::nn::Module {
  DiscriminatorImpl()
      : fc1(register_module("fc1", torch::nn::Linear(kFeatures, 16))),
        fc2(register_module("fc2", torch::nn::Linear(16, 1))) {}
  torch::Tensor forward(const torch::Tensor& x) {
    return fc2(torch::leaky_relu(fc1(x), 0.2)).flatten();
  }
  torch::nn::Linear fc1, fc2;
};
TORCH_MODULE(Discriminator);

torch::Tensor bce(const torch::Tensor& logits, double label) {
  return torch::binary_cross_entropy_with_logits(logits, torch::full_like(logits, label));
}

int main(int argc, char** argv) {
  const Flags flags = parse_flags(argc, argv);
  torch::manual_seed(1);
  Generator generator;
  Discriminator discriminator;
  const auto adam = torch::optim::AdamOptions(0.01).betas({0.5, 0.999});
  torch::optim::Adam g_optimizer(generator->parameters(), adam);
  torch::optim::Adam d_optimizer(discriminator->parameters(), adam);
  auto loader = torch::data::make_data_loader<torch::data::samplers::SequentialSampler>(
      InMemory(teacher_samples(128, kFeatures)).map(torch::data::transforms::Stack<>()),
      torch::data::DataLoaderOptions(flags.batch));
  int step = 0;
  while (step < flags.steps) {
    for (auto& batch : *loader) {
      discriminator->zero_grad(flags.set_to_none);  // the module's, as DCGAN's loop
      auto d_real = bce(discriminator(batch.data), 1.0);
      d_real.backward();
      auto z = torch::randn({flags.batch, kNz});
      auto fake = generator(z);
      auto d_fake = bce(discriminator(fake.detach()), 0.0);
      d_fake.backward();
      d_optimizer.step();
      generator->zero_grad(flags.set_to_none);
      auto g_loss = bce(discriminator(fake), 1.0);
      g_loss.backward();
      g_optimizer.step();
      print_loss(step, g_loss);
      if (++step == flags.steps) break;
    }
  }
  std::vector<torch::Tensor> parameters = generator->parameters();
  for (const auto& p : discriminator->parameters()) parameters.push_back(p);
  dump_parameters(parameters, flags.dump);
}
