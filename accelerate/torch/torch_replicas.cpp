#include "accelerate/torch/torch_replicas.hpp"

#include <algorithm>
#include <cstdio>
#include <unordered_set>

#include <ATen/Functions.h>
#include <ATen/Parallel.h>
#include <ATen/autocast_mode.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/grad_mode.h>

#include "accelerate/torch/autocast.hpp"
#include "accelerate/torch/detail/tensor_buffer.hpp"
#include "foundation/error.hpp"

namespace accel {

std::vector<std::pair<std::string, at::Tensor>> trainable_parameters(torch::nn::Module& module) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  std::unordered_set<const void*> seen;  // tied parameters appear once
  for (const auto& item : module.named_parameters(/*recurse=*/true)) {
    const at::Tensor& p = item.value();
    if (p.requires_grad() && seen.insert(p.unsafeGetTensorImpl()).second)
      out.emplace_back(item.key(), p);
  }
  return out;
}

TorchReplicas::TorchReplicas(torch::nn::Module& module, std::size_t trainable,
                             DataParallelOptions& options, const ReplicaFactory& factory) {
  // The replicas are clone()s in the module's own memory and the forward fans out on the CPU;
  // GPU replicas (cloning to each device, scattering inputs, gathering outputs) are only
  // implemented for the raw API, and a CUDA LibTorch is not available to test them here.
  ACCEL_CHECK_ARG(options.cuda_devices.empty(),
                  "prepare: DATA_PARALLEL on GPUs is not supported by the LibTorch adapter (its "
                  "replicas run on CPU threads: set use_cpu true); for GPUs use MULTI_GPU, DDP "
                  "with one process per GPU, as PyTorch recommends over DataParallel");
  modules_.push_back({});
  for (const auto& m : module.modules(/*include_self=*/true)) modules_[0].push_back(m.get());
  for (int k = 1; k < options.replicas; ++k) add_replica(module, k, trainable, options, factory);
  // Each worker's intra-op threads: this thread's share. LibTorch's OpenMP thread count is
  // per thread (the OpenMP ICV of the calling thread), so this leaves the caller's alone
  // (data_parallel_test checks it).
  const int threads = std::max(1, at::get_num_threads() / options.replicas);
  options.worker_init = [threads](int) { at::set_num_threads(threads); };
}

namespace {

// A c10::Error's message without LibTorch's stack frames.
std::string message_of(const std::exception& e) {
  std::string text = e.what();
  if (const auto* c10 = dynamic_cast<const c10::Error*>(&e)) text = c10->what_without_backtrace();
  while (!text.empty() && (text.back() == '.' || text.back() == '\n')) text.pop_back();
  return text;
}

std::shared_ptr<torch::nn::Module> clone_of(torch::nn::Module& module) {
  try {
    return module.clone();
  } catch (const std::exception& e) {
    throw InvalidArgument(
        "prepare: DATA_PARALLEL copies the model with module->clone(), which failed: " +
        message_of(e) +
        ". Pass a factory that builds the module, acc.prepare(model, optimizer, [] { return "
        "Net(); }) (prepare copies the values into each replica), or derive the module from "
        "torch::nn::Cloneable<Impl> and build its submodules in reset()");
  }
}

// Replica `k` from the loop's factory, holding the model's values.
std::shared_ptr<torch::nn::Module> built_copy_of(torch::nn::Module& module, int k,
                                                 const ReplicaFactory& factory) {
  std::shared_ptr<torch::nn::Module> copy = factory();
  ACCEL_CHECK_ARG(copy != nullptr, "prepare: the replica factory returned no module");
  const std::string which =
      "prepare: DATA_PARALLEL replica " + std::to_string(k) + " (built by the factory)";
  auto copy_named = [&](const torch::OrderedDict<std::string, at::Tensor>& from,
                        const torch::OrderedDict<std::string, at::Tensor>& to, const char* what) {
    ACCEL_CHECK_ARG(from.size() == to.size(), which + " has " + std::to_string(to.size()) + " " +
                                                  what + "s, the model " +
                                                  std::to_string(from.size()));
    for (const auto& item : from) {
      const at::Tensor* target = to.find(item.key());
      ACCEL_CHECK_ARG(target != nullptr, which + " has no " + what + " '" + item.key() + "'");
      if (!item.value().defined()) continue;
      ACCEL_CHECK_ARG(
          target->defined() && target->sizes() == item.value().sizes(),
          which + ": " + what + " '" + item.key() + "' has another shape than the " + "model's");
      // The model's values, dtype and device (the loop may have moved the model after building it).
      at::Tensor(*target).set_data(item.value().detach().clone());
    }
  };
  torch::NoGradGuard no_grad;
  copy_named(module.named_parameters(/*recurse=*/true), copy->named_parameters(true), "parameter");
  copy_named(module.named_buffers(/*recurse=*/true), copy->named_buffers(true), "buffer");
  copy->train(module.is_training());
  return copy;
}

}  // namespace

void TorchReplicas::add_replica(torch::nn::Module& module, int k, std::size_t trainable,
                                DataParallelOptions& options, const ReplicaFactory& factory) {
  std::shared_ptr<torch::nn::Module> copy =
      factory ? built_copy_of(module, k, factory) : clone_of(module);
  std::vector<ParamRef> refs;
  std::vector<at::Tensor> params;
  for (auto& [name, p] : trainable_parameters(*copy)) {
    const Buffer data =
        tensor_buffer(p, "replica " + std::to_string(k) + " parameter '" + name + "'");
    refs.push_back({name, data, gradient_wanted(data), 0, p.sizes().vec()});
    params.push_back(p);
  }
  ACCEL_CHECK_ARG(params.size() == trainable,
                  "prepare: replica " + std::to_string(k) + " of the model has " +
                      std::to_string(params.size()) + " trainable parameters, the model " +
                      std::to_string(trainable));
  std::vector<Buffer> buffers;
  for (const auto& item : copy->named_buffers(/*recurse=*/true))
    if (item.value().defined())
      buffers.push_back(tensor_buffer(item.value(), "replica buffer '" + item.key() + "'"));
  modules_.push_back({});
  for (const auto& m : copy->modules(/*include_self=*/true)) modules_.back().push_back(m.get());
  options.replica_params.push_back(std::move(refs));
  options.replica_buffers.push_back(std::move(buffers));
  params_.push_back(std::move(params));
  copies_.push_back(std::move(copy));
}

torch::nn::Module& TorchReplicas::module(int k) {
  ACCEL_CHECK_ARG(k >= 1 && std::size_t(k) <= copies_.size(),
                  "DataParallel: no replica " + std::to_string(k));
  return *copies_[std::size_t(k) - 1];
}

void TorchReplicas::attach(const Strategy& strategy) {
  for (std::size_t k = 1; k <= params_.size(); ++k) {
    std::vector<at::Tensor> grads;
    for (std::size_t i = 0; i < params_[k - 1].size(); ++i) {
      const Buffer slot = strategy.grad_slot(int(k), i);
      const at::Tensor& p = params_[k - 1][i];
      grads.push_back(at::from_blob(slot.data, p.sizes(), p.options()));
    }
    grads_.push_back(std::move(grads));
    point_grads(k);
  }
  attached_ = true;
}

void TorchReplicas::point_grads(std::size_t k) {
  std::vector<at::Tensor>& params = params_[k - 1];
  const std::vector<at::Tensor>& slots = grads_[k - 1];
  for (std::size_t i = 0; i < params.size(); ++i) {
    at::Tensor& grad = params[i].mutable_grad();
    if (grad.defined() && grad.data_ptr() == slots[i].data_ptr()) continue;
    if (grad.defined()) slots[i].copy_(grad);  // autograd replaced it: keep what it holds
    grad = slots[i];
  }
}

// Replicas follow replica 0's train/eval flags. Modules are visited parents first, so each
// ends with its own flag.
void TorchReplicas::follow_training_flags() {
  for (std::size_t k = 1; k < modules_.size(); ++k)
    for (std::size_t m = 0; m < modules_[0].size(); ++m)
      if (modules_[k][m]->is_training() != modules_[0][m]->is_training())
        modules_[k][m]->train(modules_[0][m]->is_training());
}

at::Tensor TorchReplicas::forward(ReplicaSet& replicas, std::int64_t rows,
                                  const std::function<at::Tensor(int, Shard)>& forward) {
  follow_training_flags();
  const std::vector<Shard> chunks = chunk_rows(std::size_t(rows), replicas.count());
  // Grad mode and autocast are per thread: the workers run in the caller's.
  const bool grad = at::GradMode::is_enabled();
  const bool autocast = at::autocast::is_cpu_enabled();
  const at::ScalarType autocast_type = at::autocast::get_autocast_cpu_dtype();
  std::vector<at::Tensor> outputs(chunks.size());
  replicas.run([&](int k) {
    const Shard chunk = chunks[std::size_t(k)];
    if (chunk.count == 0) return;
    at::AutoGradMode grad_mode(grad);
    {
      CpuAutocastAs as_caller(autocast, autocast_type);
      outputs[std::size_t(k)] = forward(k, chunk);
    }
    if (autocast) at::autocast::clear_cache();
  });
  std::vector<at::Tensor> pieces;
  for (std::size_t k = 0; k < outputs.size(); ++k) {
    if (!outputs[k].defined()) continue;
    if (!grad || !outputs[k].requires_grad()) {
      pieces.push_back(outputs[k]);
      continue;
    }
    // The loop's graph starts at a leaf per replica: backward() runs the replica's own graph
    // from the leaf's gradient on the replica's worker.
    at::Tensor leaf = outputs[k].detach().requires_grad_(true);
    outputs_.push_back({int(k), outputs[k], leaf});
    pieces.push_back(leaf);
  }
  ACCEL_CHECK_ARG(!pieces.empty(), "DataParallel: the model's call got 0 rows");
  return pieces.size() == 1 ? pieces[0] : at::cat(pieces, 0);
}

void TorchReplicas::begin_backward(ReplicaSet& replicas) {
  if (outputs_.empty() && !warned_forward_) {
    warned_forward_ = true;
    std::fprintf(stderr,
                 "accel: warning: DATA_PARALLEL: this backward has no output of the prepared "
                 "model's call; call the prepared model, model(x), not model->forward(x), or "
                 "replica 0 computes the whole batch alone (still correct, on one thread)\n");
  }
  replicas.set_weights(std::vector<double>(std::size_t(replicas.count()), 1.0));
}

void TorchReplicas::backward(ReplicaSet& replicas) {
  std::vector<Output> outputs = std::move(outputs_);
  outputs_.clear();
  replicas.run([&](int k) {
    if (k > 0) point_grads(std::size_t(k));
    NoCpuAutocast no_autocast;
    for (const Output& o : outputs)
      if (o.replica == k && o.leaf.grad().defined()) o.output.backward(o.leaf.grad());
    if (k > 0) point_grads(std::size_t(k));
  });
}

void TorchReplicas::zero_grads() {
  for (std::size_t k = 1; k <= grads_.size(); ++k) {
    point_grads(k);
    for (at::Tensor& g : grads_[k - 1]) g.zero_();
  }
}

}  // namespace accel
