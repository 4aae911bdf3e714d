#include "accelerate/torch/activation_checkpoint.hpp"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/autocast_mode.h>
#include <torch/torch.h>

#include <mutex>

#include "accelerate/torch/autocast.hpp"
#include "foundation/error.hpp"

namespace accel {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

at::Tensor cpu_rng_state() {
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get_state();
}

void set_cpu_rng_state(const at::Tensor& state) {
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(state);
}

// What the forward ran with, for the recompute: the block, the random state, CPU autocast.
struct Recompute : torch::CustomClassHolder {
  CheckpointedFn fn;
  at::Tensor rng_state;
  bool autocast = false;
  at::ScalarType autocast_dtype = at::kBFloat16;
};

class CheckpointFunction : public torch::autograd::Function<CheckpointFunction> {
 public:
  // inputs[0] is the anchor (requires grad, no data); the block sees the others.
  // A TensorList, not a vector: autograd counts only those as inputs of the node.
  static variable_list forward(AutogradContext* ctx, c10::intrusive_ptr<Recompute> recompute,
                               at::TensorList inputs) {
    recompute->rng_state = cpu_rng_state();
    recompute->autocast = at::autocast::is_cpu_enabled();
    recompute->autocast_dtype = at::autocast::get_autocast_cpu_dtype();
    const std::vector<at::Tensor> block_inputs(inputs.begin() + 1, inputs.end());
    at::Tensor out = recompute->fn(block_inputs);  // grad mode is off inside forward
    ACCEL_CHECK_ARG(out.defined(), "checkpoint: the block returned no tensor");
    ctx->save_for_backward(block_inputs);
    ctx->saved_data["recompute"] = at::IValue::make_capsule(std::move(recompute));
    return {out};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    auto recompute =
        c10::static_intrusive_pointer_cast<Recompute>(ctx->saved_data["recompute"].toCapsule());
    std::vector<at::Tensor> inputs;
    for (const at::Tensor& saved : ctx->get_saved_variables()) {
      at::Tensor input = saved.detach();
      input.requires_grad_(saved.requires_grad());
      inputs.push_back(std::move(input));
    }
    at::Tensor out;
    {
      const at::Tensor now = cpu_rng_state();
      set_cpu_rng_state(recompute->rng_state);
      torch::AutoGradMode grad(true);
      CpuAutocastAs autocast(recompute->autocast, recompute->autocast_dtype);
      out = recompute->fn(inputs);
      set_cpu_rng_state(now);
    }
    if (out.requires_grad()) torch::autograd::backward({out}, {grad_outputs[0]});
    variable_list grads = {at::Tensor(), at::Tensor()};  // the recompute holder, the anchor
    for (const at::Tensor& input : inputs)
      grads.push_back(input.requires_grad() ? input.grad() : at::Tensor());
    return grads;
  }
};

}  // namespace

torch::Tensor checkpoint_function(CheckpointedFn fn, std::vector<torch::Tensor> inputs) {
  ACCEL_CHECK_ARG(fn != nullptr, "checkpoint: no block given");
  auto recompute = c10::make_intrusive<Recompute>();
  recompute->fn = std::move(fn);
  // Without grad mode there is no graph to checkpoint: just run the block.
  if (!torch::GradMode::is_enabled()) return recompute->fn(inputs);
  variable_list with_anchor;
  with_anchor.push_back(torch::empty({0}, torch::requires_grad()));
  for (auto& t : inputs) with_anchor.push_back(std::move(t));
  return CheckpointFunction::apply(std::move(recompute), at::TensorList(with_anchor))[0];
}

}  // namespace accel
