// Every collective x dtype x reduce op over real processes: Gloo through our store, MPI under
// mpirun, shared memory, and the hierarchical composite with one machine posing as two hosts,
// with 2, 3 and 4 ranks (comm_collectives_worker does the checking). Shared memory also: a rank
// killed mid-collective is named by the others, and nothing is left in /dev/shm.

#include <doctest/doctest.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <set>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>

#include "backends/comm/registry.hpp"
#include "foundation/host_cores.hpp"
#include "tests/support/ranks.hpp"
#include "tests/support/shm_segments.hpp"
#include "tests/support/skip.hpp"
#include "tests/support/verdicts.hpp"

using namespace accel;
using namespace accel::test;

namespace {

void expect_all_ranks_pass(const launch::GroupResult& result, int world) {
  INFO(describe(result));
  REQUIRE(result.exit_code() == 0);
  REQUIRE_FALSE(result.timed_out);
  // Every rank reported its checks.
  CHECK_VERDICT(Verdicts(result), "every collective's result is the reference's", world);
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
    CHECK_VERDICT(Verdicts(result), "every collective's result is the reference's", world);
  }
}

TEST_CASE("hierarchical: an unknown ACCEL_HIERARCHICAL_BETWEEN_HOSTS is refused, naming it") {
  if (skip_unless(communicator_available("hierarchical"), "hierarchical communicator not built"))
    return;
  RanksOptions options;
  options.env = {{"ACCEL_HIERARCHICAL_BETWEEN_HOSTS", "tcp"}};
  const auto result = run_ranks(2, "comm_collectives_worker",
                                {"--backend", "hierarchical", "--fake_hosts", "2"}, options);
  INFO(describe(result));
  CHECK(result.exit_code() == 2);
  // Whichever rank refuses first ends the group, which stops the other before it may have
  // printed anything (rank 0 was stopped that way once): look at every rank's output.
  CHECK(count_in_output(result,
                        "ACCEL_HIERARCHICAL_BETWEEN_HOSTS is 'tcp'; expected gloo or mpi") >= 1);
}

TEST_CASE("hierarchical under mpirun: MPI between 2 fake hosts, with 3 and 4 ranks") {
  if (skip_unless(communicator_available("mpi") && communicator_available("hierarchical"),
                  "mpi or hierarchical communicator not built"))
    return;
  if (skip_unless(!find_mpirun().empty(), "mpirun not found (openmpi-bin not installed)")) return;
  // 4 ranks: hosts of 2 and 2, so reduce_scatter and all_gather take the rails (MPI groups of
  // one rank per host); 3 ranks: hosts of 2 and 1, the leaders' paths.
  for (int world : {3, 4}) {
    CAPTURE(world);
    const auto result = run_under_mpirun(world, "comm_collectives_worker",
                                         {"--backend", "hierarchical", "--fake_hosts", "2"});
    INFO(describe(result));
    REQUIRE(result.exit_code() == 0);
    CHECK_VERDICT(Verdicts(result), "every collective's result is the reference's", world);
    CHECK(count_in_output(result, "between hosts: mpi") == world);
  }
  // ACCEL_HIERARCHICAL_BETWEEN_HOSTS chooses Gloo under mpirun too.
  RanksOptions gloo;
  gloo.env = {{"ACCEL_HIERARCHICAL_BETWEEN_HOSTS", "gloo"}};
  const auto result = run_under_mpirun(4, "comm_collectives_worker",
                                       {"--backend", "hierarchical", "--fake_hosts", "2"}, gloo);
  INFO(describe(result));
  CHECK(result.exit_code() == 0);
  CHECK(result.workers.at(0).output.find("between hosts: gloo") != std::string::npos);
  CHECK(result.workers.at(0).output.find("between hosts: mpi") == std::string::npos);
}

TEST_CASE("mpi: a bad tuning variable is refused at the join, naming it") {
  if (skip_unless(communicator_available("mpi"), "mpi communicator not built (no libopenmpi-dev)"))
    return;
  if (skip_unless(!find_mpirun().empty(), "mpirun not found (openmpi-bin not installed)")) return;
  for (const char* name : {"ACCEL_MPI_SPIN_US", "ACCEL_MPI_INLINE_BYTES"}) {
    CAPTURE(name);
    RanksOptions options;
    options.env = {{name, "50us"}};
    const auto result =
        run_under_mpirun(2, "comm_collectives_worker", {"--backend", "mpi"}, options);
    INFO(describe(result));
    CHECK(result.exit_code() != 0);
    CHECK(result.workers.at(0).output.find(std::string(name) + "='50us' is not a whole number") !=
          std::string::npos);
  }
}

TEST_CASE("mpi: above 4 MiB an operation runs on the caller's thread where no core is spare") {
  if (skip_unless(communicator_available("mpi"), "mpi communicator not built (no libopenmpi-dev)"))
    return;
  if (skip_unless(!find_mpirun().empty(), "mpirun not found (openmpi-bin not installed)")) return;
  // LOCAL_WORLD_SIZE (read before Open MPI's own count) poses as 1 rank on this host, then as
  // one rank per core: with a core to spare the 8 MiB all_reduce goes to the worker thread,
  // without one it runs inline. A 4 KiB one runs inline either way.
  const std::string eight_mib = std::to_string(8u << 20);
  for (const int ranks_here : {1, online_cores()}) {
    CAPTURE(ranks_here);
    const bool overlap = worker_can_overlap(ranks_here, online_cores(), usable_cores());
    RanksOptions options;
    options.env = {{"LOCAL_WORLD_SIZE", std::to_string(ranks_here)}};
    for (const std::string& bytes : {eight_mib, std::string("4096")}) {
      CAPTURE(bytes);
      const auto result = run_under_mpirun(2, "comm_collectives_worker",
                                           {"--backend", "mpi", "--where_runs", bytes}, options);
      INFO(describe(result));
      CHECK(result.exit_code() == 0);
      const bool queued = overlap && bytes == eight_mib;
      CHECK(count_in_output(result, bytes + " bytes ran " + (queued ? "queued" : "inline") +
                                        "; worker can overlap: " + (overlap ? "yes" : "no")) == 2);
    }
  }
}

TEST_CASE("gloo and shm: a bad tuning variable is refused at the join, naming it") {
  struct Knob {
    const char *backend, *name, *value, *says;
  };
  for (const Knob& k :
       {Knob{"gloo", "ACCEL_GLOO_INLINE_BYTES", "-1", "is not a whole number"},
        Knob{"gloo", "ACCEL_GLOO_LOOP_BATCH", "2", "is not a whole number from 0 to 1"},
        Knob{"shm", "ACCEL_SHM_SYMMETRIC", "yes", "is not a whole number from 0 to 1"},
        Knob{"shm", "ACCEL_SHM_INLINE_BYTES", "-1", "is not a whole number"},
        Knob{"shm", "ACCEL_SHM_SPIN_US", "0", "is not a whole number of at least 1"}}) {
    CAPTURE(k.name);
    if (skip_unless(communicator_available(k.backend), "communicator not built")) continue;
    RanksOptions options;
    options.env = {{k.name, k.value}};
    const auto result = run_ranks(2, "comm_collectives_worker", {"--backend", k.backend}, options);
    INFO(describe(result));
    CHECK(result.exit_code() == 2);
    CHECK(count_in_output(result, std::string(k.name) + "='" + k.value + "' " + k.says) >= 1);
  }
}

TEST_CASE("mpi: a rank that never enters an all_reduce is named by the others' watchdogs") {
  if (skip_unless(communicator_available("mpi"), "mpi communicator not built (no libopenmpi-dev)"))
    return;
  if (skip_unless(!find_mpirun().empty(), "mpirun not found (openmpi-bin not installed)")) return;
  // A 4 KiB all_reduce runs MPI's blocking MPI_Allreduce on the caller's thread, which cannot be
  // abandoned: each rank in it ends, after the timeout (2 s here), with the watchdog's line and
  // exit code 124, naming the rank that never came and not the ones blocked beside it.
  for (int world : {2, 3}) {
    CAPTURE(world);
    const int absent = world - 1;
    const auto started = std::chrono::steady_clock::now();
    const auto result =
        run_under_mpirun(world, "comm_collectives_worker",
                         {"--backend", "mpi", "--absent_rank", std::to_string(absent)});
    INFO(describe(result));
    REQUIRE_FALSE(result.timed_out);
    CHECK(result.exit_code() == 124);
    // Every rank that reports names the absent one alone (all blocked ranks may report before
    // mpirun ends the job: each keeps answering its peers for a second first).
    const std::string named =
        "all_reduce(sum, 1024 x f32) #2 timed out after 2000 ms; ranks not "
        "heard from: [" +
        std::to_string(absent) + "] (in MPI_Allreduce";
    CHECK(count_in_output(result, named) >= 1);
    CHECK(count_in_output(result, "ranks not heard from: [") == count_in_output(result, named));
    CHECK(count_in_output(result, "rank " + std::to_string(absent) +
                                      " is outside any collective, after 1 of them") >= 1);
    CHECK(count_in_output(result, "this process ends with exit code 124") >= 1);
    // The worker's own catch never ran: the collective did not return.
    CHECK(count_in_output(result, "timeout error: ") == 0);
    MESSAGE("ended after "
            << std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count()
            << " s");
  }
}

TEST_CASE("mpi: a collective waiting for its peers holds up no other communicator's") {
  if (skip_unless(communicator_available("mpi"), "mpi communicator not built (no libopenmpi-dev)"))
    return;
  if (skip_unless(!find_mpirun().empty(), "mpirun not found (openmpi-bin not installed)")) return;
  // Two communicators driven by two threads in opposite orders on even and odd ranks: with a
  // process-wide lock held across MPI's blocking collectives each rank would wait for the
  // other inside a different communicator, until the watchdog ended the job.
  for (int world : {2, 3}) {
    CAPTURE(world);
    const auto result = run_under_mpirun(world, "comm_collectives_worker",
                                         {"--backend", "mpi", "--two_communicators"});
    INFO(describe(result));
    REQUIRE_FALSE(result.timed_out);
    CHECK(result.exit_code() == 0);
    CHECK(count_in_output(result, "two communicators: ok") == world);
  }
}

TEST_CASE("mpi: a collective after the application's MPI_Finalize is refused, naming why") {
  if (skip_unless(communicator_available("mpi"), "mpi communicator not built (no libopenmpi-dev)"))
    return;
  if (skip_unless(!find_mpirun().empty(), "mpirun not found (openmpi-bin not installed)")) return;
  // The collectives notice finalisation through a delete callback on MPI_COMM_SELF, which
  // MPI_Finalize runs first; the watchdogs stop calling MPI there too, so the ranks exit 0.
  const auto result =
      run_under_mpirun(2, "comm_collectives_worker", {"--backend", "mpi", "--finalize_first"});
  INFO(describe(result));
  REQUIRE_FALSE(result.timed_out);
  CHECK(result.exit_code() == 0);
  CHECK(count_in_output(result, "after MPI_Finalize: ") == 2);
  CHECK(count_in_output(result, "MPI has already been finalised in this process") == 2);
}

TEST_CASE("the world of one runs the same collectives") {
  expect_all_ranks_pass(run_ranks(1, "comm_collectives_worker", {"--backend", "local"}), 1);
}

TEST_CASE("shm collectives match the reference with 2, 3 and 4 ranks; nothing left in /dev/shm") {
  if (skip_unless(communicator_available("shm"), "shm communicator not built")) return;
  const auto before = leaked_shm_segments();
  for (int world : {2, 3, 4}) {
    CAPTURE(world);
    RanksOptions options;
    options.env = {{"ACCEL_SHM_SYMMETRIC", "1"}};  // check_symmetric too (off by default)
    const auto result = run_ranks(world, "comm_collectives_worker", {"--backend", "shm"}, options);
    expect_all_ranks_pass(result, world);
    CHECK(result.workers.at(0).output.find("(shm)") != std::string::npos);
  }
  CHECK(new_shm_leaks(before).empty());
}

TEST_CASE(
    "shm: an all_reduce of symmetric memory at one rank and private at another fails at all") {
  if (skip_unless(communicator_available("shm"), "shm communicator not built")) return;
  for (int world : {2, 3}) {
    CAPTURE(world);
    // Every rank must say it: the first to fail must not end the others first (at world 3 on
    // 2 cores, rank 0 was once stopped before it had run far enough to say it).
    const auto result =
        run_ranks(world, "comm_collectives_worker", {"--backend", "shm", "--symmetric_mismatch"},
                  RanksOptions{.env = {{"ACCEL_SHM_SYMMETRIC", "1"}}, .stop_on_failure = false});
    INFO(describe(result));
    REQUIRE_FALSE(result.timed_out);
    CHECK(result.exit_code() == 3);
    CHECK(count_in_output(result, "mismatch error:") == world);
    CHECK(count_in_output(result, "on symmetric memory #0 at offset 0 at rank 0") == world);
    CHECK(count_in_output(result, "its own memory at rank") == world);
  }
}

TEST_CASE("shm: a /dev/shm too small for the group's segment is an error at every rank") {
  if (skip_unless(communicator_available("shm"), "shm communicator not built")) return;
  if (skip_unless(can_make_mount_namespace(), "cannot make a mount namespace (unshare --mount)"))
    return;
  // The group's segment needs 6 MiB at world 2; before posix_fallocate, the first touch past
  // the tmpfs's 4 MiB killed rank 0 with SIGBUS.
  const auto result = run_with_dev_shm_of("4m", 2, "comm_collectives_worker", {"--backend", "shm"});
  INFO(describe(result));
  REQUIRE_FALSE(result.timed_out);
  CHECK(result.exit_code() == 2);  // the worker's exit for an error it caught
  CHECK(count_in_output(result, "/dev/shm has no room for 6 MiB") >= 1);
  CHECK(count_in_output(result, "docker run --shm-size") >= 1);
}

TEST_CASE("auto picks shm when every rank is on this host") {
  if (skip_unless(communicator_available("shm"), "shm communicator not built")) return;
  const auto result = run_ranks(2, "comm_collectives_worker", {"--backend", "auto"});
  expect_all_ranks_pass(result, 2);
  CHECK(result.workers.at(0).output.find("(shm)") != std::string::npos);
}

TEST_CASE(
    "hierarchical collectives (shm inside, gloo between) with 3 and 4 ranks on 2 fake hosts") {
  if (skip_unless(communicator_available("hierarchical") && communicator_available("gloo"),
                  "hierarchical communicator not built"))
    return;
  const auto before = leaked_shm_segments();
  for (int world : {3, 4}) {
    CAPTURE(world);
    const auto result = run_ranks(world, "comm_collectives_worker",
                                  {"--backend", "hierarchical", "--fake_hosts", "2"});
    expect_all_ranks_pass(result, world);
    CHECK(result.workers.at(0).output.find("(hierarchical)") != std::string::npos);
    // Not an MPI world: Gloo between hosts.
    CHECK(result.workers.at(0).output.find("between hosts: gloo") != std::string::npos);
  }
  // Hosts numbering their ranks in blocks (as `accel launch` does), runs of round robin and
  // blocks, and a numbering that fits neither (the leaders' paths).
  for (const std::string host_of : {"0,0,1,1", "0,1,0,1,2,2", "0,1,1,0"}) {
    CAPTURE(host_of);
    const int world = int(host_of.size() + 1) / 2;
    const auto result = run_ranks(world, "comm_collectives_worker",
                                  {"--backend", "hierarchical", "--fake_host_of", host_of});
    expect_all_ranks_pass(result, world);
    CHECK(count_in_output(result, "no rails") == (host_of == "0,1,1,0" ? world : 0));
  }
  // "auto" across hosts is the hierarchical one.
  const auto result =
      run_ranks(4, "comm_collectives_worker", {"--backend", "auto", "--fake_hosts", "2"});
  expect_all_ranks_pass(result, 4);
  CHECK(result.workers.at(0).output.find("(hierarchical)") != std::string::npos);
  CHECK(new_shm_leaks(before).empty());
}

TEST_CASE("shm: a rank killed mid-collective is named by the others, who fail fast") {
  if (skip_unless(communicator_available("shm"), "shm communicator not built")) return;
  const auto before = leaked_shm_segments();
  for (int world : {2, 3, 4}) {
    CAPTURE(world);
    const int victim = world - 1;
    RanksOptions options;
    options.stop_on_failure = false;  // let the survivors report
    // The collective timeout is far beyond the job's limit: only noticing the death can pass.
    options.env = {{"ACCEL_COMM_TIMEOUT", "600"}};
    options.timeout = std::chrono::seconds(60);
    const auto result =
        run_ranks(world, "comm_collectives_worker",
                  {"--backend", "shm", "--kill_rank", std::to_string(victim)}, options);
    INFO(describe(result));
    REQUIRE_FALSE(result.timed_out);
    for (int r = 0; r < world; ++r) {
      const auto& w = result.workers.at(r);
      if (r == victim) {
        CHECK(w.signal == SIGKILL);
        continue;
      }
      CHECK(w.exit_code == 3);
      CHECK(w.output.find("survivor error: rank " + std::to_string(r) + ": ") != std::string::npos);
      CHECK(w.output.find("rank " + std::to_string(victim) + " (pid ") != std::string::npos);
      CHECK(w.output.find(") exited while this rank waited") != std::string::npos);
    }
  }
  CHECK(new_shm_leaks(before).empty());
}

TEST_CASE("shm: a segment left by a killed job neither confuses nor outlives a new one") {
  if (skip_unless(communicator_available("shm"), "shm communicator not built")) return;
  // A pid that surely no longer runs: a child that has exited and been reaped.
  const pid_t child = fork();
  if (child == 0) _exit(0);
  REQUIRE(child > 0);
  waitpid(child, nullptr, 0);
  // What a creator killed between creating and unlinking leaves: its name, garbage inside.
  struct stat ns {};
  REQUIRE(stat("/proc/self/ns/pid", &ns) == 0);
  const std::string stale =
      "accel-shm-" + std::to_string(ns.st_ino) + "-" + std::to_string(child) + "-00000000deadbeef";
  const int fd = shm_open(("/" + stale).c_str(), O_CREAT | O_RDWR, 0600);
  REQUIRE(fd >= 0);
  REQUIRE(ftruncate(fd, 1 << 20) == 0);
  void* p = mmap(nullptr, 1 << 20, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  REQUIRE(p != MAP_FAILED);
  std::memset(p, 0x5a, 1 << 20);
  munmap(p, 1 << 20);
  close(fd);
  REQUIRE(shm_segments().contains(stale));

  expect_all_ranks_pass(run_ranks(2, "comm_collectives_worker", {"--backend", "shm"}), 2);
  CHECK_FALSE(shm_segments().contains(stale));  // the new job's rank 0 swept it
  shm_unlink(("/" + stale).c_str());
}
