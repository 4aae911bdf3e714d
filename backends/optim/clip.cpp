#include "backends/optim/clip.hpp"

#include <cmath>

namespace accel {

double clip_grad_norm(Strategy& strategy, Communicator& comm, double max_norm) {
  const std::vector<ParamSegment> segments = strategy.segments();
  double sum_sq = 0;
  for (const ParamSegment& s : segments)
    visit_dtype(s.grad.dtype, [&](auto element) {
      using T = decltype(element);
      const T* g = static_cast<const T*>(s.grad.data);
      for (std::size_t i = 0; i < s.grad.count; ++i) {
        const double v = element_to_double(g[i]);
        sum_sq += v * v;
      }
    });
  // Each rank summed its own slice: the global sum of squares is the sum over ranks.
  if (strategy.gradients_sharded())
    comm.all_reduce(Buffer{&sum_sq, 1, DType::f64, DeviceKind::cpu}, ReduceOp::sum)->wait();
  const double norm = std::sqrt(sum_sq);
  const double coef = max_norm / (norm + 1e-6);  // PyTorch's clip_grad_norm_ epsilon
  if (coef < 1.0)
    for (const ParamSegment& s : segments)
      visit_dtype(s.grad.dtype, [&](auto element) {
        using T = decltype(element);
        T* g = static_cast<T*>(s.grad.data);
        for (std::size_t i = 0; i < s.grad.count; ++i)
          g[i] = element_from_double<T>(element_to_double(g[i]) * coef);
      });
  return norm;
}

}  // namespace accel
