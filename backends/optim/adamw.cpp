#include "backends/optim/adamw.hpp"

#include <cmath>

#include "foundation/error.hpp"

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

std::vector<std::pair<std::string, double>> AdamW::options(std::size_t group) const {
  check_group(group);
  const AdamWOptions& o = groups_[group];
  return {{"lr", o.lr},
          {"beta1", o.beta1},
          {"beta2", o.beta2},
          {"eps", o.eps},
          {"weight_decay", o.weight_decay},
          {"decoupled_weight_decay", o.decoupled_weight_decay ? 1.0 : 0.0}};
}

void AdamW::update(const ParamSegment& segment, std::vector<float*>& state, std::uint64_t step,
                   const DeviceContext& ctx) {
  const AdamWOptions& o = groups_[segment.group];
  // PyTorch's scalar arithmetic: corrections in double, element updates in float.
  const double bias1 = 1 - std::pow(o.beta1, double(step));
  const double bias2_sqrt = std::sqrt(1 - std::pow(o.beta2, double(step)));
  AdamWStepArgs args;
  args.step_size = float(o.lr / bias1);
  args.beta1 = float(o.beta1);
  args.beta2 = float(o.beta2);
  args.one_minus_beta1 = 1 - args.beta1;
  args.one_minus_beta2 = 1 - args.beta2;
  args.eps = float(o.eps);
  args.decay = float(1 - o.lr * o.weight_decay);
  args.weight_decay = float(o.weight_decay);
  args.bias2_sqrt = float(bias2_sqrt);
  args.decoupled = o.decoupled_weight_decay;
  // On the CPU or, for a segment in GPU memory, the CUDA kernel (elementwise.hpp).
  adamw_update(segment.values, segment.grad, state[0], state[1], args, ctx);
}

}  // namespace accel
