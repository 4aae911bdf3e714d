#pragma once
// Gradients lent to the strategy (ZeRO-2 and 3: backend.hpp's "lent") as LibTorch shows them,
// so that whatever the loop does to a parameter's .grad() means what it means in plain
// LibTorch. Once the strategy has reduced a gradient into its shards (released it), .grad() is
// a stand-in: zeros of the parameter's shape over one element of memory. A module's
// zero_grad() visibly resets it (set_to_none: undefined; otherwise detached and zeroed), as
// do an optimizer's over the same tensors (zeroed in place) and an assignment; a gradient the
// strategy has not reduced yet (accumulating without a sync) is autograd's own, watched by its
// version. reconcile() hands every reset to the strategy (withdraw_grad: what the parameter
// contributed so far is forgotten). Private to the LibTorch adapter; one per prepared model under a
// lent strategy.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include <ATen/Tensor.h>

namespace torch::autograd {
struct Node;
struct FunctionPreHook;
}  // namespace torch::autograd

namespace accel {

class Strategy;

class LentGradients {
 public:
  // `params` and `accumulators` index for index (the prepared model's, which outlive this);
  // each accumulator gets a hook that clears the stand-in before autograd accumulates.
  LentGradients(std::vector<at::Tensor>& params,
                const std::vector<std::shared_ptr<torch::autograd::Node>>& accumulators);
  LentGradients(const LentGradients&) = delete;
  LentGradients& operator=(const LentGradients&) = delete;
  // Removes the hooks and the stand-ins: the model stays usable without the accelerator.
  ~LentGradients();

  // Autograd accumulated parameter i's gradient: lend it to the strategy.
  void accumulated(std::size_t i, Strategy& strategy);
  // The strategy released parameter i's gradient: show the stand-in.
  void released(std::size_t i);
  // The loop's resets since the last call reach the strategy (before each backward and step).
  void reconcile(Strategy& strategy);
  // The strategy withdrew them all (the prepared optimizer's zero_grad): every .grad() undefined.
  void withdrawn_all();

 private:
  class MakeWay;
  struct Shown {  // what .grad() should be if the loop left it alone (undefined: nothing)
    at::Tensor grad;
    std::int64_t version = 0;
  };
  bool left_alone(std::size_t i) const;
  bool is_standin(const at::Tensor& grad, std::size_t i) const;
  void show(std::size_t i, const at::Tensor& grad);
  void make_way(std::size_t i);  // before autograd accumulates into parameter i

  std::vector<at::Tensor>& params_;
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators_;
  std::vector<torch::autograd::FunctionPreHook*> hooks_;  // owned by the accumulators
  std::vector<at::Tensor> standins_;                      // made on first use
  std::vector<Shown> shown_;
};

}  // namespace accel
