// `accel launch` and the worker group under it, with real processes: the environment each
// worker gets, rank-prefixed output, and a failing worker stopping the rest.

#include <doctest/doctest.h>

#include <chrono>

#include "tests/support/ranks.hpp"

using namespace accel;
using namespace accel::test;

namespace {

// Runs `accel launch ARGS...` as one process and captures what it prints.
launch::WorkerExit run_accel(const std::vector<std::string>& args) {
  launch::WorkerSpec spec;
  spec.argv = {bin_path("accel")};
  spec.argv.insert(spec.argv.end(), args.begin(), args.end());
  spec.label = "accel";
  launch::WorkerGroupOptions options;
  options.capture = true;
  options.echo = false;
  options.timeout = std::chrono::seconds(60);
  auto result = launch::run_worker_group({spec}, options);
  REQUIRE_FALSE(result.timed_out);
  return result.workers.at(0);
}

}  // namespace

TEST_CASE("every worker gets its own rank and the shared job environment") {
  const auto out = run_accel({"launch", "--num_processes", "4", "--main_process_port", "0", "sh",
                              "-c", "echo RANK=$RANK LOCAL_RANK=$LOCAL_RANK WORLD=$WORLD_SIZE "
                                    "STORE=$ACCEL_LAUNCHER_STORE"});
  INFO(out.output);
  CHECK(out.exit_code == 0);
  for (int r = 0; r < 4; ++r) {
    const std::string line = "[rank " + std::to_string(r) + "] RANK=" + std::to_string(r) +
                             " LOCAL_RANK=" + std::to_string(r) + " WORLD=4 STORE=1";
    CHECK(out.output.find(line) != std::string::npos);
  }
}

TEST_CASE("a failing worker stops the others and its exit code and stderr are reported") {
  const auto started = std::chrono::steady_clock::now();
  const auto out = run_accel(
      {"launch", "--num_processes", "4", "--main_process_port", "0", "sh", "-c",
       "if [ \"$RANK\" = 1 ]; then echo 'disk on fire' >&2; exit 3; fi; exec sleep 600"});
  const auto took = std::chrono::steady_clock::now() - started;
  INFO(out.output);
  CHECK(out.exit_code == 3);
  CHECK(out.output.find("rank 1 exited with code 3") != std::string::npos);
  CHECK(out.output.find("disk on fire") != std::string::npos);
  // The sleepers were stopped rather than waited for (they would take 600 s).
  CHECK(took < std::chrono::seconds(60));
}

TEST_CASE("a worker killed by a signal is reported with the signal") {
  const auto out = run_accel({"launch", "--num_processes", "2", "--main_process_port", "0", "sh",
                              "-c", "if [ \"$RANK\" = 0 ]; then kill -SEGV $$; fi; sleep 600"});
  INFO(out.output);
  CHECK(out.exit_code == 128 + 11);
  CHECK(out.output.find("rank 0 was killed by signal 11") != std::string::npos);
}

TEST_CASE("bad launcher flags exit 2 naming the flag") {
  auto out = run_accel({"launch", "--num_processes", "two", "true"});
  CHECK(out.exit_code == 2);
  CHECK(out.output.find("--num_processes expects an integer, got 'two'") != std::string::npos);
  out = run_accel({"launch", "--no_such_flag", "1", "true"});
  CHECK(out.exit_code == 2);
  CHECK(out.output.find("unknown option --no_such_flag") != std::string::npos);
}

TEST_CASE("the 2-process all-reduce demo runs under accel launch") {
  const auto out = run_accel({"launch", "--num_processes", "2", "--main_process_port", "0",
                              bin_path("allreduce_demo")});
  INFO(out.output);
  CHECK(out.exit_code == 0);
  CHECK(out.output.find("[rank 0] rank 0 of 2 (gloo): all_reduce of 1048576 floats: 3 (expected 3), 0 wrong") !=
        std::string::npos);
  CHECK(out.output.find("[rank 1] rank 1 of 2 (gloo)") != std::string::npos);
}
