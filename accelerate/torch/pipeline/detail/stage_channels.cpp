#include "accelerate/torch/pipeline/detail/stage_channels.hpp"

#include <array>
#include <set>
#include <string>

#include <torch/torch.h>

#include "accelerate/accelerator.hpp"
#include "accelerate/torch/detail/tensor_buffer.hpp"
#include "foundation/error.hpp"

namespace accel::pipeline::detail {
namespace {

constexpr std::size_t kMaxDims = 8;
using Header = std::array<std::int64_t, 2 + kMaxDims>;  // dims, scalar type, sizes

bool is_gradient(ActionKind k) {
  return k == ActionKind::send_gradient || k == ActionKind::recv_gradient;
}

bool is_send(ActionKind k) {
  return k == ActionKind::send_activation || k == ActionKind::send_gradient;
}

}  // namespace

StageChannels::StageChannels(Accelerator& accelerator, const PipelineShape& shape, int replicas,
                             int replica, int stage)
    : accelerator_(accelerator), stages_(shape.stages), replica_(replica), stage_(stage) {
  const int p = shape.stages, last = shape.virtual_stages() - 1;
  // Which stages talk, per kind: forward from piece v's stage to piece v+1's, backward back.
  std::set<std::tuple<bool, int, int>> links;
  for (int v = 0; v < last; ++v) {
    links.insert({false, v % p, (v + 1) % p});
    links.insert({true, (v + 1) % p, v % p});
  }
  for (int d = 0; d < replicas; ++d)
    for (const auto& [gradient, from, to] : links) {
      if (d != replica || (from != stage && to != stage)) continue;
      const std::string name = "pipeline_replica" + std::to_string(d) +
                               (gradient ? "_gradients_" : "_activations_") + std::to_string(from) +
                               "_to_" + std::to_string(to);
      channels_[{gradient, from, to}] = accelerator.new_group({d * p + from, d * p + to}, name);
    }
}

std::string StageChannels::who(int stage) const {
  return "stage " + std::to_string(stage) + " (rank " + std::to_string(replica_ * stages_ + stage) +
         ")";
}

Communicator& StageChannels::channel(const Action& a) {
  const bool sends = is_send(a.kind);
  const auto key =
      std::make_tuple(is_gradient(a.kind), sends ? stage_ : a.peer, sends ? a.peer : stage_);
  const auto it = channels_.find(key);
  ACCEL_CHECK_ARG(it != channels_.end(),
                  "pipeline stage " + std::to_string(stage_) + ": no channel for " + describe(a));
  return *it->second;
}

void StageChannels::send(const Action& a, const at::Tensor& t, bool with_header) {
  Communicator& c = channel(a);
  const at::Tensor data = t.detach().contiguous();
  if (with_header) {
    ACCEL_CHECK_ARG(std::size_t(data.dim()) <= kMaxDims,
                    "pipeline: an activation of " + std::to_string(data.dim()) +
                        " dimensions (at most " + std::to_string(kMaxDims) + ")");
    at::Tensor header = torch::zeros({std::int64_t(std::tuple_size_v<Header>)}, torch::kLong);
    header[0] = data.dim();
    header[1] = std::int64_t(data.scalar_type());
    for (std::int64_t d = 0; d < data.dim(); ++d) header[2 + d] = data.size(d);
    sends_.push_back({header, c.send(tensor_buffer(header, "pipeline header"), 1, a.tag), a});
  }
  sends_.push_back({data, c.send(tensor_buffer(data, describe(a)), 1, a.tag), a});
}

at::Tensor StageChannels::receive(const Action& a, bool with_header, const at::Tensor& like) {
  Communicator& c = channel(a);
  at::Tensor out;
  if (with_header) {
    at::Tensor header = torch::zeros({std::int64_t(std::tuple_size_v<Header>)}, torch::kLong);
    std::vector<Pending> header_only{
        {header, c.recv(tensor_buffer(header, "pipeline header"), 0, a.tag), a}};
    wait_all(header_only);
    const std::int64_t dims = header[0].item<std::int64_t>();
    ACCEL_CHECK_ARG(dims >= 0 && std::size_t(dims) <= kMaxDims,
                    "pipeline " + who(stage_) + ": " + describe(a) + ": the header from " +
                        who(a.peer) + " says " + std::to_string(dims) + " dimensions");
    std::vector<std::int64_t> sizes;
    for (std::int64_t d = 0; d < dims; ++d) sizes.push_back(header[2 + d].item<std::int64_t>());
    const auto type = c10::ScalarType(header[1].item<std::int64_t>());
    out = torch::empty(sizes, torch::TensorOptions().dtype(type));
  } else {
    out = torch::empty_like(like, at::MemoryFormat::Contiguous);
  }
  receives_.push_back({out, c.recv(tensor_buffer(out, describe(a)), 0, a.tag), a});
  return out;
}

void StageChannels::wait_all(std::vector<Pending>& pending) {
  for (Pending& p : pending) {
    try {
      p.work->wait();
    } catch (const Error& e) {
      const bool sends = is_send(p.action.kind);
      const std::string first = accelerator_.first_failure();
      std::string what = "pipeline " + who(stage_) + ": " + (sends ? "sending " : "receiving ") +
                         (is_gradient(p.action.kind) ? "the gradient" : "the activation") +
                         " of micro-batch " + std::to_string(p.action.microbatch) +
                         (sends ? " to " : " from ") + who(p.action.peer) + " failed";
      if (!first.empty() && first.rfind("pipeline " + who(stage_), 0) != 0)
        what += "; the job's first failure: " + first;
      // What is pending stays (its buffers may still be written): the owner abandons it all.
      throw CommError(what + " (the 2-rank channel's words: " + e.what() + ")");
    }
  }
  pending.clear();
}

void StageChannels::wait_receives() { wait_all(receives_); }

void StageChannels::wait_sends() { wait_all(sends_); }

}  // namespace accel::pipeline::detail
