// The Accelerator's raw API over real processes (accelerator_worker does the checking):
// DDP training equal to one process with accumulation and clipping, gather_for_metrics,
// set_seed, split_between_processes; over Gloo with 1, 2 and 4 ranks and over MPI.

#include <doctest/doctest.h>

#include "backends/comm/registry.hpp"
#include "tests/support/ranks.hpp"
#include "tests/support/skip.hpp"

using namespace accel;
using namespace accel::test;

namespace {

void expect_pass(const launch::GroupResult& result, const std::string& strategy = "") {
  INFO(describe(result));
  REQUIRE(result.exit_code() == 0);
  std::string all;
  for (const auto& w : result.workers) all += w.output;
  CHECK(all.find("FAIL") == std::string::npos);
  CHECK(all.find("ok training equals one process") != std::string::npos);
  if (!strategy.empty()) CHECK(all.find(", " + strategy + ")") != std::string::npos);
  CHECK(all.find("ok gather_for_metrics yields 103 samples, 103 distinct") != std::string::npos);
}

}  // namespace

TEST_CASE("the raw API over gloo equals one process, with accumulation and clipping") {
  if (skip_unless(communicator_available("gloo"), "gloo communicator not built")) return;
  for (int world : {1, 2, 4}) {
    CAPTURE(world);
    expect_pass(run_ranks(world, "accelerator_worker", {"--accumulation", "1"}));
    expect_pass(run_ranks(world, "accelerator_worker", {"--accumulation", "4", "--clip", "0.5"}));
  }
}

TEST_CASE("the raw API over mpi equals one process") {
  if (skip_unless(communicator_available("mpi") && !find_mpirun().empty(),
                  "mpi communicator or mpirun not available"))
    return;
  RanksOptions options;
  options.env = {{"ACCEL_COMM_BACKEND", "mpi"}};
  expect_pass(
      run_under_mpirun(2, "accelerator_worker", {"--accumulation", "4", "--clip", "0.5"}, options));
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
          std::string("zero") + stage);
    }
}
