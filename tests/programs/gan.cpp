// A GAN in DCGAN's shape (pytorch/examples cpp/dcgan): a generator and a discriminator, two
// Adams, the discriminator's two backwards (a real batch, then a detached fake one) before its
// step, then the generator's loss through the discriminator; gradients reset by the modules'
// zero_grad() as DCGAN's loop does (the generator's loss leaves a gradient in the
// discriminator that its next zero_grad() must drop). gan_plain.cpp is the plain
// LibTorch program, gan.cpp the same converted by the README's recipe (programs_test counts
// the lines).

#include <torch/torch.h>

#include "accelerate/torch/torch_accelerator.hpp"
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
  accel::TorchAccelerator acc;
  torch::manual_seed(1);
  Generator g;
  Discriminator d;
  const auto adam = torch::optim::AdamOptions(0.01).betas({0.5, 0.999});
  torch::optim::Adam g_adam(g->parameters(), adam);
  torch::optim::Adam d_adam(d->parameters(), adam);
  auto [generator, discriminator, g_optimizer, d_optimizer] = acc.prepare(g, d, g_adam, d_adam);
  auto loader = acc.prepare_data_loader<torch::data::samplers::SequentialSampler>(
      InMemory(teacher_samples(128, kFeatures)).map(torch::data::transforms::Stack<>()),
      torch::data::DataLoaderOptions(flags.batch));
  int step = 0;
  while (step < flags.steps) {
    for (auto& batch : *loader) {
      discriminator->zero_grad(flags.set_to_none);  // the module's, as DCGAN's loop
      auto d_real = bce(discriminator(batch.data), 1.0);
      acc.backward(d_real);
      auto z = acc.split_between_processes(torch::randn({flags.batch * acc.num_processes(), kNz}));
      auto fake = generator(z);
      auto d_fake = bce(discriminator(fake.detach()), 0.0);
      acc.backward(d_fake);
      d_optimizer.step();
      generator->zero_grad(flags.set_to_none);
      auto g_loss = bce(discriminator(fake), 1.0);
      acc.backward(g_loss);
      g_optimizer.step();
      print_loss(step, g_loss);
      if (++step == flags.steps) break;
    }
  }
  auto parameters = acc.get_state_dict(generator);  // whole under ZeRO-3 too
  for (auto& named : acc.get_state_dict(discriminator)) parameters.push_back(named);
  dump_parameters(parameters, flags.dump);
}
