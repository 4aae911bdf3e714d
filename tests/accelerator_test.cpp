// The Accelerator's raw API over real processes (accelerator_worker does the checking):
// DDP training equal to one process with accumulation and clipping, gather_for_metrics,
// set_seed, split_between_processes; over Gloo with 1, 2 and 4 ranks and over MPI. And
// global_batch_size: the same global batches at every world size, refused where it does not divide.

#include <doctest/doctest.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "backends/comm/registry.hpp"
#include "tests/support/ranks.hpp"
#include "tests/support/skip.hpp"
#include "tests/support/verdicts.hpp"

using namespace accel;
using namespace accel::test;

namespace {

void expect_pass(const launch::GroupResult& result, int world, const std::string& strategy = "") {
  INFO(describe(result));
  REQUIRE(result.exit_code() == 0);
  const Verdicts verdicts(result);
  CHECK_VERDICTS_PASSED(verdicts);
  CHECK_VERDICT(verdicts, "training equals one process", world);
  if (!strategy.empty()) CHECK(verdicts.detail("strategy") == strategy);
  CHECK_VERDICT(verdicts, "gather_for_metrics yields every sample once", world);
  CHECK(verdicts.detail("gather_for_metrics yields every sample once")
            .rfind("103 samples, 103 distinct", 0) == 0);
}

}  // namespace

TEST_CASE("the raw API over gloo equals one process, with accumulation and clipping") {
  if (skip_unless(communicator_available("gloo"), "gloo communicator not built")) return;
  for (int world : {1, 2, 4}) {
    CAPTURE(world);
    expect_pass(run_ranks(world, "accelerator_worker", {"--accumulation", "1"}), world);
    expect_pass(run_ranks(world, "accelerator_worker", {"--accumulation", "4", "--clip", "0.5"}),
                world);
  }
}

TEST_CASE("the raw API over mpi equals one process") {
  if (skip_unless(communicator_available("mpi") && !find_mpirun().empty(),
                  "mpi communicator or mpirun not available"))
    return;
  RanksOptions options;
  options.env = {{"ACCEL_COMM_BACKEND", "mpi"}};
  expect_pass(
      run_under_mpirun(2, "accelerator_worker", {"--accumulation", "4", "--clip", "0.5"}, options),
      2);
}

TEST_CASE(
    "the same raw loop under ZeRO-1 and ZeRO-2 (only the config changes) equals one process") {
  if (skip_unless(communicator_available("gloo"), "gloo communicator not built")) return;
  for (int world : {1, 2, 4})
    for (const char* stage : {"1", "2"}) {
      CAPTURE(world);
      CAPTURE(stage);
      RanksOptions options;
      options.env = {{"ACCEL_DISTRIBUTED_TYPE", "ZERO"}, {"ACCEL_ZERO_STAGE", stage}};
      expect_pass(
          run_ranks(world, "accelerator_worker", {"--accumulation", "4", "--clip", "0.5"}, options),
          world, std::string("zero") + stage);
    }
}

namespace {
// "batch B rank R: i i ..." lines -> for each batch, the sorted indices of all ranks.
std::map<int, std::vector<int>> global_batches(const launch::GroupResult& result) {
  std::map<int, std::vector<int>> out;
  for (const auto& w : result.workers) {
    std::istringstream lines(w.output);
    std::string line;
    while (std::getline(lines, line)) {
      int batch = 0, rank = 0;
      if (std::sscanf(line.c_str(), "batch %d rank %d:", &batch, &rank) != 2) continue;
      std::istringstream values(line.substr(line.find(':') + 1));
      for (int i = 0; values >> i;) out[batch].push_back(i);
    }
  }
  for (auto& [b, v] : out) std::sort(v.begin(), v.end());
  return out;
}
}  // namespace

TEST_CASE("global_batch_size: the same global batches at 1, 2 and 3 processes; 4 refused") {
  // global_batch_worker asks its sampler for batches of 7; global_batch_size 6 makes them
  // 6 / world per process.
  RanksOptions options;
  options.env = {{"ACCEL_GLOBAL_BATCH_SIZE", "6"}};
  std::map<int, std::vector<int>> one;
  for (int world : {1, 2, 3}) {
    CAPTURE(world);
    const auto result = run_ranks(world, "global_batch_worker", {}, options);
    INFO(describe(result));
    REQUIRE(result.exit_code() == 0);
    const auto batches = global_batches(result);
    REQUIRE(batches.size() == 3);
    for (const auto& [b, v] : batches) CHECK(v.size() == 6);
    if (world == 1)
      one = batches;
    else
      CHECK(batches == one);
  }
  const auto refused = run_ranks(4, "global_batch_worker", {}, options);
  INFO(describe(refused));
  CHECK(refused.exit_code() == 2);
  CHECK(describe(refused).find("environment variable ACCEL_GLOBAL_BATCH_SIZE: global_batch_size "
                               "6 does not divide over 4 processes") != std::string::npos);
}
