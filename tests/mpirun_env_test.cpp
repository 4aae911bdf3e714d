// Workers started by MPI instead of our launcher: a program run with plain `mpirun -np 2`
// finds its rank and world in OMPI_COMM_WORLD_*, and `accel launch --use_mpi` starts the
// workers through mpirun with our settings passed along.

#include <doctest/doctest.h>

#include "tests/support/ranks.hpp"
#include "tests/support/skip.hpp"

using namespace accel;
using namespace accel::test;

namespace {

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

}  // namespace

TEST_CASE("a program started by plain mpirun -np 2 gets the right rank and world") {
  if (skip_unless(!find_mpirun().empty(), "mpirun not found (openmpi-bin not installed)")) return;
  // No launcher variables may leak in from whoever runs the tests.
  RanksOptions options;
  const auto result = run_under_mpirun(2, "print_process_env", {}, options);
  INFO(describe(result));
  REQUIRE(result.exit_code() == 0);
  const std::string& out = result.workers.at(0).output;
  CHECK(contains(out,
                 "rank=0 world=2 local_rank=0 local_world=2 node=0 source=OMPI launcher_store=0"));
  CHECK(contains(out,
                 "rank=1 world=2 local_rank=1 local_world=2 node=0 source=OMPI launcher_store=0"));
}

TEST_CASE("accel launch --use_mpi starts the workers through mpirun with the launcher's settings") {
  if (skip_unless(!find_mpirun().empty(), "mpirun not found (openmpi-bin not installed)")) return;
  // Ranks and the config come only from the launcher (run_accel clears the outer ones).
  const auto result =
      run_accel({"launch", "--use_mpi", "--num_processes", "2", "--main_process_port", "0",
                 "--multi_cpu", bin_path("print_process_env")});
  const std::string& out = result.workers.at(0).output;
  INFO(out);
  REQUIRE_FALSE(result.timed_out);
  CHECK(result.exit_code() == 0);
  // Ranks from mpirun, the store from our launcher (-x passed it on).
  CHECK(contains(out,
                 "rank=0 world=2 local_rank=0 local_world=2 node=0 source=OMPI launcher_store=1"));
  CHECK(contains(out,
                 "rank=1 world=2 local_rank=1 local_world=2 node=0 source=OMPI launcher_store=1"));
  CHECK(contains(out, "started by mpirun"));
}

TEST_CASE("under --use_mpi, Gloo workers rendezvous through the launcher's store") {
  if (skip_unless(!find_mpirun().empty(), "mpirun not found (openmpi-bin not installed)")) return;
  const auto result = run_accel({"test", "--use_mpi", "--num_processes", "2", "--main_process_port",
                                 "0", "--multi_cpu", "--cpu_communicator", "gloo"});
  const std::string& out = result.workers.at(0).output;
  INFO(out);
  REQUIRE_FALSE(result.timed_out);
  CHECK(result.exit_code() == 0);
  CHECK(contains(out, "2 process(es), communicator gloo"));
  CHECK(contains(out, "all checks passed"));
}
