#pragma once
// What the Fashion-MNIST examples share: the CNN, the data as tensors, the flags. main.cpp is
// the accelerated loop (the main job), plain.cpp the same loop in plain LibTorch, for the
// README's side-by-side and as the single-process baseline.

#include <cstddef>
#include <cstdint>
#include <string>

#include <torch/nn/cloneable.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/dropout.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>
#include <torch/optim/optimizer.h>

namespace fashion_mnist {

// conv(1->32, 3x3)-batchnorm-relu-maxpool-conv(32->64, 3x3)-batchnorm-relu-maxpool-dropout-
// fc(64*5*5->128)-relu-fc(128->10): 225k parameters. The batch norms' running statistics are
// module buffers, which DDP keeps equal across the processes. Cloneable (submodules built in
// reset()) so DATA_PARALLEL can copy it into its replicas.
class NetImpl : public torch::nn::Cloneable<NetImpl> {
 public:
  NetImpl();
  void reset() override;
  torch::Tensor forward(torch::Tensor x);  // [N, 1, 28, 28] -> logits [N, 10]

 private:
  torch::nn::Conv2d conv1_{nullptr}, conv2_{nullptr};
  torch::nn::BatchNorm2d bn1_{nullptr}, bn2_{nullptr};
  torch::nn::Dropout dropout_{nullptr};
  torch::nn::Linear fc1_{nullptr}, fc2_{nullptr};
};
TORCH_MODULE(Net);

// One split as tensors: images [N, 1, 28, 28] float, standardised with the training set's
// mean 0.2860 and deviation 0.3530; labels [N] int64 in 0..9.
struct Split {
  torch::Tensor images;
  torch::Tensor labels;
};

// DIR/SPLIT-{images-idx3,labels-idx1}-ubyte.gz, SPLIT "train" or "t10k"; max_items > 0 reads
// only the first max_items samples.
Split load_split(const std::string& dir, const std::string& split, std::size_t max_items = 0);

struct Flags {
  int epochs = 5;
  std::size_t batch_size = 64;  // per process
  double lr = 0.05;             // at the first epoch; cosine decay after it
  double momentum = 0.9;
  std::string data_dir = "/usr/share/datasets/fashion-mnist";
  std::string checkpoint_dir;     // save after each epoch, resume from it when present
  std::size_t train_samples = 0;  // 0 = all 60000
  std::size_t test_samples = 0;   // 0 = all 10000
  std::uint64_t seed = 42;
};

// --flag VALUE or --flag=VALUE; exits with a usage message (code 2) on anything else.
Flags parse_flags(int argc, char** argv, const char* program, bool with_checkpoints);

// The learning rate of epoch `epoch` (0-based) of `epochs`: a cosine from `lr` down towards 0
// at the end. A function of the epoch alone, so a resumed run continues the same schedule with
// nothing to save (LibTorch 1.13's schedulers cannot save their state).
double scheduled_lr(double lr, int epoch, int epochs);
// Sets every param group's learning rate.
void set_lr(torch::optim::Optimizer& optimizer, double lr);

// torch::set_num_threads(OMP_NUM_THREADS) when it is set (`accel launch` sets it to the
// cores divided by the processes on this machine), so the processes do not oversubscribe.
void use_omp_num_threads();

}  // namespace fashion_mnist
