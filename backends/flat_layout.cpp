#include "backends/flat_layout.hpp"

#include <algorithm>

#include "foundation/error.hpp"

namespace accel {

FlatLayout::FlatLayout(const std::vector<ParamRef>& params, int world, int rank)
    : world_(world), rank_(rank), flat_of_(params.size()), offset_of_(params.size()) {
  ACCEL_CHECK_ARG(
      world >= 1 && rank >= 0 && rank < world,
      "ZeRO layout: rank " + std::to_string(rank) + " outside world of " + std::to_string(world));
  std::size_t num_groups = 0;
  for (const ParamRef& p : params) num_groups = std::max(num_groups, p.group + 1);
  for (std::size_t g = 0; g < num_groups; ++g) {
    const std::size_t first = groups_.size();
    for (std::size_t i = 0; i < params.size(); ++i) {
      if (params[i].group != g) continue;
      std::size_t f = first;
      while (f < groups_.size() && groups_[f].dtype != params[i].data.dtype) ++f;
      if (f == groups_.size()) groups_.push_back({g, params[i].data.dtype, {}, 0, 0});
      FlatGroup& fg = groups_[f];
      flat_of_[i] = f;
      offset_of_[i] = fg.count;
      fg.params.push_back(i);
      fg.count += params[i].data.count;
    }
  }
  const auto n = std::size_t(world);
  for (FlatGroup& fg : groups_) fg.padded = (fg.count + n - 1) / n * n;
  for (const ParamRef& p : params) param_counts_.push_back(p.data.count);
}

Shard FlatLayout::owned(std::size_t g, int r) const {
  return shard_of(groups_[g].padded, world_, r);
}

std::vector<FlatBucket> FlatLayout::buckets(std::size_t cap_bytes) const {
  // One open bucket per flat buffer, filled in reverse parameter order: the parameters a
  // bucket takes are consecutive in its flat buffer, so its range is contiguous. A parameter
  // larger than what is left is split over buckets, so no bucket exceeds the cap.
  std::vector<FlatBucket> out;
  constexpr std::size_t kNone = std::size_t(-1);
  std::vector<std::size_t> open(groups_.size(), kNone);
  for (std::size_t i = param_counts_.size(); i-- > 0;) {
    const std::size_t f = flat_of_[i];
    const std::size_t cap = std::max<std::size_t>(1, cap_bytes / element_size(groups_[f].dtype));
    std::size_t end = offset_of_[i] + param_counts_[i];
    std::size_t left = param_counts_[i];
    while (left > 0) {
      std::size_t& b = open[f];
      if (b == kNone) {
        out.push_back({f, end, end, {}});
        b = out.size() - 1;
      }
      const std::size_t take = std::min(left, cap - (out[b].end - out[b].begin));
      out[b].begin -= take;
      out[b].params.push_back(i);
      end -= take;
      left -= take;
      if (out[b].end - out[b].begin == cap) b = kNone;  // full
    }
  }
  return out;
}

std::vector<std::size_t> FlatLayout::owner_counts(std::size_t g, std::size_t begin,
                                                  std::size_t end) const {
  std::vector<std::size_t> counts(std::size_t(world_), 0);
  for (int r = 0; r < world_; ++r) {
    const Shard s = owned(g, r);
    const std::size_t lo = std::max(begin, s.offset), hi = std::min(end, s.offset + s.count);
    if (hi > lo) counts[std::size_t(r)] = hi - lo;
  }
  return counts;
}

}  // namespace accel
