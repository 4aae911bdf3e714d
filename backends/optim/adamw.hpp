#pragma once
// AdamW as PyTorch's torch.optim.AdamW (decoupled weight decay: p *= 1 - lr * wd), and Adam
// (decoupled_weight_decay = false: the decay is added to the gradient, torch.optim.Adam):
// bias-corrected first and second moments, eps added after the square root.

#include "backends/optim/optimizer.hpp"

namespace accel {

struct AdamWOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 1e-2;
  bool decoupled_weight_decay = true;  // false: Adam's L2 penalty
};

class AdamW final : public Optimizer {
 public:
  // One AdamWOptions per param group (ParamRef::group indexes them).
  explicit AdamW(std::vector<AdamWOptions> groups);
  explicit AdamW(AdamWOptions options) : AdamW(std::vector<AdamWOptions>{options}) {}
  std::string_view name() const override { return "AdamW"; }
  std::size_t num_groups() const override { return groups_.size(); }
  double lr(std::size_t group) const override;
  void set_lr(std::size_t group, double lr) override;
  std::vector<std::pair<std::string, double>> options(std::size_t group) const override;

 protected:
  std::size_t state_slots(std::size_t) const override { return 2; }
  void update(const ParamSegment& segment, std::vector<float*>& state, std::uint64_t step,
              const DeviceContext& ctx) override;

 private:
  std::vector<AdamWOptions> groups_;
};

}  // namespace accel
