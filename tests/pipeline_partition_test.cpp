// Splitting layers into pipeline pieces: uniform by count, balanced by weight (parameters or
// measured times) with the heaviest piece as light as it can be, explicit split points by
// name; and the refusals, naming what is wrong.

#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "accelerate/pipeline/partition.hpp"
#include "foundation/error.hpp"

using namespace accel;
using namespace accel::pipeline;

TEST_CASE("uniform: sizes within one layer, the larger pieces first") {
  CHECK(uniform(10, 4) == PieceBounds{0, 3, 6, 8, 10});
  CHECK(uniform(8, 4) == PieceBounds{0, 2, 4, 6, 8});
  CHECK(uniform(3, 3) == PieceBounds{0, 1, 2, 3});
  CHECK(uniform(5, 1) == PieceBounds{0, 5});
}

TEST_CASE("balance: the heaviest piece as light as possible") {
  // An embedding of 100, four blocks of 10, a head of 100: the big ends get pieces of their
  // own, the blocks share the middle.
  CHECK(balance({100, 10, 10, 10, 10, 100}, 3) == PieceBounds{0, 1, 5, 6});
  // Equal weights: every split into pieces of 2 is as good; each piece takes what it may.
  CHECK(balance({1, 1, 1, 1, 1, 1}, 3) == PieceBounds{0, 2, 4, 6});
  // The optimum is not the greedy fill of the average: 5 | 4 1 | 3 3 (max 6), not 5 4 | ...
  CHECK(balance({5, 4, 1, 3, 3}, 3) == PieceBounds{0, 1, 3, 5});
  // A layer heavier than everything else together still leaves a layer to each piece.
  CHECK(balance({1000, 1, 1}, 3) == PieceBounds{0, 1, 2, 3});
  // Measured times (not integers): the same rule.
  CHECK(balance({0.5, 0.25, 0.25, 0.5}, 2) == PieceBounds{0, 2, 4});
  // Zero weights (layers without parameters) travel with their neighbours.
  CHECK(balance({0, 6, 0, 0, 6, 0}, 2) == PieceBounds{0, 4, 6});
}

TEST_CASE("split_at: the first layer of each later piece, by name") {
  const std::vector<std::string> names = {"embed", "block0", "block1", "block2", "head"};
  CHECK(split_at(names, {"block1", "head"}, 3) == PieceBounds{0, 2, 4, 5});
  CHECK_THROWS_WITH_AS(split_at(names, {"block9"}, 2),
                       "pipeline: split point 'block9' is not a layer of the model",
                       InvalidArgument);
  CHECK_THROWS_WITH_AS(split_at(names, {"block2", "block1"}, 3),
                       "pipeline: split point 'block1' does not come after the previous piece's "
                       "first layer (each piece needs a layer, in the model's order)",
                       InvalidArgument);
  CHECK_THROWS_WITH_AS(split_at(names, {"embed"}, 2),
                       doctest::Contains("split point 'embed' does not come after"),
                       InvalidArgument);
  CHECK_THROWS_WITH_AS(split_at(names, {"block1"}, 3),
                       "pipeline: 1 split points make 2 pieces, not 3", InvalidArgument);
}

TEST_CASE("refusals name the counts and the method") {
  CHECK_THROWS_WITH_AS(uniform(3, 4),
                       "pipeline: 3 layers cannot make 4 pipeline pieces (each needs a layer)",
                       InvalidArgument);
  CHECK_THROWS_WITH_AS(balance({1, -2}, 2), doctest::Contains("layer 1's weight"), InvalidArgument);
  CHECK_THROWS_WITH_AS(parse_partition_method("type:transformer"),
                       "partition_method 'type:transformer' is not a method (uniform, "
                       "parameters, profile)",
                       InvalidArgument);
  CHECK(parse_partition_method("parameters") == PartitionMethod::parameters);
}
