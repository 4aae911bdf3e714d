#include "accelerate/torch/detail/lent_gradients.hpp"

#include <algorithm>
#include <string>
#include <vector>

#include <ATen/Functions.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>

#include "accelerate/torch/detail/tensor_buffer.hpp"
#include "backends/backend.hpp"

namespace accel {

// Autograd adds into a defined .grad() in place, which a stand-in (one element for all) cannot
// take: before it accumulates, the stand-in gives way to nothing, so autograd makes a gradient.
class LentGradients::MakeWay final : public torch::autograd::FunctionPreHook {
 public:
  MakeWay(LentGradients& owner, std::size_t index) : owner_(owner), index_(index) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& grads) override {
    owner_.make_way(index_);
    return grads;
  }

 private:
  LentGradients& owner_;
  std::size_t index_;
};

LentGradients::LentGradients(
    std::vector<at::Tensor>& params,
    const std::vector<std::shared_ptr<torch::autograd::Node>>& accumulators)
    : params_(params),
      accumulators_(accumulators),
      standins_(params.size()),
      shown_(params.size()) {
  for (std::size_t i = 0; i < accumulators_.size(); ++i) {
    auto hook = std::make_unique<MakeWay>(*this, i);
    hooks_.push_back(hook.get());
    accumulators_[i]->add_pre_hook(std::move(hook));
  }
  for (std::size_t i = 0; i < params_.size(); ++i) show(i, at::Tensor());
}

LentGradients::~LentGradients() {
  for (std::size_t i = 0; i < accumulators_.size(); ++i) {
    auto& hooks = accumulators_[i]->pre_hooks();  // LibTorch 1.13 has no del_pre_hook
    std::erase_if(hooks, [&](const auto& h) { return h.get() == hooks_[i]; });
  }
  for (std::size_t i = 0; i < params_.size(); ++i)
    if (is_standin(params_[i].grad(), i)) params_[i].mutable_grad() = at::Tensor();
}

void LentGradients::accumulated(std::size_t i, Strategy& strategy) {
  const at::Tensor grad = params_[i].grad();
  if (!grad.defined()) return;
  strategy.lend_grad(i, tensor_buffer(grad, "the gradient of parameter " + std::to_string(i)));
  show(i, grad);
}

void LentGradients::released(std::size_t i) {
  if (!standins_[i].defined()) {
    // Every element at one zero (stride 0), and not an autograd view (as expand() would be),
    // so LibTorch's Optimizer::zero_grad() may detach_() it in place.
    const at::Tensor& p = params_[i];
    const at::Tensor zero =
        at::zeros({}, at::TensorOptions().dtype(p.scalar_type()).device(p.device()));
    standins_[i] = at::from_blob(
        zero.data_ptr(), p.sizes(), std::vector<std::int64_t>(std::size_t(p.dim()), 0),
        [zero](void*) {}, zero.options());
  }
  show(i, standins_[i]);
}

void LentGradients::reconcile(Strategy& strategy) {
  for (std::size_t i = 0; i < params_.size(); ++i) {
    if (left_alone(i)) continue;
    strategy.withdraw_grad(i);
    const at::Tensor grad = params_[i].grad();
    if (!grad.defined())
      show(i, grad);  // set_to_none
    else if (is_standin(grad, i))
      show(i, standins_[i]);  // zeroed in place: zeros again
    else
      accumulated(i, strategy);  // the loop's own tensor: what it holds is the gradient
  }
}

void LentGradients::withdrawn_all() {
  for (std::size_t i = 0; i < params_.size(); ++i) show(i, at::Tensor());
}

bool LentGradients::left_alone(std::size_t i) const {
  const Shown& shown = shown_[i];
  const at::Tensor& grad = params_[i].grad();
  if (!shown.grad.defined()) return !grad.defined();
  // A module's zero_grad() assigns a detached alias (another TensorImpl); an optimizer's
  // zeroes in place (the version moves); anything else is another tensor.
  return grad.defined() && grad.unsafeGetTensorImpl() == shown.grad.unsafeGetTensorImpl() &&
         grad._version() == shown.version;
}

bool LentGradients::is_standin(const at::Tensor& grad, std::size_t i) const {
  return grad.defined() && standins_[i].defined() && grad.data_ptr() == standins_[i].data_ptr();
}

void LentGradients::show(std::size_t i, const at::Tensor& grad) {
  params_[i].mutable_grad() = grad;
  shown_[i] = {grad, grad.defined() ? grad._version() : 0};
}

void LentGradients::make_way(std::size_t i) {
  if (is_standin(params_[i].grad(), i)) show(i, at::Tensor());
}

}  // namespace accel
