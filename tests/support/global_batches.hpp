#pragma once
// The reference of an equivalence test: the global batches N ranks' ShardedSamplers deal in
// an epoch, batch by batch, rank 0's part first (the padding that fills the last one at N > 1
// included). One process training on these is "the same global batches" as the N ranks.

#include <cstddef>
#include <cstdint>
#include <vector>

#include "accelerate/data/sharded_sampler.hpp"

namespace accel::test {

inline std::vector<std::vector<std::size_t>> global_batches(std::size_t dataset_size, int world,
                                                            const SamplerOptions& options,
                                                            std::uint64_t epoch) {
  std::vector<std::vector<std::size_t>> out;
  for (int r = 0; r < world; ++r) {
    ShardedSampler sampler(dataset_size, world, r, options);
    sampler.set_epoch(epoch);
    const std::vector<std::size_t> mine = sampler.indices();
    out.resize(sampler.num_batches());
    for (std::size_t b = 0; b < sampler.num_batches(); ++b) {
      const auto [begin, end] = sampler.batch_bounds(b);
      out[b].insert(out[b].end(), mine.begin() + std::ptrdiff_t(begin),
                    mine.begin() + std::ptrdiff_t(end));
    }
  }
  return out;
}

}  // namespace accel::test
