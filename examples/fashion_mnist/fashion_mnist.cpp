#include "examples/fashion_mnist/fashion_mnist.hpp"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <stdexcept>

#include <ATen/Functions.h>
#include <ATen/Parallel.h>
#include <torch/nn/functional/activation.h>
#include <torch/nn/functional/pooling.h>

#include "examples/common/idx_reader.hpp"

namespace fashion_mnist {

namespace F = torch::nn::functional;

NetImpl::NetImpl() { reset(); }

void NetImpl::reset() {
  conv1_ =
      register_module("conv1", torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 32, 3).bias(false)));
  conv2_ =
      register_module("conv2", torch::nn::Conv2d(torch::nn::Conv2dOptions(32, 64, 3).bias(false)));
  bn1_ = register_module("bn1", torch::nn::BatchNorm2d(32));
  bn2_ = register_module("bn2", torch::nn::BatchNorm2d(64));
  dropout_ = register_module("dropout", torch::nn::Dropout(0.25));
  fc1_ = register_module("fc1", torch::nn::Linear(64 * 5 * 5, 128));
  fc2_ = register_module("fc2", torch::nn::Linear(128, 10));
}

torch::Tensor NetImpl::forward(torch::Tensor x) {
  x = F::max_pool2d(F::relu(bn1_(conv1_(x))), F::MaxPool2dFuncOptions(2));  // 32 x 13 x 13
  x = F::max_pool2d(F::relu(bn2_(conv2_(x))), F::MaxPool2dFuncOptions(2));  // 64 x 5 x 5
  x = dropout_(x).flatten(1);
  return fc2_(F::relu(fc1_(x)));
}

Split load_split(const std::string& dir, const std::string& split, std::size_t max_items) {
  const examples::ImageDataset d = examples::load_mnist_split(dir, split, max_items);
  const auto n = std::int64_t(d.count);
  Split out;
  // from_blob borrows d's bytes; the conversion to float makes the tensor's own copy.
  out.images = at::from_blob(const_cast<std::uint8_t*>(d.pixels.data()),
                             {n, 1, std::int64_t(d.rows), std::int64_t(d.cols)}, at::kByte)
                   .to(at::kFloat)
                   .div_(255.0)
                   .sub_(0.2860)
                   .div_(0.3530);
  out.labels =
      at::from_blob(const_cast<std::uint8_t*>(d.labels.data()), {n}, at::kByte).to(at::kLong);
  return out;
}

namespace {

[[noreturn]] void usage(const char* program, bool with_checkpoints, const std::string& problem) {
  std::fprintf(stderr,
               "%s: %s\n"
               "usage: %s [--epochs N] [--batch_size N] [--lr X] [--momentum X] [--seed N]\n"
               "       [--data_dir DIR] [--train_samples N] [--test_samples N]%s\n",
               program, problem.c_str(), program,
               with_checkpoints ? " [--checkpoint_dir DIR]" : "");
  std::exit(2);
}

}  // namespace

Flags parse_flags(int argc, char** argv, const char* program, bool with_checkpoints) {
  std::map<std::string, std::string> values;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "-h" || arg == "--help")
      usage(program, with_checkpoints, "training a CNN on Fashion-MNIST");
    if (!arg.starts_with("--"))
      usage(program, with_checkpoints, "unexpected argument '" + arg + "'");
    arg = arg.substr(2);
    if (const auto eq = arg.find('='); eq != std::string::npos) {
      values[arg.substr(0, eq)] = arg.substr(eq + 1);
    } else {
      if (i + 1 >= argc) usage(program, with_checkpoints, "--" + arg + " needs a value");
      values[arg] = argv[++i];
    }
  }
  Flags f;
  for (const auto& [key, value] : values) {
    try {
      std::size_t used = 0;
      auto whole = [&](auto parsed) {
        if (used != value.size()) throw std::invalid_argument(value);
        return parsed;
      };
      // clang-format off
      if (key == "epochs") f.epochs = whole(std::stoi(value, &used));
      else if (key == "batch_size") f.batch_size = whole(std::stoul(value, &used));
      else if (key == "lr") f.lr = whole(std::stod(value, &used));
      else if (key == "momentum") f.momentum = whole(std::stod(value, &used));
      else if (key == "seed") f.seed = whole(std::stoull(value, &used));
      else if (key == "data_dir") f.data_dir = value;
      else if (key == "train_samples") f.train_samples = whole(std::stoul(value, &used));
      else if (key == "test_samples") f.test_samples = whole(std::stoul(value, &used));
      else if (key == "checkpoint_dir" && with_checkpoints) f.checkpoint_dir = value;
      else usage(program, with_checkpoints, "unknown flag --" + key);
      // clang-format on
    } catch (const std::logic_error&) {
      usage(program, with_checkpoints, "--" + key + ": bad value '" + value + "'");
    }
  }
  if (f.epochs < 0 || f.batch_size == 0 || !(f.lr > 0) || f.momentum < 0)
    usage(program, with_checkpoints, "--epochs, --batch_size, --lr or --momentum out of range");
  return f;
}

double scheduled_lr(double lr, int epoch, int epochs) {
  if (epochs <= 1) return lr;
  return lr * 0.5 * (1.0 + std::cos(M_PI * double(epoch) / double(epochs)));
}

void set_lr(torch::optim::Optimizer& optimizer, double lr) {
  for (auto& group : optimizer.param_groups()) group.options().set_lr(lr);
}

void use_omp_num_threads() {
  if (const char* s = std::getenv("OMP_NUM_THREADS")) {
    const int n = std::atoi(s);
    if (n > 0) at::set_num_threads(n);
  }
}

}  // namespace fashion_mnist
