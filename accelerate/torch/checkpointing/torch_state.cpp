#include "accelerate/torch/checkpointing/torch_state.hpp"

#include <cstring>
#include <mutex>
#include <sstream>
#include <utility>
#include <vector>

#include <ATen/Context.h>
#include <ATen/Functions.h>
#include <torch/csrc/autograd/grad_mode.h>
#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/lbfgs.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/serialize.h>
#include <torch/optim/sgd.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

#include "accelerate/checkpointing/checkpoint_manifest.hpp"

namespace accel::torch_state {
namespace {

std::string archive_bytes(torch::serialize::OutputArchive& archive) {
  std::ostringstream out;
  archive.save_to(out);
  return out.str();
}

void open_archive(torch::serialize::InputArchive& archive, const std::string& bytes,
                  const std::string& what) {
  try {
    archive.load_from(bytes.data(), bytes.size());
  } catch (const std::exception& e) {
    throw CheckpointError(what + " is not a LibTorch archive: " + e.what());
  }
}

// A module's tensors paired with their saved values, collected (and checked) before any is
// changed.
using Assignments = std::vector<std::pair<at::Tensor, at::Tensor>>;

std::string describe(const at::Tensor& t) {
  std::ostringstream out;
  out << t.scalar_type() << t.sizes();
  return out.str();
}

// Mirrors torch::nn::Module::save: this module's own parameters and buffers, then a nested
// archive per child module.
void collect(torch::nn::Module& module, torch::serialize::InputArchive& archive,
             const std::string& prefix, Assignments& out) {
  auto take = [&](const std::string& key, const at::Tensor& target, bool is_buffer) {
    const std::string name = prefix + key;
    at::Tensor saved;  // undefined: try_read hands out the saved tensor instead of set_()
    bool found = false;
    try {
      found = archive.try_read(key, saved, is_buffer);
    } catch (const std::exception& e) {
      throw CheckpointError("model state: '" + name + "' does not read: " + e.what());
    }
    if (!found)
      throw CheckpointError("model state: the checkpoint has no " +
                            std::string(is_buffer ? "buffer" : "parameter") + " '" + name + "'");
    if (saved.scalar_type() != target.scalar_type() || saved.sizes() != target.sizes())
      throw CheckpointError("model state: '" + name + "' is " + describe(saved) +
                            " in the checkpoint but " + describe(target) + " in this model");
    out.emplace_back(target, saved);
  };
  for (const auto& p : module.named_parameters(/*recurse=*/false)) take(p.key(), p.value(), false);
  for (const auto& b : module.named_buffers(/*recurse=*/false))
    if (b.value().defined()) take(b.key(), b.value(), true);
  for (const auto& child : module.named_children()) {
    if (!child.value()->is_serializable()) continue;
    torch::serialize::InputArchive nested;
    if (!archive.try_read(child.key(), nested))
      throw CheckpointError("model state: the checkpoint has no module '" + prefix + child.key() +
                            "'");
    collect(*child.value(), nested, prefix + child.key() + ".", out);
  }
}

// LibTorch 1.13's Optimizer::load restores the per-parameter state but not the param groups'
// options, although save() writes them: a resumed run would continue with the learning rate
// the optimizer was built with, not the one its scheduler had reached. These put the saved
// options back, for the optimizers LibTorch ships (their option types are known here).
template <typename Options>
bool restore_options(torch::serialize::InputArchive& archive, torch::optim::Optimizer& optimizer) {
  auto& groups = optimizer.param_groups();
  if (groups.empty() || dynamic_cast<Options*>(&groups[0].options()) == nullptr) return false;
  torch::serialize::InputArchive groups_archive;
  archive.read("param_groups", groups_archive);
  std::vector<std::pair<std::vector<std::string>, std::unique_ptr<torch::optim::OptimizerOptions>>>
      saved;
  torch::optim::detail::serialize<Options>(groups_archive, saved);
  if (saved.size() != groups.size())
    throw CheckpointError("optimizer state has " + std::to_string(saved.size()) +
                          " param groups, this optimizer " + std::to_string(groups.size()));
  for (std::size_t i = 0; i < groups.size(); ++i)
    static_cast<Options&>(groups[i].options()) = static_cast<const Options&>(*saved[i].second);
  return true;
}

void restore_param_group_options(torch::serialize::InputArchive& archive,
                                 torch::optim::Optimizer& optimizer) {
  using namespace torch::optim;
  const bool known = restore_options<SGDOptions>(archive, optimizer) ||
                     restore_options<AdamOptions>(archive, optimizer) ||
                     restore_options<AdamWOptions>(archive, optimizer) ||
                     restore_options<RMSpropOptions>(archive, optimizer) ||
                     restore_options<AdagradOptions>(archive, optimizer) ||
                     restore_options<LBFGSOptions>(archive, optimizer);
  (void)known;  // another optimizer keeps the options it was built with (documented)
}

// LRScheduler keeps its step count protected and offers no accessor; a derived class may name
// the member, and the pointer it hands out reaches it in any LRScheduler.
struct SchedulerAccess : torch::optim::LRScheduler {
  static unsigned torch::optim::LRScheduler::*step_count() { return &SchedulerAccess::step_count_; }
};

}  // namespace

std::string save_module(const torch::nn::Module& module) {
  torch::serialize::OutputArchive archive;
  module.save(archive);
  return archive_bytes(archive);
}

void load_module(torch::nn::Module& module, const std::string& bytes) {
  torch::serialize::InputArchive archive;
  open_archive(archive, bytes, "model state");
  Assignments assignments;
  collect(module, archive, "", assignments);
  torch::NoGradGuard no_grad;
  for (auto& [target, saved] : assignments) target.copy_(saved);
}

std::string save_optimizer(const torch::optim::Optimizer& optimizer) {
  torch::serialize::OutputArchive archive;
  optimizer.save(archive);
  return archive_bytes(archive);
}

void load_optimizer(torch::optim::Optimizer& optimizer, const std::string& bytes) {
  torch::serialize::InputArchive archive;
  open_archive(archive, bytes, "optimizer state");
  try {
    optimizer.load(archive);
    restore_param_group_options(archive, optimizer);
  } catch (const CheckpointError&) {
    throw;
  } catch (const std::exception& e) {
    throw CheckpointError(std::string("optimizer state does not fit this optimizer: ") + e.what());
  }
}

std::string save_optimizer_options(torch::optim::Optimizer& optimizer) {
  // LibTorch writes state and param groups in one call: the state is set aside meanwhile.
  auto& state = optimizer.state();
  auto kept = std::move(state);
  state.clear();
  struct PutBack {
    decltype(kept)& from;
    decltype(state)& to;
    ~PutBack() { to = std::move(from); }
  } put_back{kept, state};
  return save_optimizer(optimizer);
}

void load_optimizer_options(torch::optim::Optimizer& optimizer, const std::string& bytes) {
  torch::serialize::InputArchive archive;
  open_archive(archive, bytes, "optimizer options");
  try {
    restore_param_group_options(archive, optimizer);
  } catch (const CheckpointError&) {
    throw;
  } catch (const std::exception& e) {
    throw CheckpointError(std::string("optimizer options do not fit this optimizer: ") + e.what());
  }
}

std::string save_scheduler(const torch::optim::LRScheduler& scheduler) {
  return std::to_string(scheduler.*SchedulerAccess::step_count());
}

void load_scheduler(torch::optim::LRScheduler& scheduler, const std::string& bytes) {
  std::istringstream in(bytes);
  unsigned steps = 0;
  if (!(in >> steps) || !(in >> std::ws).eof())
    throw CheckpointError("scheduler state '" + bytes.substr(0, 40) + "' is not a step count");
  scheduler.*SchedulerAccess::step_count() = steps;
}

std::string save_rng(torch::Device device) {
  at::Generator generator = at::globalContext().defaultGenerator(device);  // a shared handle
  std::lock_guard<std::mutex> lock(generator.mutex());
  const at::Tensor state = generator.get_state();  // uint8, contiguous
  return std::string(static_cast<const char*>(state.data_ptr()), std::size_t(state.numel()));
}

void load_rng(torch::Device device, const std::string& bytes) {
  at::Generator generator = at::globalContext().defaultGenerator(device);
  std::lock_guard<std::mutex> lock(generator.mutex());
  const at::Tensor expected = generator.get_state();
  if (std::size_t(expected.numel()) != bytes.size())
    throw CheckpointError("LibTorch RNG state (" + device.str() + ") has " +
                          std::to_string(bytes.size()) + " bytes, this LibTorch's has " +
                          std::to_string(expected.numel()));
  at::Tensor state = at::empty({std::int64_t(bytes.size())}, at::kByte);
  std::memcpy(state.data_ptr(), bytes.data(), bytes.size());
  generator.set_state(state);
}

void reseed_rng(torch::Device device, std::uint64_t seed) {
  at::Generator generator = at::globalContext().defaultGenerator(device);
  std::lock_guard<std::mutex> lock(generator.mutex());
  generator.set_current_seed(seed);
}

}  // namespace accel::torch_state
