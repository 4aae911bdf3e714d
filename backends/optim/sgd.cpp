#include "backends/optim/sgd.hpp"

#include "backends/comm/error.hpp"

namespace accel {

Sgd::Sgd(std::vector<SgdOptions> groups) : groups_(std::move(groups)) {
  ACCEL_CHECK_ARG(!groups_.empty(), "SGD: no param groups");
  for (std::size_t g = 0; g < groups_.size(); ++g) {
    const SgdOptions& o = groups_[g];
    const std::string where = "SGD param group " + std::to_string(g) + ": ";
    ACCEL_CHECK_ARG(o.lr >= 0, where + "lr must not be negative");
    ACCEL_CHECK_ARG(o.momentum >= 0, where + "momentum must not be negative");
    ACCEL_CHECK_ARG(o.weight_decay >= 0, where + "weight_decay must not be negative");
    // PyTorch's own rule: Nesterov needs momentum and no dampening.
    ACCEL_CHECK_ARG(!o.nesterov || (o.momentum > 0 && o.dampening == 0),
                    where + "nesterov needs momentum > 0 and dampening 0");
  }
}

double Sgd::lr(std::size_t group) const {
  check_group(group);
  return groups_[group].lr;
}

void Sgd::set_lr(std::size_t group, double lr) {
  check_group(group);
  groups_[group].lr = lr;
}

std::size_t Sgd::state_slots(std::size_t group) const { return groups_[group].momentum != 0; }

void Sgd::update(const ParamSegment& segment, std::vector<float*>& state, std::uint64_t step) {
  const SgdOptions& o = groups_[segment.group];
  float* p = static_cast<float*>(segment.values.data);
  const float* g = static_cast<const float*>(segment.grad.data);
  const float lr = float(o.lr), wd = float(o.weight_decay), mu = float(o.momentum);
  const float damp = 1.0f - float(o.dampening);
  float* buf = state.empty() ? nullptr : state[0];
  for (std::size_t i = 0; i < segment.values.count; ++i) {
    float d = g[i];
    if (wd != 0) d += wd * p[i];
    if (buf) {
      buf[i] = step == 1 ? d : mu * buf[i] + damp * d;  // the buffer starts as the gradient
      d = o.nesterov ? d + mu * buf[i] : buf[i];
    }
    p[i] -= lr * d;
  }
}

}  // namespace accel
