#include "accelerate/data/sharded_sampler.hpp"

#include <algorithm>
#include <numeric>
#include <random>

#include "foundation/error.hpp"

namespace accel {

ShardedSampler::ShardedSampler(std::size_t dataset_size, int world_size, int rank,
                               SamplerOptions options)
    : dataset_size_(dataset_size), world_size_(world_size), rank_(rank), options_(options) {
  ACCEL_CHECK_ARG(
      world_size >= 1 && rank >= 0 && rank < world_size,
      "sampler: rank " + std::to_string(rank) + " outside world of " + std::to_string(world_size));
  ACCEL_CHECK_ARG(options.batch_size >= 1, "sampler: batch_size must be at least 1");
  ACCEL_CHECK_ARG(dataset_size > 0 || options.drop_last, "sampler: the dataset is empty");
}

std::vector<std::size_t> ShardedSampler::permutation() const {
  std::vector<std::size_t> p(dataset_size_);
  std::iota(p.begin(), p.end(), std::size_t{0});
  if (options_.shuffle) {
    // mt19937_64 and our own Fisher-Yates: std::shuffle's algorithm is unspecified, and
    // every rank (and a resumed run) must draw the very same permutation.
    std::mt19937_64 rng(options_.seed + epoch_);
    for (std::size_t i = p.size(); i > 1; --i) std::swap(p[i - 1], p[rng() % i]);
  }
  return p;
}

bool ShardedSampler::pads() const {
  // One process pads nothing, as Accelerate: its last batch is short, as in the plain loop.
  return options_.even_batches && world_size_ > 1;
}

std::size_t ShardedSampler::tail_samples() const {
  if (options_.drop_last || pads()) return 0;
  const std::size_t b = options_.batch_size, global = b * std::size_t(world_size_);
  const std::size_t rest = dataset_size_ % global, before = std::size_t(rank_) * b;
  return rest > before ? std::min(b, rest - before) : 0;
}

std::size_t ShardedSampler::num_batches() const {
  const std::size_t global = options_.batch_size * std::size_t(world_size_);
  if (options_.drop_last || !pads()) return dataset_size_ / global + (tail_samples() > 0 ? 1 : 0);
  return (dataset_size_ + global - 1) / global;
}

std::pair<std::size_t, std::size_t> ShardedSampler::batch_bounds(std::size_t b) const {
  const std::size_t size = options_.batch_size, global = size * std::size_t(world_size_);
  const std::size_t full = dataset_size_ / global, batches = num_batches();
  // indices()' length: full batches, then this rank's part of an unpadded tail
  const std::size_t total =
      batches > full && !pads() ? full * size + tail_samples() : batches * size;
  const std::size_t begin = std::min(b * size, total);
  return {begin, std::min(begin + size, total)};
}

std::size_t ShardedSampler::padding() const {
  if (!pads()) return 0;
  const std::size_t total = num_batches() * options_.batch_size * std::size_t(world_size_);
  return total > dataset_size_ ? total - dataset_size_ : 0;
}

std::vector<std::size_t> ShardedSampler::indices() const {
  const std::vector<std::size_t> p = permutation();
  const std::size_t b = options_.batch_size, global = b * std::size_t(world_size_);
  const std::size_t full = dataset_size_ / global, batches = num_batches();
  std::vector<std::size_t> out;
  out.reserve(batches * b);
  for (std::size_t g = 0; g < batches; ++g) {
    const std::size_t count = g == full && !pads() ? tail_samples() : b;
    for (std::size_t k = 0; k < count; ++k)
      out.push_back(p[(g * global + std::size_t(rank_) * b + k) % p.size()]);  // wrap to pad
  }
  return out;
}

}  // namespace accel
