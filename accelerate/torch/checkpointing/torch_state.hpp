#pragma once
// LibTorch state as checkpoint bytes (what TorchAccelerator registers with save_state /
// load_state, as Accelerate saves model, optimizer, scheduler and random states):
//  - a module: LibTorch's own archive format, so the file loads into a plain LibTorch model
//    with torch::load(model, "DIR/state.model");
//  - an optimizer: its per-parameter state and its param groups' options (learning rates
//    included: LibTorch's own load() leaves those as built, so for the optimizers LibTorch
//    ships they are put back here; another optimizer keeps its options as built), or the
//    options alone;
//  - an LR scheduler: its step count (the learning rates themselves live in the optimizer);
//  - LibTorch's default generator of a device (dropout masks, randn).
// Loading a module checks every name, shape and dtype before it changes any value, and copies
// into the existing tensors (never replaces them: the strategy holds views of their storage).

#include <cstdint>
#include <string>

#include <c10/core/Device.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>
#include <torch/optim/schedulers/lr_scheduler.h>

namespace accel::torch_state {

std::string save_module(const torch::nn::Module& module);
// Throws CheckpointError naming the first parameter or buffer that is missing or differs.
void load_module(torch::nn::Module& module, const std::string& bytes);

std::string save_optimizer(const torch::optim::Optimizer& optimizer);
void load_optimizer(torch::optim::Optimizer& optimizer, const std::string& bytes);
// The same archive without the per-parameter state: the param groups' options only, for when
// the state is saved in flat coordinates (torch_optimizer_state.hpp). load_optimizer_options
// reads the options of either archive and leaves the state alone.
std::string save_optimizer_options(torch::optim::Optimizer& optimizer);
void load_optimizer_options(torch::optim::Optimizer& optimizer, const std::string& bytes);

std::string save_scheduler(const torch::optim::LRScheduler& scheduler);
void load_scheduler(torch::optim::LRScheduler& scheduler, const std::string& bytes);

std::string save_rng(torch::Device device);
void load_rng(torch::Device device, const std::string& bytes);
void reseed_rng(torch::Device device, std::uint64_t seed);

}  // namespace accel::torch_state
