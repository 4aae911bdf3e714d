#pragma once
// SGD as PyTorch's torch.optim.SGD: weight decay (L2, added to the gradient), momentum with
// dampening (the buffer starts as the first gradient), Nesterov.

#include "backends/optim/optimizer.hpp"

namespace accel {

struct SgdOptions {
  double lr = 0.01;
  double momentum = 0.0;
  double dampening = 0.0;
  double weight_decay = 0.0;
  bool nesterov = false;
};

class Sgd final : public Optimizer {
 public:
  // One SgdOptions per param group (ParamRef::group indexes them).
  explicit Sgd(std::vector<SgdOptions> groups);
  explicit Sgd(SgdOptions options) : Sgd(std::vector<SgdOptions>{options}) {}
  std::string_view name() const override { return "SGD"; }
  std::size_t num_groups() const override { return groups_.size(); }
  double lr(std::size_t group) const override;
  void set_lr(std::size_t group, double lr) override;
  std::vector<std::pair<std::string, double>> options(std::size_t group) const override;

 protected:
  std::size_t state_slots(std::size_t group) const override;
  void update(const ParamSegment& segment, std::vector<float*>& state, std::uint64_t step,
              const DeviceContext& ctx) override;

 private:
  std::vector<SgdOptions> groups_;
};

}  // namespace accel
