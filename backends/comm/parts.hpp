#pragma once
// How an all_gather or reduce_scatter splits its buffer among the ranks: rank r's piece,
// contiguous and in rank order, covering the whole buffer. The even split (shard_of, what the
// calls without counts use) is computed on demand, not stored: the common call allocates
// nothing (a heap vector of parts was a quarter of the front end's time per all_gather call,
// bench/journal/xThe front end's cost per call"). Parts the caller chose are kept as given.

#include <algorithm>
#include <cstddef>
#include <iterator>
#include <utility>
#include <vector>

#include "foundation/reduce.hpp"

namespace accel {

class Parts {
 public:
  // shard_of(total, world, r) for every rank r.
  static Parts even(std::size_t total, int world) { return Parts(total, world); }
  // The caller's parts, already checked to be contiguous and in rank order.
  explicit Parts(std::vector<Shard> chosen)
      : world_(int(chosen.size())), chosen_(std::move(chosen)) {}

  std::size_t size() const { return std::size_t(world_); }
  Shard operator[](std::size_t r) const {
    return chosen_.empty() ? shard_of(total_, world_, int(r)) : chosen_[r];
  }
  // Whether every part holds as many elements as every other (MPI_Allgather, ncclAllGather).
  bool equal() const;
  // The element count of the largest part (what a rank's staging must hold).
  std::size_t largest() const;
  // The element counts, in rank order, as the public calls with counts take them.
  std::vector<std::size_t> counts() const;

  // Iterates the parts in rank order, each by value.
  class Iterator {
   public:
    using iterator_category = std::input_iterator_tag;
    using value_type = Shard;
    using difference_type = std::ptrdiff_t;
    using pointer = void;
    using reference = Shard;
    Iterator(const Parts& parts, std::size_t r) : parts_(&parts), r_(r) {}
    Shard operator*() const { return (*parts_)[r_]; }
    Iterator& operator++() {
      ++r_;
      return *this;
    }
    bool operator==(const Iterator& other) const { return r_ == other.r_; }

   private:
    const Parts* parts_;
    std::size_t r_;
  };
  Iterator begin() const { return {*this, 0}; }
  Iterator end() const { return {*this, size()}; }

 private:
  Parts(std::size_t total, int world) : total_(total), world_(world) {}

  std::size_t total_ = 0;  // the even split's
  int world_ = 0;
  std::vector<Shard> chosen_;  // empty for the even split
};

inline bool Parts::equal() const {
  if (chosen_.empty()) return world_ > 0 && total_ % std::size_t(world_) == 0;
  for (const Shard& s : chosen_)
    if (s.count != chosen_.front().count) return false;
  return true;
}

inline std::size_t Parts::largest() const {
  std::size_t most = 0;
  for (const Shard s : *this) most = std::max(most, s.count);
  return most;
}

inline std::vector<std::size_t> Parts::counts() const {
  std::vector<std::size_t> counts;
  counts.reserve(size());
  for (const Shard s : *this) counts.push_back(s.count);
  return counts;
}

}  // namespace accel
