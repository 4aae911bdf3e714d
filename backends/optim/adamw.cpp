#include "backends/optim/adamw.hpp"

#include <cmath>

#include "backends/comm/error.hpp"

namespace accel {

AdamW::AdamW(std::vector<AdamWOptions> groups) : groups_(std::move(groups)) {
  ACCEL_CHECK_ARG(!groups_.empty(), "AdamW: no param groups");
  for (std::size_t g = 0; g < groups_.size(); ++g) {
    const AdamWOptions& o = groups_[g];
    const std::string where = "AdamW param group " + std::to_string(g) + ": ";
    ACCEL_CHECK_ARG(o.lr >= 0, where + "lr must not be negative");
    ACCEL_CHECK_ARG(o.beta1 >= 0 && o.beta1 < 1 && o.beta2 >= 0 && o.beta2 < 1,
                    where + "betas must lie in [0, 1)");
    ACCEL_CHECK_ARG(o.eps >= 0, where + "eps must not be negative");
    ACCEL_CHECK_ARG(o.weight_decay >= 0, where + "weight_decay must not be negative");
  }
}

double AdamW::lr(std::size_t group) const {
  check_group(group);
  return groups_[group].lr;
}

void AdamW::set_lr(std::size_t group, double lr) {
  check_group(group);
  groups_[group].lr = lr;
}

void AdamW::update(const ParamSegment& segment, std::vector<float*>& state, std::uint64_t step) {
  const AdamWOptions& o = groups_[segment.group];
  float* p = static_cast<float*>(segment.values.data);
  const float* g = static_cast<const float*>(segment.grad.data);
  float* m = state[0];
  float* v = state[1];
  // PyTorch's scalar arithmetic: corrections in double, element updates in float.
  const double bias1 = 1 - std::pow(o.beta1, double(step));
  const double bias2_sqrt = std::sqrt(1 - std::pow(o.beta2, double(step)));
  const float step_size = float(o.lr / bias1);
  const float b1 = float(o.beta1), b2 = float(o.beta2), eps = float(o.eps);
  const float decay = float(1 - o.lr * o.weight_decay), wd = float(o.weight_decay);
  const float c2 = float(bias2_sqrt);
  for (std::size_t i = 0; i < segment.values.count; ++i) {
    float grad = g[i];
    if (o.decoupled_weight_decay)
      p[i] *= decay;
    else if (wd != 0)
      grad += wd * p[i];
    m[i] = m[i] * b1 + grad * (1 - b1);
    v[i] = v[i] * b2 + grad * grad * (1 - b2);
    const float denom = std::sqrt(v[i]) / c2 + eps;
    p[i] -= step_size * (m[i] / denom);
  }
}

}  // namespace accel
