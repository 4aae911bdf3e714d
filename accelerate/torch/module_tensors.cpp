#include "accelerate/torch/module_tensors.hpp"

#include <sstream>
#include <unordered_set>

#include <torch/csrc/jit/api/module.h>
#include <torch/nn/module.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

#include "accelerate/checkpointing/checkpoint_manifest.hpp"
#include "accelerate/torch/checkpointing/torch_state.hpp"
#include "accelerate/torch/torch_replicas.hpp"
#include "foundation/error.hpp"

namespace accel {
namespace {

// A TorchScript module's parameters and buffers under their dotted names, flat in one
// archive (a torch::nn::Module's archive nests per submodule instead).
std::string save_script(const torch::jit::Module& module) {
  torch::serialize::OutputArchive archive;
  for (const auto& item : module.named_parameters(/*recurse=*/true))
    archive.write(item.name, item.value);
  for (const auto& item : module.named_buffers(/*recurse=*/true))
    archive.write(item.name, item.value, /*is_buffer=*/true);
  std::ostringstream out;
  archive.save_to(out);
  return out.str();
}

void load_script(const torch::jit::Module& module, const std::string& bytes) {
  torch::serialize::InputArchive archive;
  std::istringstream in(bytes);
  try {
    archive.load_from(in);
  } catch (const std::exception& e) {
    throw CheckpointError(std::string("TorchScript model state is not a LibTorch archive: ") +
                          e.what());
  }
  // Every tensor is read and checked before any is changed.
  std::vector<std::pair<at::Tensor, at::Tensor>> assignments;
  auto collect = [&](const std::string& name, const at::Tensor& target, bool is_buffer) {
    at::Tensor saved;
    if (!archive.try_read(name, saved, is_buffer))
      throw CheckpointError("TorchScript model state has no tensor '" + name + "'");
    if (saved.sizes() != target.sizes() || saved.scalar_type() != target.scalar_type())
      throw CheckpointError("TorchScript model state: '" + name + "' does not match the model");
    assignments.emplace_back(target, saved);
  };
  for (const auto& item : module.named_parameters(true)) collect(item.name, item.value, false);
  for (const auto& item : module.named_buffers(true)) collect(item.name, item.value, true);
  torch::NoGradGuard no_grad;
  for (auto& [target, saved] : assignments) target.copy_(saved);
}

}  // namespace

ModuleTensors module_tensors(torch::nn::Module& module) {
  ModuleTensors out;
  out.trainable = trainable_parameters(module);
  for (const auto& item : module.named_buffers(/*recurse=*/true))
    if (item.value().defined()) out.buffers.emplace_back(item.key(), item.value());
  out.save = [&module] { return torch_state::save_module(module); };
  out.load = [&module](const std::string& bytes) { torch_state::load_module(module, bytes); };
  out.module = &module;
  return out;
}

ModuleTensors module_tensors(const torch::jit::Module& module) {
  ModuleTensors out;
  std::unordered_set<const void*> seen;  // tied parameters appear once
  for (const auto& item : module.named_parameters(/*recurse=*/true))
    if (item.value.requires_grad() && seen.insert(item.value.unsafeGetTensorImpl()).second)
      out.trainable.emplace_back(item.name, item.value);
  for (const auto& item : module.named_buffers(/*recurse=*/true))
    if (item.value.defined()) out.buffers.emplace_back(item.name, item.value);
  out.save = [module] { return save_script(module); };
  out.load = [module](const std::string& bytes) { load_script(module, bytes); };
  return out;
}

}  // namespace accel
