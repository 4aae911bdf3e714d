// DDP equivalence over real processes: N ranks each training on their slice of every global
// batch end with the parameters one process gets on the whole batches (fp32, within the
// first-order bound of tests/support/tolerance.hpp that ddp_worker checks), over Gloo, MPI
// and shared memory, with 2 to 4 ranks, with and without gradient accumulation.

#include <doctest/doctest.h>

#include "backends/comm/registry.hpp"
#include "tests/support/ranks.hpp"
#include "tests/support/skip.hpp"

using namespace accel;
using namespace accel::test;

TEST_CASE("DDP over gloo equals one process on the global batch") {
  if (skip_unless(communicator_available("gloo"), "gloo communicator not built")) return;
  for (int world : {2, 4})
    for (const char* accumulation : {"1", "4"}) {
      CAPTURE(world);
      CAPTURE(accumulation);
      const auto result =
          run_ranks(world, "ddp_worker", {"--backend", "gloo", "--accumulation", accumulation});
      INFO(describe(result));
      REQUIRE(result.exit_code() == 0);
      CHECK(count_in_output(result, "max |ddp - single|") == world);
    }
}

TEST_CASE("DDP over mpi equals one process on the global batch") {
  if (skip_unless(communicator_available("mpi") && !find_mpirun().empty(),
                  "mpi communicator or mpirun not available"))
    return;
  for (int world : {2, 4})
    for (const char* accumulation : {"1", "4"}) {
      CAPTURE(world);
      CAPTURE(accumulation);
      const auto result = run_under_mpirun(world, "ddp_worker",
                                           {"--backend", "mpi", "--accumulation", accumulation});
      INFO(describe(result));
      REQUIRE(result.exit_code() == 0);
      CHECK(count_in_output(result, "max |ddp - single|") == world);
    }
}

TEST_CASE("DDP over shm equals one process; its buckets live in symmetric shared memory") {
  if (skip_unless(communicator_available("shm"), "shm communicator not built")) return;
  // 20K parameters in buckets of up to 64 KiB: past the 32 KiB of shm's small all-reduce,
  // so the in-place all-reduce on symmetric memory does the work.
  for (int world : {2, 3})
    for (const char* accumulation : {"1", "4"}) {
      CAPTURE(world);
      CAPTURE(accumulation);
      const auto result = run_ranks(world, "ddp_worker",
                                    {"--backend", "shm", "--accumulation", accumulation, "--hidden",
                                     "256", "--bucket_cap_bytes", "65536"});
      INFO(describe(result));
      REQUIRE(result.exit_code() == 0);
      CHECK(count_in_output(result, "buckets in shared memory, max |ddp - single|") == world);
    }
}

TEST_CASE("DDP in a world of one is the same code path and the same result") {
  const auto result = run_ranks(1, "ddp_worker", {"--backend", "local", "--accumulation", "4"});
  INFO(describe(result));
  REQUIRE(result.exit_code() == 0);
  CHECK(count_in_output(result, "max |ddp - single|") == 1);
}
