#include "accelerate/torch/accelerated_optimizer.hpp"

#include "accelerate/torch/prepared_tensors.hpp"
#include "accelerate/torch/torch_accelerator.hpp"
#include "core/error.hpp"

namespace accel {

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

AcceleratedOptimizer::AcceleratedOptimizer(TorchAccelerator& accelerator, std::size_t model,
                                           torch::optim::Optimizer& optimizer,
                                           const std::vector<std::vector<at::Tensor>>& groups)
    : torch::optim::Optimizer(alias_groups(optimizer, groups), optimizer.defaults().clone()),
      accelerator_(accelerator),
      model_(model),
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
  PreparedTensors& model = *accelerator_.prepared_[model_];
  accelerator_.check_gradients_unchanged_since_sync(model);
  // A gradient the loop reset after backward (a module's zero_grad()) is stepped as it is now.
  if (model.lent) model.lent->reconcile(accelerator_.strategy(model_));
  show_gradients(true);
  sync_learning_rates();
  optimizer_.step();
  accelerator_.strategy(model_).after_optimizer_step();      // ZeRO: all-gather the parameters
  accelerator_.settle_all(*accelerator_.prepared_[model_]);  // ZeRO-3: nothing gathered now
  return loss;
}

void AcceleratedOptimizer::zero_grad() {
  if (!accelerator_.accumulating()) accelerator_.zero_gradients(*accelerator_.prepared_[model_]);
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
  if (accelerator_.prepared_[model_]->sharded_optimizer != nullptr)
    throw InvalidArgument(
        "torch::save(optimizer) under ZeRO: each rank's optimizer holds only its slices, which "
        "plain LibTorch cannot load. Save with acc.save(optimizer, path), called on every rank "
        "(it gathers the full state to the main process and writes what a plain LibTorch "
        "optimizer loads), or acc.save_state(dir) (it resumes at any number of processes)");
  const_cast<AcceleratedOptimizer*>(this)->sync_learning_rates();
  optimizer_.save(archive);
}

void AcceleratedOptimizer::load(torch::serialize::InputArchive& archive) {
  ACCEL_CHECK_ARG(accelerator_.prepared_[model_]->sharded_optimizer == nullptr,
                  "torch::load(optimizer) under ZeRO: load with acc.load_state(dir)");
  optimizer_.load(archive);
  adopt_learning_rates();
}

void AcceleratedOptimizer::adopt_learning_rates() {
  for (std::size_t g = 0; g < synced_lr_.size(); ++g) {
    synced_lr_[g] = optimizer_.param_groups()[g].options().get_lr();
    param_groups()[g].options().set_lr(synced_lr_[g]);
  }
}

// ---- AcceleratedScheduler

void AcceleratedScheduler::step() {
  if (!optimizer_.step_was_skipped()) scheduler_.step();
}

}  // namespace accel
