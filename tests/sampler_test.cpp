// ShardedSampler: the ranks together see every sample once per epoch (plus the documented
// padding), in exactly the global batches one process would see.

#include <doctest/doctest.h>

#include <algorithm>
#include <map>

#include "accelerate/data/sharded_sampler.hpp"
#include "foundation/error.hpp"

using namespace accel;

namespace {

// The epoch as one process with batch_size * world would see it, rebuilt from the ranks.
std::vector<std::size_t> interleave(const std::vector<std::vector<std::size_t>>& per_rank,
                                    std::size_t batch) {
  std::vector<std::size_t> out;
  const std::size_t batches = per_rank[0].size() / batch;
  for (std::size_t g = 0; g < batches; ++g)
    for (const auto& r : per_rank)
      out.insert(out.end(), r.begin() + std::ptrdiff_t(g * batch),
                 r.begin() + std::ptrdiff_t((g + 1) * batch));
  return out;
}

}  // namespace

TEST_CASE("every sample is seen once per epoch across ranks, besides the padding") {
  for (std::size_t n : {1u, 7u, 60u, 61u, 100u})
    for (int world : {1, 2, 3, 4})
      for (std::size_t batch : {1u, 4u, 5u}) {
        CAPTURE(n);
        CAPTURE(world);
        CAPTURE(batch);
        std::vector<std::vector<std::size_t>> per_rank;
        for (int r = 0; r < world; ++r) {
          ShardedSampler s(n, world, r, {batch, true, 42, false});
          s.set_epoch(3);
          per_rank.push_back(s.indices());
          // the same count everywhere; one process pads nothing (its last batch is short)
          CHECK(per_rank.back().size() == (world == 1 ? n : s.num_batches() * batch));
        }
        ShardedSampler s0(n, world, 0, {batch, true, 42, false});
        if (world == 1) CHECK(s0.num_batches() == (n + batch - 1) / batch);
        const auto all = world == 1 ? per_rank[0] : interleave(per_rank, batch);
        CHECK(all.size() == n + s0.padding());
        std::map<std::size_t, int> seen;
        for (std::size_t i = 0; i < n; ++i) ++seen[all[i]];
        CHECK(seen.size() == n);  // the first n positions hold each sample exactly once
        for (std::size_t i = n; i < all.size(); ++i) CHECK(all[i] < n);  // padding repeats
        CHECK(s0.padding() < batch * std::size_t(world));
      }
}

TEST_CASE("N ranks see the global batches of one process with the global batch size") {
  const std::size_t n = 50, batch = 3;
  ShardedSampler single(n, 1, 0, {batch * 4, true, 9, false});
  single.set_epoch(1);
  std::vector<std::vector<std::size_t>> per_rank;
  for (int r = 0; r < 4; ++r) {
    ShardedSampler s(n, 4, r, {batch, true, 9, false});
    s.set_epoch(1);
    per_rank.push_back(s.indices());
  }
  // The 4 ranks pad their last global batch (50 of 60 are new); one process does not.
  auto global = interleave(per_rank, batch);
  CHECK(global.size() == 60);
  global.resize(n);
  CHECK(global == single.indices());
}

TEST_CASE("drop_last drops the incomplete global batch; shuffling follows the epoch") {
  ShardedSampler s(10, 2, 1, {3, true, 5, true});
  CHECK(s.num_batches() == 1);
  CHECK(s.padding() == 0);
  CHECK(s.indices().size() == 3);
  ShardedSampler a(100, 1, 0, {10, true, 5, false}), b(100, 1, 0, {10, true, 5, false});
  a.set_epoch(0);
  b.set_epoch(1);
  CHECK(a.indices() != b.indices());
  b.set_epoch(0);
  CHECK(a.indices() == b.indices());
  ShardedSampler ordered(5, 1, 0, {2, false, 0, false});
  CHECK(ordered.indices() == std::vector<std::size_t>{0, 1, 2, 3, 4});  // one process: no pad
  ShardedSampler ordered2(5, 2, 1, {2, false, 0, false});
  CHECK(ordered2.indices() == std::vector<std::size_t>{2, 3, 1, 2});  // 2 ranks: wrapped
  CHECK(ordered2.padding() == 3);
  CHECK_THROWS_AS(ShardedSampler(5, 2, 2), InvalidArgument);
}

TEST_CASE("without even_batches nothing repeats: the last global batch falls as it falls") {
  // 31 samples, 3 ranks of batch 4: two full global batches of 12, then 7 left: rank 0 gets
  // 4, rank 1 gets 3, rank 2 none.
  const std::size_t n = 31;
  std::vector<std::size_t> all;
  const std::vector<std::size_t> batches = {3, 3, 2}, samples = {12, 11, 8};
  for (int r = 0; r < 3; ++r) {
    CAPTURE(r);
    ShardedSampler s(n, 3, r, {.batch_size = 4, .seed = 3, .even_batches = false});
    CHECK(s.num_batches() == batches[std::size_t(r)]);
    CHECK(s.padding() == 0);
    const auto mine = s.indices();
    CHECK(mine.size() == samples[std::size_t(r)]);
    all.insert(all.end(), mine.begin(), mine.end());
  }
  std::sort(all.begin(), all.end());
  CHECK(std::adjacent_find(all.begin(), all.end()) == all.end());  // each sample once
  CHECK(all.size() == n);
  // drop_last still drops the incomplete global batch on every rank.
  ShardedSampler dropped(n, 3, 0, {.batch_size = 4, .drop_last = true, .even_batches = false});
  CHECK(dropped.num_batches() == 2);
  // With even_batches (the default) every rank has 3 batches, 5 samples of padding in all.
  ShardedSampler even(n, 3, 2, {.batch_size = 4});
  CHECK(even.num_batches() == 3);
  CHECK(even.padding() == 5);
}
