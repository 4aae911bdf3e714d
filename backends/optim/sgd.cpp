#include "backends/optim/sgd.hpp"

#include "foundation/error.hpp"

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

std::vector<std::pair<std::string, double>> Sgd::options(std::size_t group) const {
  check_group(group);
  const SgdOptions& o = groups_[group];
  return {{"lr", o.lr},
          {"momentum", o.momentum},
          {"dampening", o.dampening},
          {"weight_decay", o.weight_decay},
          {"nesterov", o.nesterov ? 1.0 : 0.0}};
}

std::size_t Sgd::state_slots(std::size_t group) const { return groups_[group].momentum != 0; }

void Sgd::update(const ParamSegment& segment, std::vector<float*>& state, std::uint64_t step,
                 const DeviceContext& ctx) {
  const SgdOptions& o = groups_[segment.group];
  SgdStepArgs args;
  args.lr = float(o.lr);
  args.weight_decay = float(o.weight_decay);
  args.momentum = float(o.momentum);
  args.dampening_complement = 1.0f - float(o.dampening);
  args.nesterov = o.nesterov;
  args.first_step = step == 1;  // the buffer starts as the gradient
  // On the CPU or, for a segment in GPU memory, the CUDA kernel (elementwise.hpp).
  sgd_update(segment.values, segment.grad, state.empty() ? nullptr : state[0], args, ctx);
}

}  // namespace accel
