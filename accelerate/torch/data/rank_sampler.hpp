#pragma once
// The indices this rank's LibTorch loader asks its dataset for: a torch::data Sampler<> that
// either deals out this rank's share of a ShardedSampler (several processes) or passes the
// loop's own sampler through (one process, or a DistributedSampler that shards itself), so
// LibTorch's own StatelessDataLoader runs the dataset, its transforms, workers and collation.
//
// The loader that owns it keeps a handle on its Plan (LibTorch's loader holds the sampler
// privately) to pick the epoch and the batches to skip; reset() at each pass reads them.

#include <cstddef>
#include <memory>
#include <optional>
#include <vector>

#include <c10/util/Optional.h>
#include <torch/data/samplers/base.h>

#include "accelerate/data/sharded_sampler.hpp"

namespace accel {

class RankSampler final : public torch::data::samplers::Sampler<> {
 public:
  struct Plan {
    std::optional<ShardedSampler> sharded;                  // this rank's share, or
    std::unique_ptr<torch::data::samplers::Sampler<>> own;  // the loop's own sampler
    std::size_t batch_size = 1;                             // the loader's
    std::size_t skip_batches = 0;  // the next pass starts there (skip_first_batches), once
  };

  explicit RankSampler(std::shared_ptr<Plan> plan);

  // A new pass: the sharded epoch's indices (from batch skip_batches), or the own sampler's
  // reset and its first skip_batches batches drawn and dropped (no sample is read).
  void reset(c10::optional<std::size_t> new_size = c10::nullopt) override;
  c10::optional<std::vector<std::size_t>> next(std::size_t batch_size) override;
  // The own sampler's, or the sharded epoch and position.
  void save(torch::serialize::OutputArchive& archive) const override;
  void load(torch::serialize::InputArchive& archive) override;

 private:
  std::shared_ptr<Plan> plan_;
  std::vector<std::size_t> indices_;  // sharded: this pass's, batch after batch
  std::size_t cursor_ = 0;
};

}  // namespace accel
