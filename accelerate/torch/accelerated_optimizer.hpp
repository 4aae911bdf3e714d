#pragma once
// The LibTorch adapter's optimizer and LR scheduler wrappers (TorchAccelerator::prepare and
// prepare_scheduler make them): the user's objects, stepped the accelerated way.

#include <cstddef>
#include <utility>
#include <vector>

#include <ATen/Tensor.h>
#include <torch/optim/optimizer.h>
#include <torch/optim/schedulers/lr_scheduler.h>
#include <torch/serialize.h>

namespace accel {

// What an AcceleratedOptimizer asks of the accelerator that prepared its model (TorchAccelerator
// is one), by the accelerator's model index.
class OptimizerHost {
 public:
  // Whether the last backward() ended at an accumulation boundary (gradients synchronised);
  // refuses a backward that went around the accelerator (loss.backward() called directly).
  virtual bool ready_to_step() const = 0;
  // Around the user's optimizer step: the gradients checked and reconciled before; after, the
  // parameters as the strategy has them (ZeRO: all-gathered).
  virtual void before_step(std::size_t model) = 0;
  virtual void after_step(std::size_t model) = 0;
  // The model's gradients zeroed, unless they are accumulating.
  virtual void zero_grad(std::size_t model) = 0;
  // Whether the user's optimizer holds this rank's slices (ZeRO) instead of the parameters.
  virtual bool holds_slices(std::size_t model) const = 0;

 protected:
  ~OptimizerHost() = default;
};

// The user's optimizer, stepped only where gradients are synchronised. It is a
// torch::optim::Optimizer itself, so it goes wherever one is expected (a train(...,
// torch::optim::Optimizer&) function, StepLR(optimizer, ...), torch::save(optimizer)):
//  - param_groups() hold the model's parameters (aliases sharing their storage) with the
//    user's options; a learning rate changed there or in the user's own object reaches the
//    other at the next step;
//  - step() is virtual: it steps only at a sync (ZeRO: this rank's slices, then all-gathers);
//  - zero_grad() through a plain Optimizer& is LibTorch's (not virtual), and still right:
//    between accumulation boundaries the aliases carry no gradient, so it zeroes nothing;
//  - torch::save(optimizer) writes the user's optimizer (a plain LibTorch one loads it) under
//    DDP; under ZeRO, where a rank holds only slices, it is refused naming acc.save(optimizer,
//    path), which gathers the full state (TorchAccelerator::save), and save_state.
//    state() is empty here: optimizer().state() is the user's.
class AcceleratedOptimizer : public torch::optim::Optimizer {
 public:
  // A real optimizer step only when the last backward() ended at an accumulation boundary
  // (its gradients are synchronised); between boundaries a no-op. A closure is called first
  // and its loss returned, as LibTorch's optimizers do.
  at::Tensor step(LossClosure closure = nullptr) override;
  // Zeroes the gradients in place (they live in the DDP buckets, so they are never freed).
  // While gradients are accumulating (the last backward() did not end in a sync) it does
  // nothing, so it may be called before the forward or after step() alike. A module's own
  // zero_grad() means the same under every strategy (lent_gradients.hpp under ZeRO-2/3).
  void zero_grad();
  // Accelerate's optimizer.step_was_skipped: whether the last step() did not step. Use it to
  // step an LR scheduler only when the optimizer stepped.
  bool step_was_skipped() const { return step_was_skipped_; }
  // The user's object (under ZeRO its groups hold this rank's slices).
  torch::optim::Optimizer& optimizer() { return optimizer_; }
  const torch::optim::Optimizer& optimizer() const { return optimizer_; }
  void save(torch::serialize::OutputArchive& archive) const override;
  void load(torch::serialize::InputArchive& archive) override;

  // ---- the accelerator's side (prepare makes it)
  // `groups`: the user's param groups' parameters as the model holds them (before ZeRO put
  // slices in their place); `model`: the host's index of the model it steps.
  AcceleratedOptimizer(OptimizerHost& host, std::size_t model, torch::optim::Optimizer& optimizer,
                       const std::vector<std::vector<at::Tensor>>& groups);
  std::size_t model() const { return model_; }
  // (alias in param_groups(), the model's parameter), the groups' parameters in order.
  const std::vector<std::pair<at::Tensor, at::Tensor>>& aliases() const { return aliases_; }
  // The learning rates, both ways: whichever side changed since the last step wins.
  void sync_learning_rates();
  // After the user's optimizer was loaded (torch::load, load_state): its rates are both sides'.
  void adopt_learning_rates();
  // After each backward: the aliases show the parameters' gradients at a boundary, none while
  // accumulating (so LibTorch's zero_grad through an Optimizer& keeps the accumulation).
  void show_gradients(bool at_boundary);

 private:
  OptimizerHost& host_;
  std::size_t model_;  // the accelerator's index of the model it steps
  torch::optim::Optimizer& optimizer_;
  std::vector<std::pair<at::Tensor, at::Tensor>> aliases_;  // (in param_groups(), parameter)
  std::vector<double> synced_lr_;
  bool step_was_skipped_ = false;
};

// The user's LR scheduler, stepped only when its optimizer stepped (Accelerate's
// AcceleratedScheduler): call step() after every optimizer step() as in a plain loop, and
// under gradient accumulation the schedule still counts optimizer steps.
class AcceleratedScheduler {
 public:
  AcceleratedScheduler(AcceleratedOptimizer& optimizer, torch::optim::LRScheduler& scheduler)
      : optimizer_(optimizer), scheduler_(scheduler) {}
  void step();
  torch::optim::LRScheduler& scheduler() { return scheduler_; }

 private:
  AcceleratedOptimizer& optimizer_;
  torch::optim::LRScheduler& scheduler_;
};

}  // namespace accel
