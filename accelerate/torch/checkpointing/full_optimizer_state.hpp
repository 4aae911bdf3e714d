#pragma once
// FSDP's full optimizer state dict (state_dict_type FULL_STATE_DICT) for an optimizer that ZeRO
// shards, as acc.save(optimizer, path) writes it: every rank's slice of each state array is
// gathered, cut into the parameters and given to a plain LibTorch optimizer of the user's kind
// (SGD, Adam or AdamW) over the whole parameters, whose archive torch::load reads into a plain
// optimizer over the plain model.

#include <cstddef>
#include <string>
#include <vector>

#include <ATen/Tensor.h>
#include <torch/optim/optimizer.h>

#include "backends/backend.hpp"

namespace accel {

class Accelerator;

struct ShardedOptimizer {
  const torch::optim::Optimizer* sharded = nullptr;  // the user's: its groups hold `slices`
  std::vector<ParamSegment> segments;                // this rank's; slices[k] steps segments[k]
  std::vector<at::Tensor> slices;
  // The user's groups over the whole parameters, and where each starts among its group's
  // parameters laid end to end (ParamSegment::offset's coordinates): offsets[g][j] for
  // whole->param_groups()[g].params()[j].
  const torch::optim::Optimizer* whole = nullptr;
  std::vector<std::vector<std::size_t>> offsets;
};

// Collective: every process calls it. The main process gets the archive's bytes, the others "".
std::string full_optimizer_archive(const ShardedOptimizer& optimizer, Accelerator& acc);

}  // namespace accel
