#include "accelerate/torch/checkpointing/full_optimizer_state.hpp"

#include <algorithm>
#include <cstdint>
#include <sstream>

#include <ATen/Functions.h>
#include <torch/csrc/autograd/grad_mode.h>
#include <torch/serialize.h>

#include "accelerate/accelerator.hpp"
#include "accelerate/torch/checkpointing/torch_optimizer_state.hpp"
#include "accelerate/torch/detail/tensor_collectives.hpp"
#include "foundation/error.hpp"

namespace accel {

namespace tos = torch_optimizer_state;

namespace {

// Each group's parameters laid end to end: element count per group.
std::vector<std::int64_t> group_lengths(const ShardedOptimizer& in) {
  std::vector<std::int64_t> out;
  for (std::size_t g = 0; g < in.whole->param_groups().size(); ++g) {
    std::int64_t end = 0;
    const auto& params = in.whole->param_groups()[g].params();
    for (std::size_t j = 0; j < params.size(); ++j)
      end = std::max(end, std::int64_t(in.offsets[g][j]) + params[j].numel());
    out.push_back(end);
  }
  return out;
}

}  // namespace

std::string full_optimizer_archive(const ShardedOptimizer& in, Accelerator& acc) {
  torch::NoGradGuard no_grad;
  const int world = acc.num_processes();
  const std::size_t n = in.segments.size();
  // The state exists once the optimizer stepped (an optimizer of another kind is refused here,
  // on every rank, before any collective): the step count, the same on every rank.
  for (std::size_t k = 0; k < n; ++k)
    for (std::size_t j = 0; j < k; ++j)
      ACCEL_CHECK_ARG(in.segments[j].group != in.segments[k].group,
                      "acc.save(optimizer) under ZeRO: param group " +
                          std::to_string(in.segments[k].group) +
                          " mixes parameter dtypes (one flat buffer each, overlapping in the "
                          "group's coordinates); give each dtype a param group of its own");
  std::vector<tos::TensorState> states;
  std::int64_t step = -1;
  for (const at::Tensor& slice : in.slices) {
    states.push_back(tos::state_of(*in.sharded, slice));
    if (!states.back().arrays.empty()) step = std::max(step, states.back().step);
  }
  // Where every rank's segments lie (each rank has one per flat buffer, in the same order).
  std::vector<std::int64_t> placed;
  for (const ParamSegment& s : in.segments) {
    placed.push_back(std::int64_t(s.offset));
    placed.push_back(std::int64_t(s.values.count));
  }
  const std::vector<std::int64_t> everyone = acc.gather(placed);
  step = tensor_collectives::reduce(acc.comm(), at::full({1}, step, at::kLong), ReduceOp::max)
             .item<std::int64_t>();
  const bool main = acc.is_main_process();
  const std::vector<std::int64_t> lengths = group_lengths(in);
  // full[g][a]: state array a of group g, whole (every parameter of the group end to end).
  std::vector<std::vector<at::Tensor>> full(lengths.size());
  for (std::size_t k = 0; step >= 0 && k < n; ++k) {
    const std::size_t g = in.segments[k].group;
    const std::size_t arrays = tos::arrays_per_tensor(*in.sharded, g);
    const at::Tensor& slice = in.slices[k];
    for (std::size_t a = 0; a < arrays; ++a) {
      const at::Tensor mine = a < states[k].arrays.size()
                                  ? states[k].arrays[a].reshape(-1)
                                  : at::zeros({slice.numel()}, slice.options());
      const at::Tensor padded = tensor_collectives::pad_across_processes(acc.comm(), mine, 0.0);
      const at::Tensor all = tensor_collectives::gather(acc.comm(), padded);  // world x padded
      if (!main) continue;
      if (full[g].size() <= a) full[g].push_back(at::zeros({lengths[g]}, mine.options()));
      for (int r = 0; r < world; ++r) {
        const std::int64_t offset = everyone[std::size_t(r) * 2 * n + 2 * k];
        const std::int64_t count = std::min(everyone[std::size_t(r) * 2 * n + 2 * k + 1],
                                            lengths[g] - offset);  // a slice's padding
        if (count > 0)
          full[g][a].narrow(0, offset, count).copy_(all.narrow(0, r * padded.size(0), count));
      }
    }
  }
  if (!main) return "";
  std::vector<torch::optim::OptimizerParamGroup> groups;
  for (const auto& group : in.whole->param_groups())
    groups.emplace_back(group.params(), group.options().clone());
  std::unique_ptr<torch::optim::Optimizer> plain = tos::make_like(*in.sharded, std::move(groups));
  for (std::size_t g = 0; g < full.size(); ++g) {
    if (full[g].empty()) continue;  // no state kept (SGD without momentum) or none yet
    const auto& params = plain->param_groups()[g].params();
    for (std::size_t j = 0; j < params.size(); ++j) {
      tos::TensorState state{{}, step};
      for (const at::Tensor& array : full[g])
        state.arrays.push_back(array.narrow(0, std::int64_t(in.offsets[g][j]), params[j].numel())
                                   .view(params[j].sizes())
                                   .clone());
      tos::set_state(*plain, params[j], std::move(state));
    }
  }
  std::ostringstream bytes;
  torch::save(*plain, bytes);
  return bytes.str();
}

}  // namespace accel
