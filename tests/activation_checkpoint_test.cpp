// Activation checkpointing (accelerate/torch/activation_checkpoint.hpp) in one process: an
// 8-block MLP with dropout gives bitwise the same gradients with and without it (the recompute
// draws the same masks), for parameters and for an input that requires grad; inputs that do
// not require grad still give the parameters their gradients; nested use works; the memory
// the forward leaves allocated for backward (malloc's counters) is at least halved; and the
// config's activation_checkpointing does the same to a prepared Sequential's children, and is
// refused, naming the ModuleList, on a model where it could do nothing.

#include <torch/torch.h>

#include "accelerate/torch/activation_checkpoint.hpp"
#include "accelerate/torch/torch_accelerator.hpp"
// LibTorch's logging header defines a CHECK of its own (fatal, uncounted); doctest's is meant.
#undef CHECK
#include <doctest/doctest.h>
#include <malloc.h>

namespace {

constexpr int kBlocks = 8;

// Linear -> ReLU -> Dropout, as a transformer's MLP block keeps its activations.
struct BlockImpl : torch::nn::Module {
  explicit BlockImpl(int width)
      : fc(register_module("fc", torch::nn::Linear(width, width))),
        drop(register_module("drop", torch::nn::Dropout(0.2))) {}
  torch::Tensor forward(const torch::Tensor& x) { return drop(torch::relu(fc(x))) + x; }
  torch::nn::Linear fc;
  torch::nn::Dropout drop;
};
TORCH_MODULE(Block);

struct Model {
  explicit Model(int width) {
    torch::manual_seed(3);
    for (int b = 0; b < kBlocks; ++b) blocks.emplace_back(width);
  }
  torch::Tensor forward(torch::Tensor x, bool checkpointed) {
    for (Block& b : blocks) x = checkpointed ? accel::checkpoint(b, x) : b(x);
    return x;
  }
  std::vector<torch::Tensor> grads() {
    std::vector<torch::Tensor> out;
    for (Block& b : blocks)
      for (const auto& p : b->parameters()) out.push_back(p.grad().clone());
    return out;
  }
  void zero_grad() {
    for (Block& b : blocks) b->zero_grad();
  }
  std::vector<Block> blocks;
};

// One forward and backward from the same random state; the parameters' gradients.
std::vector<torch::Tensor> gradients(Model& m, const torch::Tensor& x, bool checkpointed) {
  m.zero_grad();
  torch::manual_seed(11);
  m.forward(x, checkpointed).square().mean().backward();
  return m.grads();
}

std::size_t malloc_in_use() {
  const struct mallinfo2 info = mallinfo2();
  return info.uordblks + info.hblkhd;
}

}  // namespace

TEST_CASE("checkpointed blocks give bitwise the gradients of plain ones, dropout included") {
  Model m(64);
  const torch::Tensor x = torch::randn({32, 64});
  const auto plain = gradients(m, x, false);
  const auto checkpointed = gradients(m, x, true);
  REQUIRE(plain.size() == checkpointed.size());
  for (std::size_t i = 0; i < plain.size(); ++i) {
    CAPTURE(i);
    CHECK(plain[i].abs().sum().item<double>() > 0);
    CHECK(torch::equal(plain[i], checkpointed[i]));
  }
  // Another random state draws other masks: the comparison above can fail.
  m.zero_grad();
  torch::manual_seed(12);
  m.forward(x, false).square().mean().backward();
  CHECK_FALSE(torch::equal(m.grads().front(), plain.front()));
}

TEST_CASE("an input that requires grad gets the same gradient through a checkpointed block") {
  Model m(16);
  torch::Tensor input_grad[2];
  for (const bool checkpointed : {false, true}) {
    torch::manual_seed(5);
    torch::Tensor x = torch::randn({4, 16});
    x.requires_grad_(true);
    torch::manual_seed(11);
    m.forward(x, checkpointed).sum().backward();
    input_grad[checkpointed ? 1 : 0] = x.grad();
  }
  REQUIRE(input_grad[0].defined());
  CHECK(torch::equal(input_grad[0], input_grad[1]));
}

TEST_CASE("checkpoint takes a lambda of several tensors, and nests") {
  torch::nn::Linear a(8, 8), b(8, 8);
  const torch::Tensor x = torch::randn({3, 8}), y = torch::randn({3, 8});
  auto block = [&](const torch::Tensor& u, const torch::Tensor& v) {
    return accel::checkpoint(a, u) * b(v);
  };
  const auto run = [&](bool checkpointed) {
    a->zero_grad();
    b->zero_grad();
    (checkpointed ? accel::checkpoint(block, x, y) : block(x, y)).sum().backward();
    return std::pair{a->weight.grad().clone(), b->weight.grad().clone()};
  };
  const auto [a1, b1] = run(false);
  const auto [a2, b2] = run(true);
  CHECK(torch::equal(a1, a2));
  CHECK(torch::equal(b1, b2));
}

TEST_CASE("without grad mode the block just runs") {
  torch::nn::Linear a(4, 4);
  torch::NoGradGuard no_grad;
  const torch::Tensor out = accel::checkpoint(a, torch::randn({2, 4}));
  CHECK_FALSE(out.requires_grad());
}

TEST_CASE("the activations kept for backward of 8 checkpointed blocks are at most half") {
  Model m(512);
  const torch::Tensor x = torch::randn({256, 512});
  std::size_t kept[2] = {0, 0};
  for (const bool checkpointed : {false, true}) {
    m.zero_grad();
    const std::size_t before = malloc_in_use();
    torch::Tensor loss = m.forward(x, checkpointed).square().mean();
    kept[checkpointed ? 1 : 0] = malloc_in_use() - before;
    loss.backward();
  }
  MESSAGE("bytes the forward left allocated for backward: plain " << kept[0] << ", checkpointed "
                                                                  << kept[1]);
  CHECK(kept[0] > 0);
  CHECK(kept[1] * 2 <= kept[0]);
}

TEST_CASE("activation_checkpointing: a prepared Sequential's children, bitwise, half the memory") {
  torch::Tensor grads[2];
  std::size_t kept[2] = {0, 0};
  const torch::Tensor x = torch::randn({256, 512});
  for (const bool on : {false, true}) {
    accel::AcceleratorOptions options;
    options.communicator = "local";
    options.activation_checkpointing = on;
    accel::TorchAccelerator acc(options);
    CHECK(acc.activation_checkpointing() == on);
    torch::manual_seed(3);
    torch::nn::Sequential net;
    for (int b = 0; b < kBlocks; ++b) net->push_back(Block(512));
    torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(0.0));
    auto [model, optimizer] = acc.prepare(net, sgd);
    torch::manual_seed(11);
    const std::size_t before = malloc_in_use();
    torch::Tensor loss = model(x).square().mean();
    kept[on ? 1 : 0] = malloc_in_use() - before;
    acc.backward(loss);
    grads[on ? 1 : 0] = net->parameters().front().grad().clone();
  }
  MESSAGE("prepared Sequential, bytes kept for backward: plain " << kept[0] << ", checkpointed "
                                                                 << kept[1]);
  CHECK(torch::equal(grads[0], grads[1]));
  CHECK(kept[1] * 2 <= kept[0]);
}

namespace {
// Cloneable (DATA_PARALLEL copies it): three Linear-Tanh blocks, each through accel::checkpoint
// when `checkpointed` (no dropout: the replicas' threads share LibTorch's CPU generator).
struct ReplicatedImpl : torch::nn::Cloneable<ReplicatedImpl> {
  explicit ReplicatedImpl(bool checkpointed) : checkpointed(checkpointed) { reset(); }
  void reset() override {
    torch::manual_seed(5);
    fc.clear();
    for (int b = 0; b < 3; ++b)
      fc.push_back(register_module("fc" + std::to_string(b), torch::nn::Linear(64, 64)));
  }
  torch::Tensor forward(torch::Tensor x) {
    for (auto& layer : fc) {
      const auto block = [&layer](const torch::Tensor& in) { return torch::tanh(layer(in)); };
      x = checkpointed ? accel::checkpoint(block, x) : block(x);
    }
    return x;
  }
  bool checkpointed;
  std::vector<torch::nn::Linear> fc;
};
TORCH_MODULE(Replicated);
}  // namespace

TEST_CASE("acc.checkpoint under DATA_PARALLEL: bitwise the gradients of the plain forward") {
  torch::Tensor grads[2];
  const torch::Tensor x = torch::randn({32, 64});
  for (const bool on : {false, true}) {
    accel::AcceleratorOptions options;
    options.communicator = "local";
    options.distributed_type = "DATA_PARALLEL";
    options.data_parallel_replicas = 2;
    accel::TorchAccelerator acc(options);
    Replicated net(on);
    torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(0.0));
    auto [model, optimizer] = acc.prepare(net, sgd);
    REQUIRE(acc.replicates_forward());
    acc.backward(model(x).square().mean());
    std::vector<torch::Tensor> all;
    for (const auto& p : net->parameters()) all.push_back(p.grad().flatten());
    grads[on ? 1 : 0] = torch::cat(all);
  }
  CHECK(torch::equal(grads[0], grads[1]));
}

namespace {
// Blocks in a ModuleList, called by the model's own forward: nothing the switch can reach.
struct ListedImpl : torch::nn::Module {
  ListedImpl() {
    for (int b = 0; b < 2; ++b) layers->push_back(Block(16));
    register_module("layers", layers);
  }
  torch::Tensor forward(torch::Tensor x) {
    for (const auto& layer : *layers) x = layer->as<BlockImpl>()->forward(x);
    return x;
  }
  torch::nn::ModuleList layers;
};
TORCH_MODULE(Listed);
}  // namespace

TEST_CASE("activation_checkpointing on a model it cannot reach is refused at prepare, naming it") {
  accel::AcceleratorOptions options;
  options.communicator = "local";
  options.activation_checkpointing = true;
  accel::TorchAccelerator acc(options);
  Listed net;
  torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(0.1));
  std::string error;
  try {
    acc.prepare(net, sgd);
  } catch (const std::exception& e) {
    error = e.what();
  }
  CAPTURE(error);
  CHECK(error.find("activation_checkpointing") != std::string::npos);
  CHECK(error.find("ModuleList 'layers'") != std::string::npos);
  CHECK(error.find("accel::ShardedUnit") != std::string::npos);
}
