#pragma once
// ZeRO's flat layout: the parameters of each (param group, dtype) laid end to end in one flat
// buffer, in parameter order, padded with zeros to a multiple of the world size; rank r owns
// the contiguous slice shard_of(padded, world, r) (equal slices, since padded divides). No
// parameter needs to divide by the world size, and a world larger than the parameter count
// just leaves some ranks' slices all padding.
//
// Buckets (for the gradient reduce-scatter): runs of consecutive parameters of one flat
// buffer, taken in reverse parameter order (the order backward produces gradients) and
// capped in bytes (a larger parameter is split over several), so each bucket is one
// contiguous element range of its flat buffer and its overlap with every rank's slice is one
// contiguous piece: owner_counts().

#include <cstddef>
#include <vector>

#include "backends/backend.hpp"

namespace accel {

struct FlatGroup {
  std::size_t group = 0;  // the param group (ParamRef::group)
  DType dtype = DType::f32;
  std::vector<std::size_t> params;  // parameter indices, in parameter order
  std::size_t count = 0;            // elements of real parameters
  std::size_t padded = 0;           // count rounded up to a multiple of the world size
};

struct FlatBucket {
  std::size_t flat = 0;             // index into FlatLayout::groups
  std::size_t begin = 0, end = 0;   // element range in that flat buffer
  std::vector<std::size_t> params;  // those overlapping it, in reverse parameter order
};

class FlatLayout {
 public:
  // Groups ordered by param group, then by the dtype's first appearance in it.
  FlatLayout(const std::vector<ParamRef>& params, int world, int rank);

  int world() const { return world_; }
  int rank() const { return rank_; }
  const std::vector<FlatGroup>& groups() const { return groups_; }
  std::size_t flat_of(std::size_t param) const { return flat_of_[param]; }
  std::size_t offset_of(std::size_t param) const { return offset_of_[param]; }
  // Rank r's slice of flat buffer g (this rank's when r is omitted).
  Shard owned(std::size_t g) const { return owned(g, rank_); }
  Shard owned(std::size_t g, int r) const;

  // Buckets of at most cap_bytes each.
  std::vector<FlatBucket> buckets(std::size_t cap_bytes) const;
  // Elements of [begin, end) of flat buffer g that each rank owns, in rank order.
  std::vector<std::size_t> owner_counts(std::size_t g, std::size_t begin, std::size_t end) const;

 private:
  int world_, rank_;
  std::vector<FlatGroup> groups_;
  std::vector<std::size_t> flat_of_, offset_of_;
  std::vector<std::size_t> param_counts_;
};

}  // namespace accel
