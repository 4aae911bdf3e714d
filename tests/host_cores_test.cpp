// foundation/host_cores: how many ranks the launcher put on this host, and whether a communicator's
// worker thread has a core to run on beside the caller.

#include <doctest/doctest.h>
#include <stdlib.h>

#include <initializer_list>

#include "foundation/host_cores.hpp"

namespace accel {
namespace {

constexpr const char* kLauncherVariables[] = {"LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE",
                                              "MPI_LOCALNRANKS"};

void clear_launcher_variables() {
  for (const char* name : kLauncherVariables) unsetenv(name);
}

TEST_CASE("ranks_on_this_host: torchrun's name first, then Open MPI's, then Hydra's") {
  clear_launcher_variables();
  CHECK(ranks_on_this_host() == 0);
  setenv("MPI_LOCALNRANKS", "6", 1);
  CHECK(ranks_on_this_host() == 6);
  setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "5", 1);
  CHECK(ranks_on_this_host() == 5);
  setenv("LOCAL_WORLD_SIZE", "3", 1);
  CHECK(ranks_on_this_host() == 3);
  // An empty value is skipped; one that is not a positive number means "not known".
  setenv("LOCAL_WORLD_SIZE", "", 1);
  CHECK(ranks_on_this_host() == 5);
  for (const char* bad : {"x", "2x", "0", "-2"}) {
    CAPTURE(bad);
    setenv("LOCAL_WORLD_SIZE", bad, 1);
    CHECK(ranks_on_this_host() == 0);
  }
  clear_launcher_variables();
}

TEST_CASE("worker_can_overlap: only with a core beyond one per rank, and two to use") {
  // (ranks on the host, online cores, cores this process may use)
  CHECK_FALSE(worker_can_overlap(2, 2, 2));  // as many ranks as cores: the 2-core VM at world 2
  CHECK_FALSE(worker_can_overlap(4, 2, 2));  // oversubscribed
  CHECK_FALSE(worker_can_overlap(1, 8, 1));  // bound to one core (mpirun --bind-to core)
  CHECK_FALSE(worker_can_overlap(0, 1, 1));  // one core, whatever the launcher says
  CHECK(worker_can_overlap(1, 2, 2));
  CHECK(worker_can_overlap(2, 3, 3));
  CHECK(worker_can_overlap(8, 64, 64));
  CHECK(worker_can_overlap(0, 2, 2));  // not known: as before, the worker
}

TEST_CASE("the cores this process may use are online ones") {
  CHECK(usable_cores() >= 1);
  CHECK(usable_cores() <= online_cores());
}

}  // namespace
}  // namespace accel
