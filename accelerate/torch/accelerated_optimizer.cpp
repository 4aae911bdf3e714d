#include "accelerate/torch/accelerated_optimizer.hpp"

#include "foundation/error.hpp"

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

AcceleratedOptimizer::AcceleratedOptimizer(OptimizerHost& host, std::size_t model,
                                           torch::optim::Optimizer& optimizer,
                                           const std::vector<std::vector<at::Tensor>>& groups)
    : torch::optim::Optimizer(alias_groups(optimizer, groups), optimizer.defaults().clone()),
      host_(host),
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
  step_was_skipped_ = !host_.ready_to_step();
  if (step_was_skipped_) return loss;
  host_.before_step(model_);
  show_gradients(true);
  sync_learning_rates();
  optimizer_.step();
  host_.after_step(model_);
  return loss;
}

void AcceleratedOptimizer::zero_grad() { host_.zero_grad(model_); }

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
  if (host_.holds_slices(model_))
    throw InvalidArgument(
        "torch::save(optimizer) under ZeRO: each rank's optimizer holds only its slices, which "
        "plain LibTorch cannot load. Save with acc.save(optimizer, path), called on every rank "
        "(it gathers the full state to the main process and writes what a plain LibTorch "
        "optimizer loads), or acc.save_state(dir) (it resumes at any number of processes)");
  const_cast<AcceleratedOptimizer*>(this)->sync_learning_rates();
  optimizer_.save(archive);
}

void AcceleratedOptimizer::load(torch::serialize::InputArchive& archive) {
  ACCEL_CHECK_ARG(!host_.holds_slices(model_),
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
