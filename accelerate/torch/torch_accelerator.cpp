#include "accelerate/torch/torch_accelerator.hpp"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <unordered_map>
#include <unordered_set>

#include <ATen/Functions.h>
#include <ATen/Parallel.h>
#include <ATen/autocast_mode.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/grad_mode.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>
#include <torch/utils.h>

#if ACCEL_TORCH_WITH_CUDA  // a CUDA-enabled LibTorch (accelerate/torch/CMakeLists.txt)
#include <c10/cuda/CUDAStream.h>
#endif

#include "accelerate/prepared_parameters.hpp"
#include "accelerate/torch/checkpointing/full_optimizer_state.hpp"
#include "accelerate/torch/checkpointing/torch_optimizer_state.hpp"
#include "accelerate/torch/checkpointing/torch_state.hpp"
#include "accelerate/torch/detail/prepared_tensors.hpp"
#include "accelerate/torch/detail/tensor_buffer.hpp"
#include "accelerate/torch/detail/tensor_collectives.hpp"
#include "accelerate/torch/torch_replicas.hpp"
#include "config/config.hpp"
#include "foundation/error.hpp"

namespace accel {
namespace {
// True while it lives: the gradient hooks tell acc.backward's backward from a direct one.
class ScopedFlag {
 public:
  explicit ScopedFlag(std::atomic<bool>& flag) : flag_(flag) { flag_ = true; }
  ~ScopedFlag() { flag_ = false; }
  ScopedFlag(const ScopedFlag&) = delete;
  ScopedFlag& operator=(const ScopedFlag&) = delete;

 private:
  std::atomic<bool>& flag_;
};
}  // namespace

// ---- TorchAccelerator

TorchAccelerator::TorchAccelerator(AcceleratorOptions options) : Accelerator(std::move(options)) {
  if (precision() == config::MixedPrecision::fp16 && device() == DeviceKind::cpu)
    throw InvalidArgument(
        "mixed_precision fp16 needs a CUDA device; on the CPU use bf16 (LibTorch's CPU "
        "autocast runs in bfloat16)");
  // Each rank's generators (dropout masks differ per rank when seeded per rank).
  auto register_generator = [this](const std::string& name, torch::Device device) {
    register_rng(
        name, [device] { return torch_state::save_rng(device); },
        [device](const std::string& bytes) { torch_state::load_rng(device, bytes); },
        [device](std::uint64_t seed) { torch_state::reseed_rng(device, seed); });
  };
  register_generator("torch_rng", torch::Device(torch::kCPU));
  if (device_for_tensors().is_cuda()) register_generator("torch_cuda_rng", device_for_tensors());
}

TorchAccelerator::~TorchAccelerator() {
  // The hooks point at this object and the gradients into its buckets: detach both so the
  // models outlive the accelerator safely.
  for (const auto& model : prepared_) {
    if (model->units) model->units->detach_blocks();
    for (std::size_t i = 0; i < model->accumulators.size(); ++i)
      model->accumulators[i]->del_post_hook(model->hook_keys[i]);
    if (model->gradients) model->gradients->leave_model();
    if (!model->sharded_optimizer) continue;
    if (model->units && model->units->active()) {  // ZeRO-3: see Zero3Units::leave_model
      model->units->leave_model();
      continue;
    }
    // The parameters' values and the optimizer's slices live in the strategy's buffers: give
    // each tensor (the same TensorImpl the model and the optimizer hold) its own copy. The
    // optimizer itself may already be gone (declared after the accelerator), so it is not
    // touched: its groups keep the (now self-owned) slices.
    torch::NoGradGuard no_grad;
    for (at::Tensor& p : model->params) p.set_data(p.detach().clone());
    for (at::Tensor& slice : model->slices) {
      at::Tensor grad = slice.grad().defined() ? slice.grad().clone() : at::Tensor();
      slice.set_data(slice.detach().clone());
      slice.mutable_grad() = grad;
    }
  }
}

void TorchAccelerator::seed_generators(std::uint64_t seed) {
  // torch::manual_seed asks CUDA for its device count: a CUDA runtime call that a CPU run of a
  // CUDA-enabled LibTorch must not make (cpu_only_test's tripwire), and nothing to seed there.
  if (device() == DeviceKind::cuda)
    torch::manual_seed(seed);
  else
    torch_state::reseed_rng(torch::Device(torch::kCPU), seed);
}

torch::Device TorchAccelerator::device_for_tensors() const {
  if (device() == DeviceKind::cuda)
    return torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(local_process_index()));
  return torch::Device(torch::kCPU);
}

bool TorchAccelerator::replicates_forward() const {
  return replicas_ != nullptr && (replicas_->has_copies() || replicas_->attached());
}

torch::nn::Module& TorchAccelerator::replica_module(int k) {
  ACCEL_CHECK_ARG(replicas_ != nullptr, "DataParallel: no replica " + std::to_string(k));
  return replicas_->module(k);
}

at::Tensor TorchAccelerator::replica_forward(std::int64_t rows,
                                             const std::function<at::Tensor(int, Shard)>& forward) {
  ReplicaSet* dp = strategy().replicas();
  ACCEL_CHECK_ARG(dp != nullptr, "replica_forward: DATA_PARALLEL is not configured");
  sync_buffers();  // replicas follow replica 0's buffers (BatchNorm statistics)
  return replicas_->forward(*dp, rows, forward);
}

AcceleratedScheduler& TorchAccelerator::prepare_scheduler(torch::optim::LRScheduler& scheduler) {
  ACCEL_CHECK_ARG(!prepared_.empty(), "prepare_scheduler: prepare the model and optimizer first");
  ACCEL_CHECK_ARG(prepared_.size() == 1,
                  "prepare_scheduler: " + std::to_string(prepared_.size()) +
                      " optimizers are prepared; name the one this scheduler schedules: "
                      "prepare_scheduler(scheduler, optimizer)");
  return prepare_scheduler(scheduler, *prepared_[0]->optimizer);
}

AcceleratedScheduler& TorchAccelerator::prepare_scheduler(torch::optim::LRScheduler& scheduler,
                                                          AcceleratedOptimizer& optimizer) {
  for (const auto& s : schedulers_)
    ACCEL_CHECK_ARG(&s->scheduler() != &scheduler,
                    "prepare_scheduler: this scheduler was already prepared");
  const std::string name = prepared_name("scheduler", schedulers_.size());
  schedulers_.push_back(std::make_unique<AcceleratedScheduler>(optimizer, scheduler));
  register_state(
      name, [&scheduler] { return torch_state::save_scheduler(scheduler); },
      [&scheduler](const std::string& bytes) { torch_state::load_scheduler(scheduler, bytes); });
  return *schedulers_.back();
}

const std::vector<torch::Tensor>& TorchAccelerator::prepared_parameters(std::size_t model) const {
  ACCEL_CHECK_ARG(model < prepared_.size(), "prepared_parameters: no model " +
                                                std::to_string(model) + " prepared (" +
                                                std::to_string(prepared_.size()) + " are)");
  return prepared_[model]->params;
}

std::size_t TorchAccelerator::index_of_module(const torch::nn::Module& module) const {
  for (const auto& model : prepared_)
    if (model->module == &module) return model->index;
  throw InvalidArgument("this model was not prepared by this accelerator (acc.prepare)");
}

void TorchAccelerator::on_grad_accumulated(PreparedTensors& model, std::size_t i) {
  // Autograd adds into an existing gradient in place; it only replaces the tensor under
  // create_graph or when the user reset the gradient. Then the new values move into the slot.
  if (!in_backward_) backward_outside_ = true;  // loss.backward() called directly
  model.gradients->accumulated(i);
  grad_ready(model.index, i);
  model.gradients->free_released();  // lent: what the strategy has copied into its buckets
  if (model.units) model.units->gradient_accumulated(i);
}

// ---- OptimizerHost

bool TorchAccelerator::ready_to_step() const {
  // A gradient hook fired outside acc.backward: refused instead of silently not stepping.
  if (backward_outside_)
    throw InvalidArgument(
        "optimizer step: a backward ran through the prepared model without the accelerator "
        "(loss.backward() called directly), so its gradients were never synchronised and this "
        "step would silently do nothing. Call acc.backward(loss) instead of loss.backward()");
  return synced_;
}

void TorchAccelerator::before_step(std::size_t index) {
  prepared_.at(index)->gradients->before_step();
}

void TorchAccelerator::after_step(std::size_t index) {
  strategy(index).after_optimizer_step();  // ZeRO: all-gather the parameters
  PreparedTensors& model = *prepared_.at(index);
  if (model.units) model.units->settle_all();  // ZeRO-3: nothing gathered now
}

void TorchAccelerator::zero_grad(std::size_t index) {
  if (accumulating_) return;
  prepared_.at(index)->gradients->zero();
  if (replicas_ != nullptr && index == 0) replicas_->zero_grads();  // DataParallel's
}

bool TorchAccelerator::holds_slices(std::size_t index) const {
  return prepared_.at(index)->sharded_optimizer != nullptr;
}

RootForward TorchAccelerator::root_forward(const torch::nn::Module& module) {
  if (prepared_.empty()) return {};
  PreparedTensors& model = *prepared_[index_of_module(module)];
  return model.units ? model.units->root_forward() : RootForward();
}

void TorchAccelerator::sync_buffers() {
  for (const auto& model : prepared_) {
    if (model->buffers.empty()) continue;
    for (std::size_t i = 0; i < model->buffers.size(); ++i)
      ACCEL_CHECK_ARG(model->buffers[i].data_ptr() == model->buffer_data[i],
                      "a module buffer was replaced after prepare; update buffers in place");
    strategy(model->index).sync_buffers();
  }
}

bool TorchAccelerator::backward(const torch::Tensor& loss) {
  ACCEL_CHECK_ARG(!prepared_.empty(), "backward: prepare the model first");
  for (const auto& model : prepared_) model->gradients->reconcile();
  sync_buffers();
  ReplicaSet* dp = strategy(0).replicas();  // DATA_PARALLEL: its one model
  if (dp != nullptr) replicas_->begin_backward(*dp);
  {
    const ScopedFlag in_backward(in_backward_);
    NoCpuAutocast no_autocast;
    const float scale = loss_scale();
    if (scale == 1.0f)
      loss.backward();
    else
      (loss * scale).backward();
  }
  for (const auto& model : prepared_)  // ZeRO-3: what is still gathered
    if (model->units) model->units->release_in_use();
  if (dp != nullptr) {
    const ScopedFlag in_backward(in_backward_);
    replicas_->backward(*dp);
  }
  synced_ = sync_gradients();
  accumulating_ = !synced_ && !optimizer_step_was_skipped();
  for (const auto& model : prepared_) {
    model->gradients->remember_at_sync(synced_ && !model->slices.empty());
    model->gradients->free_released();
    model->optimizer->show_gradients(!accumulating_);
  }
  return synced_;
}

void TorchAccelerator::save(const AcceleratedOptimizer& optimizer, const std::string& path) {
  const PreparedTensors& model = *prepared_.at(optimizer.model());
  if (model.sharded_optimizer == nullptr)  // the user's optimizer holds the whole parameters
    return save<torch::optim::Optimizer>(optimizer, path);
  ACCEL_CHECK_ARG(state_dict_type() != config::StateDictType::SHARDED_STATE_DICT,
                  "acc.save(optimizer) under ZeRO with state_dict_type SHARDED_STATE_DICT: each "
                  "rank holds only its slices, which a plain LibTorch optimizer cannot load. Set "
                  "state_dict_type FULL_STATE_DICT (the default) to gather the full state to the "
                  "main process, or save with acc.save_state(dir)");
  // Where each whole parameter starts among its group's parameters laid end to end (strategy
  // order), for the user's groups (the aliases, in the user's order).
  const std::vector<ParamRef>& refs = strategy(model.index).params();
  std::vector<std::size_t> offset_of(refs.size()), group_end;
  for (std::size_t i = 0; i < refs.size(); ++i) {
    if (group_end.size() <= refs[i].group) group_end.resize(refs[i].group + 1);
    offset_of[i] = group_end[refs[i].group];
    group_end[refs[i].group] += refs[i].data.count;
  }
  std::unordered_map<const void*, std::size_t> index_of;
  for (std::size_t i = 0; i < model.params.size(); ++i)
    index_of.emplace(model.params[i].unsafeGetTensorImpl(), i);
  ShardedOptimizer sharded{
      &optimizer.optimizer(), strategy(model.index).segments(), model.slices, &optimizer, {}};
  std::size_t next = 0;  // aliases_ lists the groups' parameters in order
  for (const auto& group : optimizer.param_groups()) {
    sharded.offsets.emplace_back();
    for (std::size_t j = 0; j < group.params().size(); ++j)
      sharded.offsets.back().push_back(
          offset_of.at(index_of.at(optimizer.aliases().at(next++).second.unsafeGetTensorImpl())));
  }
  const std::string bytes = full_optimizer_archive(sharded, *this);
  if (is_main_process()) write_file_atomically(path, bytes);
  wait_for_everyone();
}

void TorchAccelerator::before_save_state() {
  // ZeRO-3: rank 0 (each machine's first rank, saved on each node) writes the model as a
  // LibTorch archive ("model"): its parameters get whole copies, gathered unit by unit on every
  // rank. SHARDED_STATE_DICT: each rank writes its slices, nothing is gathered.
  if (state_dict_type() == config::StateDictType::SHARDED_STATE_DICT) return;
  const bool keep = writes_shared_checkpoint_files();
  for (const auto& model : prepared_)
    if (model->units && model->units->active()) model->units->gather_whole(keep);
}

void TorchAccelerator::after_save_state() {
  for (const auto& model : prepared_)
    if (model->units && model->units->active()) model->units->settle_all();  // copies freed
}

void TorchAccelerator::load_parameter_values(const PreparedParameters& prepared,
                                             const FullParameters& values) {
  PreparedTensors& model = *prepared_.at(prepared.index);
  if (!model.units || !model.units->active())
    return Accelerator::load_parameter_values(prepared, values);
  // ZeRO-3 (SHARDED_STATE_DICT): the strategy keeps each rank's parts of the whole values.
  std::vector<Buffer> whole;
  for (std::size_t i = 0; i < prepared.params.size(); ++i) {
    const Buffer& like = prepared.params[i].data;
    whole.push_back(
        {const_cast<char*>(values.params[i].data()), like.count, like.dtype, DeviceKind::cpu});
  }
  model.units->load_values(whole);
  copy_buffers_in(prepared, values);
}

std::vector<std::pair<std::string, at::Tensor>> TorchAccelerator::get_state_dict(
    std::size_t index) {
  PreparedTensors& model = *prepared_.at(index);
  if (model.units && model.units->active()) return model.units->state_dict(*model.module);
  const torch::nn::Module& module = *model.module;
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& item : module.named_parameters(/*recurse=*/true))
    out.emplace_back(item.key(), item.value().detach().clone());
  for (const auto& item : module.named_buffers(/*recurse=*/true))
    out.emplace_back(item.key(), item.value().detach().clone());
  return out;
}

TorchAccelerator::DataLoader TorchAccelerator::prepare_data_loader(torch::Tensor data,
                                                                   torch::Tensor targets,
                                                                   SamplerOptions options) {
  ACCEL_CHECK_ARG(data.dim() >= 1, "prepare_data_loader: data needs a sample dimension");
  ShardedSampler sampler = make_sampler(std::size_t(data.size(0)), options);
  return DataLoader(*this, std::move(data), std::move(targets), std::move(sampler),
                    device_for_tensors());
}

torch::Tensor TorchAccelerator::gather(const torch::Tensor& t) {
  return tensor_collectives::gather(comm(), t);
}

torch::Tensor TorchAccelerator::gather_for_metrics(const torch::Tensor& t, const DataLoader& loader,
                                                   std::size_t batch_index) {
  at::Tensor all = gather(t);
  const auto padding = std::int64_t(loader.sampler().padding());
  if (batch_index + 1 == loader.size() && padding <= all.size(0))
    all = all.narrow(0, 0, all.size(0) - padding);
  return all;
}

torch::Tensor TorchAccelerator::gather_for_metrics(const torch::Tensor& t,
                                                   const DatasetLoaderBase& loader) {
  at::Tensor all = gather(t);
  const auto padding = std::int64_t(loader.padding());
  if (loader.batch_index() + 1 == loader.size() && padding <= all.size(0))
    all = all.narrow(0, 0, all.size(0) - padding);
  return all;
}

torch::Tensor TorchAccelerator::split_between_processes(const torch::Tensor& t) const {
  ACCEL_CHECK_ARG(t.dim() >= 1, "split_between_processes: the tensor needs a dimension 0");
  const auto [begin, end] = split_between_processes(std::size_t(t.size(0)));
  return t.narrow(0, std::int64_t(begin), std::int64_t(end - begin));
}

torch::Tensor TorchAccelerator::reduce(const torch::Tensor& t, ReduceOp op) {
  return tensor_collectives::reduce(comm(), t, op);
}

void TorchAccelerator::broadcast(torch::Tensor& t, int root) {
  tensor_collectives::broadcast(comm(), t, root);
}

torch::Tensor TorchAccelerator::pad_across_processes(const torch::Tensor& t, double value) {
  return tensor_collectives::pad_across_processes(comm(), t, value);
}

AutocastSettings TorchAccelerator::autocast_settings() const {
  return {precision() != config::MixedPrecision::no,
          device() == DeviceKind::cuda ? c10::DeviceType::CUDA : c10::DeviceType::CPU,
          precision() == config::MixedPrecision::fp16 ? at::kHalf : at::kBFloat16};
}

AutocastGuard TorchAccelerator::autocast() const { return AutocastGuard(autocast_settings()); }

bool TorchAccelerator::unscale_gradients(double scale, const std::vector<std::size_t>& models) {
  torch::NoGradGuard no_grad;
  std::vector<at::Tensor> grads;
  for (std::size_t m : models)
    for (const at::Tensor& g : prepared_[m]->gradients->for_optimizer(prepared_[m]->slices))
      grads.push_back(g);
  // One flag for all gradients, read once: on a GPU each read is a synchronisation.
  at::Tensor finite = at::ones(
      {}, grads.empty() ? at::TensorOptions(at::kBool) : grads[0].options().dtype(at::kBool));
  for (const at::Tensor& g : grads) finite.logical_and_(at::isfinite(g).all());
  if (!finite.item<bool>()) return false;
  for (const at::Tensor& g : grads) g.mul_(1.0 / scale);
  return true;
}

void TorchAccelerator::discard_gradients(const std::vector<std::size_t>& models) {
  for (std::size_t m : models) prepared_[m]->gradients->discard(prepared_[m]->slices);
}

}  // namespace accel
