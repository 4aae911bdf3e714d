// The same training as main.cpp in plain LibTorch, without accelerate-cpp: one process, its
// data through torch::data's loader. The README puts the two loops side by side; this is
// also the baseline the accelerated runs are compared with.
//
//   build/bin/fashion_mnist_plain --epochs 4

#include <chrono>
#include <cstdio>
#include <string>

#include <torch/data/dataloader.h>
#include <torch/data/datasets/base.h>
#include <torch/data/datasets/map.h>
#include <torch/data/example.h>
#include <torch/data/transforms/stack.h>
#include <torch/nn/functional/loss.h>
#include <torch/optim/sgd.h>
#include <torch/utils.h>

#include "examples/fashion_mnist/fashion_mnist.hpp"

using namespace fashion_mnist;
namespace F = torch::nn::functional;

namespace {

// In-memory images and labels as a torch::data dataset (one sample per get).
class TensorPairs : public torch::data::datasets::Dataset<TensorPairs> {
 public:
  TensorPairs(torch::Tensor data, torch::Tensor targets)
      : data_(std::move(data)), targets_(std::move(targets)) {}
  torch::data::Example<> get(std::size_t i) override {
    return {data_[std::int64_t(i)], targets_[std::int64_t(i)]};
  }
  torch::optional<std::size_t> size() const override { return std::size_t(data_.size(0)); }

 private:
  torch::Tensor data_, targets_;
};

}  // namespace

int main(int argc, char** argv) {
  const Flags flags = parse_flags(argc, argv, "fashion_mnist_plain", /*with_checkpoints=*/false);
  use_omp_num_threads();
  try {
    torch::manual_seed(flags.seed);
    const Split train = load_split(flags.data_dir, "train", flags.train_samples);
    const Split test = load_split(flags.data_dir, "t10k", flags.test_samples);
    std::printf(
        "fashion_mnist_plain: %lld training and %lld test images; %zu per batch, "
        "%d thread(s); SGD lr %g momentum %g\n",
        static_cast<long long>(train.images.size(0)), static_cast<long long>(test.images.size(0)),
        flags.batch_size, torch::get_num_threads(), flags.lr, flags.momentum);

    Net model;
    torch::optim::SGD optimizer(model->parameters(),
                                torch::optim::SGDOptions(flags.lr).momentum(flags.momentum));
    auto loader = torch::data::make_data_loader(
        TensorPairs(train.images, train.labels).map(torch::data::transforms::Stack<>()),
        flags.batch_size);

    for (int epoch = 0; epoch < flags.epochs; ++epoch) {
      const auto started = std::chrono::steady_clock::now();
      set_lr(optimizer, scheduled_lr(flags.lr, epoch, flags.epochs));
      model->train();
      double loss_sum = 0;
      double batches = 0;
      for (auto& batch : *loader) {
        optimizer.zero_grad();
        auto loss = F::cross_entropy(model->forward(batch.data), batch.target);
        loss.backward();
        optimizer.step();
        loss_sum += loss.item<double>();
        batches += 1;
      }

      model->eval();
      std::int64_t correct = 0;
      {
        torch::NoGradGuard no_grad;
        for (std::int64_t i = 0; i < test.images.size(0); i += 500) {
          const torch::Tensor predicted =
              model->forward(test.images.slice(0, i, i + 500)).argmax(1);
          correct += predicted.eq(test.labels.slice(0, i, i + 500)).sum().item<std::int64_t>();
        }
      }
      const double seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
      std::printf("epoch %d: loss %.4f, test accuracy %.4f, %.1f s\n", epoch + 1,
                  batches > 0 ? loss_sum / batches : 0.0,
                  double(correct) / double(test.images.size(0)), seconds);
      std::fflush(stdout);
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fashion_mnist_plain: %s\n", e.what());
    return 1;
  }
}
