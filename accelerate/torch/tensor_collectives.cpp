#include "accelerate/torch/detail/tensor_collectives.hpp"

#include <cstdint>
#include <span>
#include <vector>

#include <ATen/Functions.h>

#include "accelerate/torch/detail/tensor_buffer.hpp"
#include "backends/comm/host_collectives.hpp"
#include "foundation/error.hpp"

namespace accel::tensor_collectives {
namespace {

// Collectives need one of the communicators' dtypes: others (bool, uint8 ...) travel as int.
at::Tensor communicable(const at::Tensor& t) {
  const at::Tensor c = t.contiguous();
  return to_dtype(c.scalar_type()) ? c : c.to(at::kInt);
}

}  // namespace

at::Tensor gather(Communicator& comm, const at::Tensor& t) {
  const at::Tensor local = communicable(t.dim() == 0 ? t.reshape({1}) : t);
  std::vector<std::int64_t> shape = local.sizes().vec();
  shape[0] *= comm.world_size();
  at::Tensor out = at::empty(shape, local.options());
  comm.all_gather(tensor_buffer(local, "gather"), tensor_buffer(out, "gather"))->wait();
  return out.to(t.scalar_type());
}

at::Tensor reduce(Communicator& comm, const at::Tensor& t, ReduceOp op) {
  at::Tensor out = communicable(t).clone();
  comm.all_reduce(tensor_buffer(out, "reduce"), op)->wait();
  return out.to(t.scalar_type());
}

void broadcast(Communicator& comm, at::Tensor& t, int root) {
  ACCEL_CHECK_ARG(t.is_contiguous(), "broadcast: the tensor must be contiguous");
  if (to_dtype(t.scalar_type())) {
    comm.broadcast(tensor_buffer(t, "broadcast"), root)->wait();
    return;
  }
  at::Tensor staged = communicable(t);
  comm.broadcast(tensor_buffer(staged, "broadcast"), root)->wait();
  t.copy_(staged);
}

at::Tensor pad_across_processes(Communicator& comm, const at::Tensor& t, double value) {
  ACCEL_CHECK_ARG(t.dim() >= 1, "pad_across_processes: the tensor needs a dimension 0");
  std::int64_t longest = t.size(0);
  all_reduce_values(comm, buffer_of(std::span(&longest, 1)), ReduceOp::max);  // NCCL too
  if (longest == t.size(0)) return t;
  std::vector<std::int64_t> shape = t.sizes().vec();
  shape[0] = longest - t.size(0);
  return at::cat({t, at::full(shape, value, t.options())}, 0);
}

}  // namespace accel::tensor_collectives
