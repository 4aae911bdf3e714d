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

#include "accelerate/torch/tensor_buffer.hpp"
#include "accelerate/torch/torch_optimizer_state.hpp"
#include "accelerate/torch/torch_replicas.hpp"
#include "accelerate/torch/torch_state.hpp"
#include "backends/optim/host_collectives.hpp"
#include "config/config.hpp"
#include "config/config_file.hpp"
#include "core/error.hpp"

namespace accel {
namespace {

// Collectives need one of the communicators' dtypes: others (bool, uint8 ...) travel as int.
at::Tensor communicable(const at::Tensor& t) {
  const at::Tensor c = t.contiguous();
  return to_dtype(c.scalar_type()) ? c : c.to(at::kInt);
}

// A param group's hyperparameters by name, for the check that every rank has the same: all of
// them for the optimizers whose options the checkpoints know, the learning rate for others.
std::vector<std::pair<std::string, double>> group_options(const torch::optim::OptimizerOptions& o) {
  using namespace torch::optim;
  if (const auto* sgd = dynamic_cast<const SGDOptions*>(&o))
    return {{"lr", sgd->lr()},
            {"momentum", sgd->momentum()},
            {"dampening", sgd->dampening()},
            {"weight_decay", sgd->weight_decay()},
            {"nesterov", sgd->nesterov() ? 1.0 : 0.0}};
  const auto adam_like = [](const auto& a) -> std::vector<std::pair<std::string, double>> {
    return {
        {"lr", a.lr()},   {"beta1", std::get<0>(a.betas())},  {"beta2", std::get<1>(a.betas())},
        {"eps", a.eps()}, {"weight_decay", a.weight_decay()}, {"amsgrad", a.amsgrad() ? 1.0 : 0.0}};
  };
  if (const auto* adam = dynamic_cast<const AdamOptions*>(&o)) return adam_like(*adam);
  if (const auto* adamw = dynamic_cast<const AdamWOptions*>(&o)) return adam_like(*adamw);
  try {
    return {{"lr", o.get_lr()}};
  } catch (const std::exception&) {  // an OptimizerOptions of one's own without get_lr
    return {};
  }
}

std::vector<AgreedValue> optimizer_agreement(const torch::optim::Optimizer& optimizer) {
  const auto& groups = optimizer.param_groups();
  std::vector<AgreedValue> v = {{"optimizer param groups", std::to_string(groups.size())}};
  for (std::size_t g = 0; g < groups.size(); ++g) {
    const std::string group = "param group " + std::to_string(g);
    v.push_back({group + " parameters", std::to_string(groups[g].params().size())});
    if (groups[g].has_options())
      for (const auto& [key, value] : group_options(groups[g].options()))
        v.push_back({group + " " + key, exact_text(value)});
  }
  return v;
}

}  // namespace

// Runs after AccumulateGrad has added a micro-batch's gradient into param.grad() (PyTorch's
// DDP reducer hooks the same node): the earliest moment the gradient is final.
class TorchAccelerator::GradReadyHook final : public torch::autograd::FunctionPostHook {
 public:
  GradReadyHook(TorchAccelerator& accelerator, std::size_t index)
      : accelerator_(accelerator), index_(index) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list&) override {
    accelerator_.on_grad_accumulated(index_);
    return outputs;
  }

 private:
  TorchAccelerator& accelerator_;
  std::size_t index_;
};

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

// ---- AcceleratedOptimizer

namespace {
// The user's groups over aliases of the model's parameters (same storage, own TensorImpl, so
// their .grad() is ours to show or hide), with the user's options.
std::vector<torch::optim::OptimizerParamGroup> alias_groups(
    const torch::optim::Optimizer& optimizer, const std::vector<std::vector<at::Tensor>>& groups) {
  std::vector<torch::optim::OptimizerParamGroup> out;
  for (std::size_t g = 0; g < groups.size(); ++g) {
    std::vector<at::Tensor> params;
    for (const at::Tensor& p : groups[g])
      params.push_back(p.detach().requires_grad_(p.requires_grad()));
    out.emplace_back(std::move(params), optimizer.param_groups()[g].options().clone());
  }
  return out;
}
}  // namespace

AcceleratedOptimizer::AcceleratedOptimizer(TorchAccelerator& accelerator,
                                           torch::optim::Optimizer& optimizer,
                                           const std::vector<std::vector<at::Tensor>>& groups)
    : torch::optim::Optimizer(alias_groups(optimizer, groups), optimizer.defaults().clone()),
      accelerator_(accelerator),
      optimizer_(optimizer) {
  for (std::size_t g = 0; g < groups.size(); ++g)
    for (std::size_t k = 0; k < groups[g].size(); ++k)
      aliases_.emplace_back(param_groups()[g].params()[k], groups[g][k]);
  for (const auto& group : param_groups()) synced_lr_.push_back(group.options().get_lr());
  show_gradients(true);
}

at::Tensor AcceleratedOptimizer::step(LossClosure closure) {
  at::Tensor loss;
  if (closure) loss = closure();
  step_was_skipped_ = !accelerator_.sync_gradients_happened();
  accelerator_.check_backward_went_through_accelerator();
  if (step_was_skipped_) return loss;
  accelerator_.check_gradients_unchanged_since_sync();
  sync_learning_rates();
  optimizer_.step();
  accelerator_.strategy().after_optimizer_step();  // ZeRO: all-gather the parameters
  return loss;
}

void AcceleratedOptimizer::zero_grad() {
  if (!accelerator_.accumulating()) accelerator_.zero_gradients();
}

void AcceleratedOptimizer::sync_learning_rates() {
  auto& inner = optimizer_.param_groups();
  for (std::size_t g = 0; g < synced_lr_.size() && g < inner.size(); ++g) {
    auto& ours = param_groups()[g].options();
    auto& theirs = inner[g].options();
    if (ours.get_lr() != synced_lr_[g])
      theirs.set_lr(ours.get_lr());
    else if (theirs.get_lr() != synced_lr_[g])
      ours.set_lr(theirs.get_lr());
    synced_lr_[g] = ours.get_lr();
  }
}

void AcceleratedOptimizer::show_gradients(bool at_boundary) {
  for (auto& [alias, param] : aliases_)
    alias.mutable_grad() = at_boundary ? param.grad() : at::Tensor();
}

void AcceleratedOptimizer::save(torch::serialize::OutputArchive& archive) const {
  if (accelerator_.sharded_optimizer_ != nullptr)
    throw InvalidArgument(
        "torch::save(optimizer) under ZeRO: each rank's optimizer holds only its slices, which "
        "plain LibTorch cannot load. Save with acc.save_state(dir) (it resumes at any number of "
        "processes), and get plain weights with `accel merge-weights`");
  const_cast<AcceleratedOptimizer*>(this)->sync_learning_rates();
  optimizer_.save(archive);
}

void AcceleratedOptimizer::load(torch::serialize::InputArchive& archive) {
  ACCEL_CHECK_ARG(accelerator_.sharded_optimizer_ == nullptr,
                  "torch::load(optimizer) under ZeRO: load with acc.load_state(dir)");
  optimizer_.load(archive);
  for (std::size_t g = 0; g < synced_lr_.size(); ++g) {
    synced_lr_[g] = optimizer_.param_groups()[g].options().get_lr();
    param_groups()[g].options().set_lr(synced_lr_[g]);
  }
}

// ---- AcceleratedScheduler

void AcceleratedScheduler::step() {
  if (!optimizer_.step_was_skipped()) scheduler_.step();
}

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
  // model outlives the accelerator safely.
  for (std::size_t i = 0; i < accumulators_.size(); ++i)
    accumulators_[i]->del_post_hook(hook_keys_[i]);
  for (std::size_t i = 0; i < grad_views_.size(); ++i) {
    at::Tensor& grad = param_tensors_[i].mutable_grad();
    if (grad.defined() && grad_views_[i].defined() && grad.data_ptr() == grad_views_[i].data_ptr())
      grad = grad.clone();
  }
  if (sharded_optimizer_) {
    // The parameters' values and the optimizer's slices live in the strategy's buffers: give
    // each tensor (the same TensorImpl the model and the optimizer hold) its own copy. The
    // optimizer itself may already be gone (declared after the accelerator), so it is not
    // touched: its groups keep the (now self-owned) slices.
    torch::NoGradGuard no_grad;
    for (at::Tensor& p : param_tensors_) p.set_data(p.detach().clone());
    for (at::Tensor& slice : slice_tensors_) {
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

// The steps are prepare_module's helpers below; in order: what the strategy gets, the
// replicas, the strategy, the gradients' storage and hooks, ZeRO's slices, the checkpoints.
AcceleratedOptimizer& TorchAccelerator::prepare_module(torch::nn::Module& module,
                                                       torch::optim::Optimizer& optimizer) {
  return prepare_tensors(module_tensors(module), optimizer);
}

AcceleratedOptimizer& TorchAccelerator::prepare_script(const torch::jit::Module& module,
                                                       torch::optim::Optimizer& optimizer) {
  ACCEL_CHECK_ARG(data_parallel_replicas() == 1,
                  "prepare: DATA_PARALLEL replicates a torch::nn::Module (module->clone()); a "
                  "TorchScript module cannot be cloned into replicas: use MULTI_CPU or ZERO");
  return prepare_tensors(module_tensors(module), optimizer);
}

AcceleratedOptimizer& TorchAccelerator::prepare_tensors(const ModuleTensors& model,
                                                        torch::optim::Optimizer& optimizer) {
  ACCEL_CHECK_ARG(!optimizer_, "prepare: a model was already prepared (one per accelerator)");
  std::vector<ParamRef> refs = collect_parameters(model, optimizer);
  std::vector<Buffer> buffers = collect_buffers(model);
  // On a GPU the loop computes on LibTorch's current stream of the parameters' device: the
  // communicator orders its collectives and the strategies their copies against it. Debian's
  // LibTorch is CPU-only, so this is compiled only against a CUDA-enabled one; without it the
  // compute stream stays the legacy default stream, which is LibTorch's default stream too.
#if ACCEL_TORCH_WITH_CUDA
  if (!param_tensors_.empty() && param_tensors_[0].is_cuda())
    set_cuda_stream(c10::cuda::getCurrentCUDAStream(param_tensors_[0].device().index()).stream());
#endif
  // DATA_PARALLEL's copies (none for one replica)
  if (model.module != nullptr)
    replicas_ = std::make_unique<TorchReplicas>(*model.module, refs.size(),
                                                strategy_options_to_prepare().data_parallel);
  agree_at_prepare(optimizer_agreement(optimizer));
  const std::size_t ungrouped = optimizer.param_groups().size();
  std::vector<std::string> names;
  for (const ParamRef& r : refs) names.push_back(r.group == ungrouped ? r.name : std::string());
  prepare_parameters(std::move(refs), std::move(buffers));  // broadcasts from rank 0
  const bool sharded = strategy().gradients_sharded();
  for (const std::string& name : names)
    ACCEL_CHECK_ARG(!sharded || name.empty(),
                    "prepare: parameter '" + name +
                        "' is in no param group of the optimizer; under ZeRO the optimizer "
                        "owns every trainable parameter's slice");
  hook_gradients();
  // Asked while the param groups still hold the parameters themselves.
  const bool flat_state = torch_optimizer_state::unsupported_reason(optimizer).empty();
  std::vector<std::vector<at::Tensor>> groups;  // as the model holds them, before ZeRO's slices
  for (const auto& group : optimizer.param_groups()) groups.push_back(group.params());
  if (sharded) shard_optimizer(optimizer);
  if (strategy().replicas() != nullptr) replicas_->attach(strategy());
  optimizer_.reset(new AcceleratedOptimizer(*this, optimizer, groups));
  register_checkpoint_states(model, optimizer, flat_state, sharded);
  return *optimizer_;
}

std::vector<ParamRef> TorchAccelerator::collect_parameters(const ModuleTensors& model,
                                                           torch::optim::Optimizer& optimizer) {
  // ZeRO lays out one flat buffer per optimizer param group (and dtype).
  std::unordered_map<const void*, std::size_t> group_of;
  for (std::size_t g = 0; g < optimizer.param_groups().size(); ++g)
    for (const at::Tensor& p : optimizer.param_groups()[g].params())
      group_of.emplace(p.unsafeGetTensorImpl(), g);
  std::vector<ParamRef> refs;
  std::unordered_set<const void*> seen;
  for (const auto& [name, p] : model.trainable) {
    seen.insert(p.unsafeGetTensorImpl());
    const Buffer data = tensor_buffer(p, "parameter '" + name + "'");
    const auto group = group_of.find(p.unsafeGetTensorImpl());
    // Gradients asked of the strategy (backend.hpp's contract): its slots (DDP, ZeRO-1,
    // DataParallel), or autograd's own, lent to it (ZeRO-2).
    // The param group is ZeRO's flat buffer and, under every strategy, the coordinates the
    // optimizer state is saved in; a parameter the optimizer does not hold (DDP only) gets a
    // group of its own, which has no state.
    refs.push_back({name, data, gradient_wanted(data),
                    group != group_of.end() ? group->second : optimizer.param_groups().size(),
                    p.sizes().vec()});
    param_tensors_.push_back(p);
  }
  for (const auto& group : optimizer.param_groups())
    for (const at::Tensor& p : group.params())
      ACCEL_CHECK_ARG(seen.count(p.unsafeGetTensorImpl()),
                      "prepare: the optimizer holds a parameter that is not a trainable "
                      "parameter of the model, so its gradient would never be synchronised");
  return refs;
}

std::vector<Buffer> TorchAccelerator::collect_buffers(const ModuleTensors& model) {
  std::vector<Buffer> buffers;
  for (const auto& [name, tensor] : model.buffers) {
    buffers.push_back(tensor_buffer(tensor, "buffer '" + name + "'"));
    buffer_tensors_.push_back(tensor);
    buffer_data_.push_back(buffers.back().data);
  }
  return buffers;
}

void TorchAccelerator::hook_gradients() {
  const bool has_slots = strategy().gradient_storage() == GradientStorage::slots;
  for (std::size_t i = 0; i < param_tensors_.size(); ++i) {
    if (has_slots) {
      const Buffer slot = strategy().grad_slot(0, i);
      grad_views_.push_back(at::from_blob(slot.data, param_tensors_[i].sizes(),
                                          at::TensorOptions()
                                              .dtype(param_tensors_[i].scalar_type())
                                              .device(param_tensors_[i].device())));
      adopt_bucket_view(i);
    } else {
      grad_views_.emplace_back();  // lent (ZeRO-2): autograd's gradient, freed once released
      param_tensors_[i].mutable_grad() = at::Tensor();
    }
    // The parameter holds its AccumulateGrad node only weakly: without our reference a new
    // node (without the hook) would be made for the next graph.
    std::shared_ptr<torch::autograd::Node> node =
        torch::autograd::impl::grad_accumulator(param_tensors_[i]);
    ACCEL_CHECK_ARG(node != nullptr, "prepare: parameter without a gradient accumulator");
    hook_keys_.push_back(node->add_post_hook(std::make_unique<GradReadyHook>(*this, i)));
    accumulators_.push_back(std::move(node));
  }
}

void TorchAccelerator::register_checkpoint_states(const ModuleTensors& model,
                                                  torch::optim::Optimizer& optimizer,
                                                  bool flat_state, bool sharded) {
  // Checkpoints hold the model as a LibTorch archive (loadable without accelerate-cpp)
  // instead of the Accelerator's raw parameter blob.
  set_checkpoint_parameters(false);
  register_state("model", model.save, model.load);
  if (!flat_state) {
    // The whole LibTorch archive; under ZeRO each rank's own (its slices), so such a
    // checkpoint resumes with the same number of processes only.
    register_state(
        "optimizer", [&optimizer] { return torch_state::save_optimizer(optimizer); },
        [&optimizer](const std::string& bytes) { torch_state::load_optimizer(optimizer, bytes); },
        sharded ? StateScope::per_rank : StateScope::shared);
    return;
  }
  // The param groups' options (learning rates ...) from rank 0 as a LibTorch archive; the
  // per-parameter state in flat coordinates, as the built-in optimizers' ("optimizer" under
  // DDP, "optimizer.rankR" under ZeRO), so any strategy and number of processes resumes.
  register_state(
      "optimizer", [&optimizer] { return torch_state::save_optimizer_options(optimizer); },
      [&optimizer](const std::string& bytes) {
        torch_state::load_optimizer_options(optimizer, bytes);
      });
  register_optimizer_state(
      [this, &optimizer] {
        return torch_optimizer_state::save(optimizer, strategy().segments(), optimizer_tensors());
      },
      [this, &optimizer](const std::string& bytes, const std::string& where) {
        return torch_optimizer_state::load(optimizer, strategy().segments(), optimizer_tensors(),
                                           bytes, where);
      });
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

std::vector<at::Tensor> TorchAccelerator::optimizer_tensors() {
  if (sharded_optimizer_) return slice_tensors_;  // ZeRO: one slice per segment, in order
  // DDP: the segments are the parameters (by group); the optimizer holds those of its groups.
  const std::size_t groups = optimizer_->optimizer().param_groups().size();
  std::unordered_map<const void*, const at::Tensor*> by_data;
  for (const at::Tensor& p : param_tensors_) by_data.emplace(p.data_ptr(), &p);
  std::vector<at::Tensor> out;
  for (const ParamSegment& s : strategy().segments()) {
    const auto it = by_data.find(s.values.data);
    out.push_back(s.group < groups && it != by_data.end() ? *it->second : at::Tensor());
  }
  return out;
}

AcceleratedScheduler& TorchAccelerator::prepare_scheduler(torch::optim::LRScheduler& scheduler) {
  ACCEL_CHECK_ARG(optimizer_ != nullptr,
                  "prepare_scheduler: prepare the model and optimizer first");
  ACCEL_CHECK_ARG(!scheduler_, "prepare_scheduler: a scheduler was already prepared");
  scheduler_.reset(new AcceleratedScheduler(*optimizer_, scheduler));
  register_state(
      "scheduler", [&scheduler] { return torch_state::save_scheduler(scheduler); },
      [&scheduler](const std::string& bytes) { torch_state::load_scheduler(scheduler, bytes); });
  return *scheduler_;
}

void TorchAccelerator::shard_optimizer(torch::optim::Optimizer& optimizer) {
  Strategy& z = strategy();
  torch::NoGradGuard no_grad;
  // The parameters become views of the flat buffers (which hold their values since prepare),
  // so the all-gather after each step updates the model in place.
  if (z.has_param_slots()) {
    for (std::size_t i = 0; i < param_tensors_.size(); ++i) {
      const Buffer view = z.param_slot(i);
      param_tensors_[i].set_data(
          at::from_blob(view.data, param_tensors_[i].sizes(), param_tensors_[i].options()));
    }
    z.use_param_slots();
  }
  sharded_optimizer_ = &optimizer;
  auto& groups = optimizer.param_groups();
  for (auto& group : groups) group.params().clear();
  // One tensor per flat buffer: this rank's slice, its .grad() the reduced gradient slice,
  // with the options of a parameter of its group and dtype.
  for (const ParamSegment& segment : z.segments()) {
    const auto options = segment_options(segment);
    const auto n = std::int64_t(segment.values.count);
    at::Tensor slice = at::from_blob(segment.values.data, {n}, options);
    slice.mutable_grad() = at::from_blob(segment.grad.data, {n}, options);
    groups[segment.group].params().push_back(slice);
    slice_tensors_.push_back(slice);
  }
}

at::TensorOptions TorchAccelerator::segment_options(const ParamSegment& segment) {
  const std::vector<ParamRef>& refs = strategy().params();
  for (std::size_t i = 0; i < refs.size(); ++i)
    if (refs[i].group == segment.group && refs[i].data.dtype == segment.values.dtype)
      return param_tensors_[i].options();
  throw InvalidArgument("prepare: no parameter of param group " + std::to_string(segment.group) +
                        " for the strategy's segment");
}

void TorchAccelerator::free_released_grads() {
  for (std::size_t i : strategy().take_released()) param_tensors_[i].mutable_grad() = at::Tensor();
}

void TorchAccelerator::adopt_bucket_view(std::size_t i) {
  at::Tensor& grad = param_tensors_[i].mutable_grad();
  const at::Tensor& view = grad_views_[i];
  if (!view.defined()) {  // lent (ZeRO-2): the strategy reads autograd's gradient where it is
    if (grad.defined())
      strategy().lend_grad(i,
                           tensor_buffer(grad, "the gradient of parameter " + std::to_string(i)));
    return;
  }
  if (grad.defined() && grad.data_ptr() == view.data_ptr()) return;
  if (grad.defined())
    view.copy_(grad);
  else
    view.zero_();
  grad = view;
}

void TorchAccelerator::on_grad_accumulated(std::size_t i) {
  // Autograd adds into an existing gradient in place; it only replaces the tensor under
  // create_graph or when the user reset the gradient. Then the new values move into the slot.
  if (!in_backward_) backward_outside_ = true;  // loss.backward() called directly
  adopt_bucket_view(i);
  grad_ready(i);
  free_released_grads();  // lent: what the strategy has copied into its buckets
}

void TorchAccelerator::check_backward_went_through_accelerator() const {
  if (!backward_outside_) return;
  throw InvalidArgument(
      "optimizer step: a backward ran through the prepared model without the accelerator "
      "(loss.backward() called directly), so its gradients were never synchronised and this "
      "step would silently do nothing. Call acc.backward(loss) instead of loss.backward()");
}

void TorchAccelerator::zero_gradients() {
  for (std::size_t i = 0; i < param_tensors_.size(); ++i) {
    if (!grad_views_[i].defined()) {  // lent (ZeRO-2): gradients are freed, as set_to_none
      param_tensors_[i].mutable_grad() = at::Tensor();
      continue;
    }
    at::Tensor& grad = param_tensors_[i].mutable_grad();
    if (!grad.defined() || grad.data_ptr() != grad_views_[i].data_ptr()) grad = grad_views_[i];
    grad_views_[i].zero_();
  }
  if (strategy().gradient_storage() == GradientStorage::lent) strategy().withdraw_grads();
  if (replicas_ != nullptr) replicas_->zero_grads();  // DataParallel's replicas
}

void TorchAccelerator::sync_buffers() {
  if (buffer_tensors_.empty()) return;
  for (std::size_t i = 0; i < buffer_tensors_.size(); ++i)
    ACCEL_CHECK_ARG(buffer_tensors_[i].data_ptr() == buffer_data_[i],
                    "a module buffer was replaced after prepare; update buffers in place");
  strategy().sync_buffers();
}

bool TorchAccelerator::backward(const torch::Tensor& loss) {
  ACCEL_CHECK_ARG(optimizer_ != nullptr, "backward: prepare the model first");
  sync_buffers();
  ReplicaSet* dp = strategy().replicas();
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
  if (dp != nullptr) {
    const ScopedFlag in_backward(in_backward_);
    replicas_->backward(*dp);
  }
  synced_ = sync_gradients();
  probe_at_sync_ = synced_ && !slice_tensors_.empty() ? gradient_probe() : at::Tensor();
  free_released_grads();
  accumulating_ = !synced_ && !optimizer_step_was_skipped();
  optimizer_->show_gradients(!accumulating_);
  return synced_;
}

at::Tensor TorchAccelerator::gradient_probe() const {
  // The first few elements of every gradient: clipping or scaling changes every non-zero one.
  constexpr std::int64_t kProbed = 4;
  std::vector<at::Tensor> heads;
  for (const at::Tensor& view : grad_views_)
    if (view.defined() && view.numel() > 0)
      heads.push_back(
          view.reshape(-1).narrow(0, 0, std::min(kProbed, view.numel())).to(at::kDouble));
  return heads.empty() ? at::Tensor() : at::cat(heads).cpu();
}

void TorchAccelerator::check_gradients_unchanged_since_sync() const {
  // ZeRO-1: the parameters' .grad() are this rank's local gradients (what it accumulated);
  // the optimizer steps the reduced slices, so changing .grad() after the sync (LibTorch's
  // clip_grad_norm_, a manual scaling) would silently not reach the step.
  if (!probe_at_sync_.defined() || at::equal(probe_at_sync_, gradient_probe())) return;
  throw InvalidArgument(
      "optimizer step: the prepared parameters' gradients were changed after backward() "
      "synchronised them (torch::nn::utils::clip_grad_norm_, or an in-place change of "
      ".grad()). Under ZeRO the optimizer steps this rank's reduced gradient slices, which such a "
      "change does not reach: clip with acc.clip_grad_norm(max_norm), which is correct under "
      "every strategy");
}

void TorchAccelerator::write_file_atomically(const std::string& path, const std::string& bytes) {
  config::write_file_atomically(path, bytes);
}

std::vector<std::pair<std::string, at::Tensor>> TorchAccelerator::state_dict_of(
    const torch::nn::Module& module) {
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
  const at::Tensor local = communicable(t.dim() == 0 ? t.reshape({1}) : t);
  std::vector<std::int64_t> shape = local.sizes().vec();
  shape[0] *= num_processes();
  at::Tensor out = at::empty(shape, local.options());
  comm().all_gather(tensor_buffer(local, "gather"), tensor_buffer(out, "gather"))->wait();
  return out.to(t.scalar_type());
}

torch::Tensor TorchAccelerator::gather_for_metrics(const torch::Tensor& t, const DataLoader& loader,
                                                   std::size_t batch_index) {
  at::Tensor all = gather(t);
  const auto padding = std::int64_t(loader.sampler().padding());
  if (batch_index + 1 == loader.size() && padding <= all.size(0))
    all = all.narrow(0, 0, all.size(0) - padding);
  return all;
}

torch::Tensor TorchAccelerator::reduce(const torch::Tensor& t, ReduceOp op) {
  at::Tensor out = communicable(t).clone();
  comm().all_reduce(tensor_buffer(out, "reduce"), op)->wait();
  return out.to(t.scalar_type());
}

void TorchAccelerator::broadcast(torch::Tensor& t, int root) {
  ACCEL_CHECK_ARG(t.is_contiguous(), "broadcast: the tensor must be contiguous");
  if (to_dtype(t.scalar_type())) {
    comm().broadcast(tensor_buffer(t, "broadcast"), root)->wait();
    return;
  }
  at::Tensor staged = communicable(t);
  comm().broadcast(tensor_buffer(staged, "broadcast"), root)->wait();
  t.copy_(staged);
}

torch::Tensor TorchAccelerator::pad_across_processes(const torch::Tensor& t, double value) {
  ACCEL_CHECK_ARG(t.dim() >= 1, "pad_across_processes: the tensor needs a dimension 0");
  std::int64_t longest = t.size(0);
  all_reduce_values(comm(), buffer_of(std::span(&longest, 1)), ReduceOp::max);  // NCCL too
  if (longest == t.size(0)) return t;
  std::vector<std::int64_t> shape = t.sizes().vec();
  shape[0] = longest - t.size(0);
  return at::cat({t, at::full(shape, value, t.options())}, 0);
}

AutocastGuard TorchAccelerator::autocast() const {
  const bool cuda = device() == DeviceKind::cuda;
  return AutocastGuard(precision() != config::MixedPrecision::no,
                       cuda ? c10::DeviceType::CUDA : c10::DeviceType::CPU,
                       precision() == config::MixedPrecision::fp16 ? at::kHalf : at::kBFloat16);
}

std::vector<at::Tensor> TorchAccelerator::optimizer_gradients() const {
  if (slice_tensors_.empty()) return grad_views_;  // DDP: the full gradients
  std::vector<at::Tensor> out;                     // ZeRO: this rank's reduced slices
  for (const at::Tensor& slice : slice_tensors_) out.push_back(slice.grad());
  return out;
}

bool TorchAccelerator::unscale_gradients(double scale) {
  torch::NoGradGuard no_grad;
  const std::vector<at::Tensor> grads = optimizer_gradients();
  // One flag for all gradients, read once: on a GPU each read is a synchronisation.
  at::Tensor finite = at::ones(
      {}, grads.empty() ? at::TensorOptions(at::kBool) : grads[0].options().dtype(at::kBool));
  for (const at::Tensor& g : grads) finite.logical_and_(at::isfinite(g).all());
  if (!finite.item<bool>()) return false;
  for (const at::Tensor& g : grads) g.mul_(1.0 / scale);
  return true;
}

void TorchAccelerator::discard_gradients() {
  torch::NoGradGuard no_grad;
  for (const at::Tensor& g : optimizer_gradients()) g.zero_();
  for (const at::Tensor& g : grad_views_)  // ZeRO-1's full slots (ZeRO-2 released its own)
    if (g.defined()) g.zero_();
}

}  // namespace accel
