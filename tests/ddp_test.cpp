// DDP equivalence over real processes: N ranks each training on their slice of every global
// batch end with the parameters one process gets on the whole batches (fp32, within the
// first-order bound of tests/support/tolerance.hpp that ddp_worker checks), over Gloo, MPI
// and shared memory, with 2 to 4 ranks, with and without gradient accumulation.

#include <doctest/doctest.h>

#include "backends/comm/registry.hpp"
#include "tests/support/ranks.hpp"
#include "tests/support/skip.hpp"
#include "tests/support/verdicts.hpp"

using namespace accel;
using namespace accel::test;

namespace {

// Both of ddp_worker's verdicts passed on every rank.
void check_ddp_equal(const launch::GroupResult& result, int world) {
  const Verdicts verdicts(result);
  CHECK_VERDICT(verdicts, "ddp equals one process", world);
  CHECK_VERDICT(verdicts, "an unused parameter's gradient is averaged", world);
}

// How many ranks had their buckets in shared memory (the detail of ddp_worker's verdict).
int ranks_with_buckets_in_shm(const launch::GroupResult& result, int world) {
  const Verdicts verdicts(result);
  int n = 0;
  for (int r = 0; r < world; ++r)
    n += verdicts.detail("ddp equals one process", r).find("in shared memory") != std::string::npos;
  return n;
}

}  // namespace

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
      check_ddp_equal(result, world);
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
      check_ddp_equal(result, world);
    }
}

TEST_CASE("DDP over shm equals one process; its buckets in symmetric memory, the in-place path") {
  if (skip_unless(communicator_available("shm"), "shm communicator not built")) return;
  // ACCEL_SHM_SYMMETRIC=1 turns the symmetric memory on (off by default).
  // 20K parameters in buckets of up to 64 KiB: past the 32 KiB of shm's small all-reduce,
  // so the in-place all-reduce on symmetric memory does the work.
  for (int world : {2, 3})
    for (const char* accumulation : {"1", "4"}) {
      CAPTURE(world);
      CAPTURE(accumulation);
      const auto result = run_ranks(world, "ddp_worker",
                                    {"--backend", "shm", "--accumulation", accumulation, "--hidden",
                                     "256", "--bucket_cap_bytes", "65536"},
                                    RanksOptions{.env = {{"ACCEL_SHM_SYMMETRIC", "1"}}});
      INFO(describe(result));
      REQUIRE(result.exit_code() == 0);
      check_ddp_equal(result, world);
      CHECK(ranks_with_buckets_in_shm(result, world) == world);
    }
  // By default the buckets stay in each rank's own memory (the staged all-reduce).
  const auto staged = run_ranks(
      2, "ddp_worker", {"--backend", "shm", "--hidden", "256", "--bucket_cap_bytes", "65536"});
  INFO(describe(staged));
  REQUIRE(staged.exit_code() == 0);
  check_ddp_equal(staged, 2);
  CHECK(ranks_with_buckets_in_shm(staged, 2) == 0);
}

TEST_CASE("DDP over shm with no room in /dev/shm for its buckets: told once, staged, still equal") {
  if (skip_unless(communicator_available("shm"), "shm communicator not built")) return;
  if (skip_unless(can_make_mount_namespace(), "cannot make a mount namespace (unshare --mount)"))
    return;
  // A 12 MiB /dev/shm of its own: room for the communicator's segment (6 MiB), none for 2 x
  // 5.3 MB of buckets (a hidden layer of 16384). ACCEL_SHM_SYMMETRIC=1 asks for them there.
  const auto result = run_with_dev_shm_of(
      "12m", 2, "ddp_worker",
      {"--backend", "shm", "--hidden", "16384", "--bucket_cap_bytes", "1048576", "--steps", "5"},
      RanksOptions{.env = {{"ACCEL_SHM_SYMMETRIC", "1"}}});
  INFO(describe(result));
  REQUIRE(result.exit_code() == 0);
  CHECK(count_in_output(result, "note: shm: /dev/shm has no room for") == 1);
  check_ddp_equal(result, 2);
  CHECK(ranks_with_buckets_in_shm(result, 2) == 0);
}

TEST_CASE("DDP in a world of one is the same code path and the same result") {
  const auto result = run_ranks(1, "ddp_worker", {"--backend", "local", "--accumulation", "4"});
  INFO(describe(result));
  REQUIRE(result.exit_code() == 0);
  check_ddp_equal(result, 1);
}
