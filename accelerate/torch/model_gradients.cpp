#include "accelerate/torch/detail/model_gradients.hpp"

#include <algorithm>
#include <cstdint>

#include <ATen/Functions.h>
#include <torch/utils.h>

#include "foundation/error.hpp"

namespace accel {

ModelGradients::ModelGradients(
    Strategy& strategy, std::vector<at::Tensor>& params,
    const std::vector<std::shared_ptr<torch::autograd::Node>>& accumulators)
    : strategy_(strategy), params_(params) {
  if (strategy.gradient_storage() != GradientStorage::slots) {
    views_.resize(params.size());  // lent (ZeRO-2/3): autograd's own
    lent_ = std::make_unique<LentGradients>(params, accumulators);
    return;
  }
  for (std::size_t i = 0; i < params.size(); ++i) {
    const at::Tensor& param = params[i];
    const Buffer slot = strategy.grad_slot(0, i);
    views_.push_back(
        at::from_blob(slot.data, param.sizes(),
                      at::TensorOptions().dtype(param.scalar_type()).device(param.device())));
    accumulated(i);  // .grad() becomes the slot, keeping the values it had
  }
}

void ModelGradients::accumulated(std::size_t i) {
  // Autograd adds into an existing gradient in place; it only replaces the tensor under
  // create_graph or when the user reset the gradient. Then the new values move into the slot.
  if (lent_) return lent_->accumulated(i, strategy_);
  at::Tensor& grad = params_[i].mutable_grad();
  const at::Tensor& view = views_[i];
  if (grad.defined() && grad.data_ptr() == view.data_ptr()) return;
  if (grad.defined())
    view.copy_(grad);
  else
    view.zero_();
  grad = view;
}

void ModelGradients::reconcile() {
  if (lent_) return lent_->reconcile(strategy_);
  for (std::size_t i = 0; i < params_.size(); ++i) accumulated(i);
}

void ModelGradients::free_released() {
  if (!lent_) return;
  for (std::size_t i : strategy_.take_released()) lent_->released(i);
}

void ModelGradients::zero() {
  if (lent_) {
    strategy_.withdraw_grads();
    lent_->withdrawn_all();
    return;
  }
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const at::Tensor& view = views_[i];
    at::Tensor& grad = params_[i].mutable_grad();
    if (!grad.defined() || grad.data_ptr() != view.data_ptr()) grad = view;
    view.zero_();
  }
}

at::Tensor ModelGradients::probe() const {
  // The first few elements of every gradient: clipping or scaling changes every non-zero one.
  constexpr std::int64_t kProbed = 4;
  std::vector<at::Tensor> heads;
  for (const at::Tensor& view : views_)
    if (view.defined() && view.numel() > 0)
      heads.push_back(
          view.reshape(-1).narrow(0, 0, std::min(kProbed, view.numel())).to(at::kDouble));
  return heads.empty() ? at::Tensor() : at::cat(heads).cpu();
}

void ModelGradients::remember_at_sync(bool probe_now) {
  probe_at_sync_ = probe_now ? probe() : at::Tensor();
}

void ModelGradients::before_step() {
  // ZeRO-1: the parameters' .grad() are this rank's local gradients (what it accumulated);
  // the optimizer steps the reduced slices, so changing .grad() after the sync (LibTorch's
  // clip_grad_norm_, a manual scaling) would silently not reach the step.
  if (probe_at_sync_.defined() && !at::equal(probe_at_sync_, probe()))
    throw InvalidArgument(
        "optimizer step: the prepared parameters' gradients were changed after backward() "
        "synchronised them (torch::nn::utils::clip_grad_norm_, or an in-place change of "
        ".grad()). Under ZeRO the optimizer steps this rank's reduced gradient slices, which such "
        "a change does not reach: clip with acc.clip_grad_norm(max_norm), which is correct under "
        "every strategy");
  if (lent_) lent_->reconcile(strategy_);
}

std::vector<at::Tensor> ModelGradients::for_optimizer(const std::vector<at::Tensor>& slices) const {
  if (slices.empty()) return views_;  // DDP: the full gradients
  std::vector<at::Tensor> out;        // ZeRO: this rank's reduced slices
  for (const at::Tensor& slice : slices) out.push_back(slice.grad());
  return out;
}

void ModelGradients::discard(const std::vector<at::Tensor>& slices) {
  torch::NoGradGuard no_grad;
  for (const at::Tensor& g : for_optimizer(slices)) g.zero_();
  for (const at::Tensor& g : views_)  // ZeRO-1's full slots
    if (g.defined()) g.zero_();
}

void ModelGradients::leave_model() {
  for (std::size_t i = 0; i < views_.size(); ++i) {
    at::Tensor& grad = params_[i].mutable_grad();
    const at::Tensor& view = views_[i];
    if (grad.defined() && view.defined() && grad.data_ptr() == view.data_ptr()) grad = grad.clone();
  }
}

}  // namespace accel
