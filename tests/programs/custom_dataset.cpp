// A Dataset of the loop's own that reads each sample's file in get(), normalised, with a random
// per-sample transform (noise from LibTorch's generator), stacked, read by 2 worker threads,
// training a small CNN. custom_dataset_plain.cpp is the plain LibTorch program, custom_dataset.cpp
// the same converted by the README's recipe (programs_test counts the changed lines).

#include <torch/torch.h>

#include "accelerate/torch/torch_accelerator.hpp"
#include "tests/programs/program.hpp"

using namespace programs;

// Sample i is the file DIR/sample_<i>.bin: a 1 x 6 x 6 image, then its label.
class ImageFiles : public torch::data::datasets::Dataset<ImageFiles> {
 public:
  ImageFiles(std::string dir, std::size_t n) : dir_(std::move(dir)), n_(n) {}
  torch::data::Example<> get(std::size_t i) override {
    std::vector<double> row(kImageSide * kImageSide + 1);
    std::ifstream in(dir_ + "/sample_" + std::to_string(i) + ".bin", std::ios::binary);
    if (!in.read(reinterpret_cast<char*>(row.data()), std::streamsize(row.size() * 8)))
      throw std::runtime_error("cannot read sample " + std::to_string(i) + " in " + dir_);
    const torch::Tensor t = torch::tensor(row, torch::get_default_dtype());
    const torch::Tensor image = t.narrow(0, 0, kImageSide * kImageSide);
    return {image.view({1, kImageSide, kImageSide}), t[-1].to(torch::kLong)};
  }
  torch::optional<std::size_t> size() const override { return n_; }

 private:
  std::string dir_;
  std::size_t n_;
};

// Augmentation: noise of the given scale on every sample, drawn from LibTorch's generator.
torch::data::transforms::Lambda<torch::data::Example<>> random_noise(double scale) {
  return torch::data::transforms::Lambda<torch::data::Example<>>([scale](auto e) {
    e.data = e.data + scale * torch::randn_like(e.data);
    return e;
  });
}

// 1 x 6 x 6 images into kClasses logits.
struct SmallCnnImpl : torch::nn::Module {
  SmallCnnImpl()
      : conv(register_module("conv", torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 4, 3)))),
        fc(register_module("fc", torch::nn::Linear(4 * 4 * 4, kClasses))) {}
  torch::Tensor forward(const torch::Tensor& x) { return fc(torch::relu(conv(x)).flatten(1)); }
  torch::nn::Conv2d conv;
  torch::nn::Linear fc;
};
TORCH_MODULE(SmallCnn);

int main(int argc, char** argv) {
  const Flags flags = parse_flags(argc, argv);
  accel::TorchAccelerator acc;
  torch::manual_seed(1);
  SmallCnn net;
  torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  auto [model, optimizer] = acc.prepare(net, sgd);
  auto dataset = ImageFiles(flags.data, 96)
                     .map(torch::data::transforms::Normalize<>(0.5, 0.25))
                     .map(random_noise(flags.noise))
                     .map(torch::data::transforms::Stack<>());
  auto loader = acc.prepare_data_loader<torch::data::samplers::SequentialSampler>(
      std::move(dataset), torch::data::DataLoaderOptions(flags.batch).workers(flags.workers));
  int step = 0;
  for (int epoch = 0; step < flags.steps; ++epoch) {
    for (auto& batch : *loader) {
      optimizer.zero_grad();
      auto loss = torch::nn::functional::cross_entropy(model(batch.data), batch.target);
      acc.backward(loss);
      optimizer.step();
      print_loss(step, loss);
      if (++step == flags.steps) break;
    }
  }
  dump_parameters(acc.get_state_dict(model), flags.dump);  // whole under ZeRO-3 too
}
