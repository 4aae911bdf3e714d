// Every collective x dtype x reduce op over real processes: Gloo through our store, and MPI
// under mpirun, with 2, 3 and 4 ranks (comm_collectives_worker does the checking).

#include <doctest/doctest.h>

#include "backends/comm/registry.hpp"
#include "tests/support/ranks.hpp"
#include "tests/support/skip.hpp"

using namespace accel;
using namespace accel::test;

namespace {

void expect_all_ranks_pass(const launch::GroupResult& result, int world) {
  INFO(describe(result));
  REQUIRE(result.exit_code() == 0);
  REQUIRE_FALSE(result.timed_out);
  // Every rank reported its checks.
  int reports = 0;
  for (const auto& w : result.workers) {
    for (std::size_t pos = 0; (pos = w.output.find(" checks, 0 failed", pos)) != std::string::npos;
         ++pos)
      ++reports;
  }
  CHECK(reports == world);
}

}  // namespace

TEST_CASE("gloo collectives match the reference with 2, 3 and 4 ranks") {
  if (skip_unless(communicator_available("gloo"), "gloo communicator not built")) return;
  for (int world : {2, 3, 4}) {
    CAPTURE(world);
    expect_all_ranks_pass(run_ranks(world, "comm_collectives_worker", {"--backend", "gloo"}),
                          world);
  }
}

TEST_CASE("mpi collectives match the reference with 2, 3 and 4 ranks") {
  if (skip_unless(communicator_available("mpi"), "mpi communicator not built (no libopenmpi-dev)"))
    return;
  if (skip_unless(!find_mpirun().empty(), "mpirun not found (openmpi-bin not installed)")) return;
  for (int world : {2, 3, 4}) {
    CAPTURE(world);
    // All output comes through mpirun, one worker; count the rank reports in it.
    const auto result = run_under_mpirun(world, "comm_collectives_worker", {"--backend", "mpi"});
    INFO(describe(result));
    REQUIRE(result.exit_code() == 0);
    int reports = 0;
    const std::string& out = result.workers.at(0).output;
    for (std::size_t pos = 0; (pos = out.find(" checks, 0 failed", pos)) != std::string::npos;
         ++pos)
      ++reports;
    CHECK(reports == world);
  }
}

TEST_CASE("the world of one runs the same collectives") {
  expect_all_ranks_pass(run_ranks(1, "comm_collectives_worker", {"--backend", "local"}), 1);
}
