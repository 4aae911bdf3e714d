#include "backends/optim/clip.hpp"

#include <cmath>

#include "backends/comm/host_collectives.hpp"
#include "backends/optim/elementwise.hpp"

namespace accel {

double clip_grad_norm(Strategy& strategy, Communicator& comm, double max_norm) {
  const std::vector<ParamSegment> segments = strategy.segments();
  const DeviceContext ctx = compute_context(comm);  // GPU work on the loop's compute stream
  double sum_sq = 0;
  for (const ParamSegment& s : segments) add_sum_of_squares(s.grad, sum_sq, ctx);  // CPU or GPU
  // Each rank summed its own slice: the global sum of squares is the sum over ranks.
  if (strategy.gradients_sharded()) {
    all_reduce_values(comm, Buffer{&sum_sq, 1, DType::f64, DeviceKind::cpu}, ReduceOp::sum);
    sum_sq /= strategy.gradient_replicas();  // each slice summed once per replica
  }
  const double norm = std::sqrt(sum_sq);
  const double coef = max_norm / (norm + 1e-6);  // PyTorch's clip_grad_norm_ epsilon
  if (coef < 1.0)
    for (const ParamSegment& s : segments) scale_in_place(s.grad, coef, ctx);
  return norm;
}

}  // namespace accel
