#pragma once
// A prepared model's gradients where its strategy keeps them (backend.hpp's GradientStorage):
// each parameter's .grad() aliasing its bucket slot (DDP, ZeRO-1, DataParallel; PyTorch DDP's
// gradient_as_bucket_view), or autograd's own, lent to the strategy and released at the
// boundary (ZeRO-2/3: LentGradients). Private to the adapter: TorchAccelerator holds one per
// prepared model and calls it from the gradient hooks, backward() and the optimizer's step.

#include <cstddef>
#include <memory>
#include <vector>

#include <ATen/Tensor.h>

#include "accelerate/torch/detail/lent_gradients.hpp"
#include "backends/backend.hpp"

namespace torch::autograd {
struct Node;
}

namespace accel {

class ModelGradients {
 public:
  // `params` (strategy order) and `accumulators` (their AccumulateGrad nodes) outlive it.
  ModelGradients(Strategy& strategy, std::vector<at::Tensor>& params,
                 const std::vector<std::shared_ptr<torch::autograd::Node>>& accumulators);

  // Autograd accumulated parameter i's gradient: make sure it is (still) the bucket slot (its
  // values moved in when the loop had replaced it), or hand a lent one to the strategy.
  void accumulated(std::size_t i);
  // What the loop did to .grad() since the last backward (a module's zero_grad(), set_to_none
  // or not, or an assignment) reaches the strategy before the next backward adds to it.
  void reconcile();
  // Lent: those the strategy copied into its buckets become stand-ins (LentGradients).
  void free_released();
  // The optimizer's zero_grad: slots zeroed in place, lent gradients freed (as set_to_none).
  void zero();
  // At a sync under ZeRO-1 a few elements of every slot are kept, so the step can refuse
  // gradients changed after it (a LibTorch clip_grad_norm_ that never reaches the reduced
  // slices). A change that left the probed elements as they were goes unseen.
  void remember_at_sync(bool probe);
  // Before the optimizer steps: that check, and a gradient the loop reset after backward
  // stepped as it is now.
  void before_step();
  // What the optimizer steps on: the full gradients (DDP), this rank's reduced `slices` (ZeRO).
  std::vector<at::Tensor> for_optimizer(const std::vector<at::Tensor>& slices) const;
  // An fp16 step skipped: every gradient zeroed (ZeRO-1's full slots too).
  void discard(const std::vector<at::Tensor>& slices);
  // The accelerator goes: gradients that alias its buckets become copies of their own.
  void leave_model();

 private:
  at::Tensor probe() const;

  Strategy& strategy_;
  std::vector<at::Tensor>& params_;
  std::vector<at::Tensor> views_;        // params_[i]'s bucket slot (undefined: lent)
  std::unique_ptr<LentGradients> lent_;  // null under slots
  at::Tensor probe_at_sync_;             // ZeRO-1: probe() at the last sync
};

}  // namespace accel
