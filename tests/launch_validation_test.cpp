// Input `accel launch` and `accel config` must refuse before anything starts: config files
// that are not regular files or are too big, flags that contradict each other or the
// machine, the mpi communicator without mpirun, more workers than descriptors allow. Each is
// run as a real `accel` process; each refusal exits 2 naming the file, flag or key, and
// starts no worker.

#include <doctest/doctest.h>
#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <string>

#include "backends/comm/registry.hpp"
#include "tests/support/files.hpp"
#include "tests/support/ranks.hpp"
#include "tests/support/skip.hpp"

using namespace accel;
using namespace accel::test;

namespace {

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

struct Outcome {
  int exit_code = -1;
  std::string output;
};

// `accel ARGS...` in a clean environment; a refusal comes at once, so a short timeout only
// keeps a regression (a blocked read) from hanging the suite.
Outcome run_accel_command(const std::vector<std::string>& args,
                          const std::vector<std::pair<std::string, std::string>>& env = {},
                          const std::string& shell_prefix = "") {
  const auto result = run_accel(args, env, std::chrono::seconds(30), shell_prefix);
  INFO(describe(result));
  REQUIRE_FALSE(result.timed_out);
  return {result.workers.at(0).exit_code, result.workers.at(0).output};
}

// The program every refused launch names: it would print this line had it been started.
const std::vector<std::string> kProgram = {"sh", "-c", "echo worker-started"};

std::vector<std::string> launch_args(std::vector<std::string> flags) {
  flags.insert(flags.begin(), "launch");
  flags.insert(flags.end(), kProgram.begin(), kProgram.end());
  return flags;
}

// Exit 2 with every part in the message, and no worker started.
void check_refused(const Outcome& out, const std::vector<std::string>& parts) {
  INFO(out.output);
  CHECK(out.exit_code == 2);
  for (const auto& part : parts) CHECK(contains(out.output, part));
  CHECK_FALSE(contains(out.output, "worker-started"));
  CHECK_FALSE(contains(out.output, "terminate called"));
}

}  // namespace

TEST_CASE("a config that is not a regular file, or is too big, is refused naming it") {
  TempDir dir("validation");
  const std::string fifo = dir / "config.fifo";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  // Nobody writes to the FIFO: reading it would block forever.
  check_refused(run_accel_command({"config", "validate", fifo}),
                {fifo, "a FIFO", "not a regular file"});
  check_refused(run_accel_command(launch_args({"--config_file", fifo})), {fifo, "a FIFO"});
  check_refused(run_accel_command(launch_args({}), {{"ACCEL_CONFIG_FILE", fifo}}),
                {fifo, "a FIFO"});
  // Endless: reading it all would exhaust memory.
  check_refused(run_accel_command({"config", "validate", "/dev/zero"}),
                {"/dev/zero", "a character device", "not a regular file"});
  check_refused(run_accel_command({"config", "show", "--config_file", dir.path.string()}),
                {dir.path.string(), "a directory"});
  // A regular file, but no config: a 50 MB main_process_ip.
  const std::string big = dir / "big.yaml";
  write_file(big, "main_process_ip: " + std::string(50 << 20, 'a') + "\n");
  check_refused(run_accel_command({"config", "validate", big}), {big, "larger than 1 MiB"});
  check_refused(run_accel_command(launch_args({"--config_file", big})), {big, "larger than 1 MiB"});
}

TEST_CASE("launcher flags that cannot work are refused before any worker starts") {
  // --monitor_interval 0 would poll in a loop.
  check_refused(run_accel_command(launch_args({"--monitor_interval", "0"})),
                {"--monitor_interval", "at least 0.01 seconds", "got 0"});
  check_refused(run_accel_command(launch_args({"--monitor_interval=0.001"})),
                {"--monitor_interval"});
  check_refused(run_accel_command(launch_args({"--rdzv_timeout", "1e300"})),
                {"--rdzv_timeout", "at most 1000000 seconds"});
  // Two process counts that disagree: neither silently wins.
  check_refused(run_accel_command(
                    launch_args({"--nproc_per_node", "3", "--num_processes", "2", "--multi_cpu"})),
                {"--nproc_per_node 3", "--num_processes 2", "contradicts"});
  // A process count no machine runs, from a flag as from a file (config_test).
  check_refused(run_accel_command(launch_args({"--num_processes", "100000", "--multi_cpu"})),
                {"command line --num_processes", "100000 processes on one machine",
                 "at most 1024 run on one machine"});
  // A host name of 100000 characters (the most one argument may be is 128 KiB).
  check_refused(run_accel_command(launch_args({"--main_process_ip", std::string(100000, 'a')})),
                {"command line --main_process_ip", "expects a host name or IP address",
                 "(100000 characters)"});
  // GPUs asked for where none is visible (CUDA_VISIBLE_DEVICES="" hides any there is).
  check_refused(run_accel_command(launch_args({"--multi_gpu", "--num_processes", "2"}),
                                  {{"CUDA_VISIBLE_DEVICES", ""}}),
                {"distributed_type MULTI_GPU", "no CUDA device is visible", "--multi_cpu"});
  // Agreeing counts are fine.
  const auto ok =
      run_accel_command({"launch", "-q", "--nproc_per_node", "2", "--num_processes", "2",
                         "--multi_cpu", "--main_process_port", "0", "--monitor_interval", "0.01",
                         "sh", "-c", "echo worker-started"});
  INFO(ok.output);
  CHECK(ok.exit_code == 0);
  CHECK(contains(ok.output, "[rank 1] worker-started"));
}

TEST_CASE("torchrun's rendezvous flags that cannot work are refused, saying why") {
  check_refused(run_accel_command(launch_args({"--nnodes", "3:2"})),
                {"--nnodes 3:2", "MIN is above MAX"});
  check_refused(run_accel_command(launch_args({"--nnodes", "1:2", "--use_mpi"})),
                {"--use_mpi", "elastic job", "--nnodes MIN:MAX"});
  check_refused(run_accel_command(launch_args({"--rdzv-backend", "etcd"})),
                {"--rdzv_backend expects static or c10d, got 'etcd'"});
  check_refused(run_accel_command(launch_args({"--standalone", "--nnodes", "2"})),
                {"--standalone runs one machine", "--nnodes/--num_machines"});
  check_refused(run_accel_command(launch_args({"--standalone", "--rdzv_endpoint", "h:1"})),
                {"--standalone", "cannot be combined with --main_process_ip"});
  check_refused(run_accel_command(launch_args({"--rdzv_conf", "join_timeout=5,foo=1"})),
                {"--rdzv_conf: unknown key 'foo'", "join_timeout, last_call_timeout"});
  check_refused(run_accel_command(launch_args({"--rdzv_conf", "join_timeout=soon"})),
                {"--rdzv_conf join_timeout expects a number of seconds, got 'soon'"});
}

TEST_CASE("more workers than the descriptor limit allows are refused naming ulimit -n") {
  // 40 workers need about 4 descriptors each in the launcher; 100 are allowed (soft = hard).
  const auto out = run_accel_command(
      launch_args({"--num_processes", "40", "--multi_cpu", "--main_process_port", "0"}), {},
      "ulimit -n 100");
  check_refused(out, {"40 processes", "num_processes", "ulimit -n", "100"});
}

TEST_CASE("the mpi communicator without --use_mpi is refused before the workers start") {
  const auto flags = launch_args({"--num_processes", "2", "--multi_cpu", "--cpu_communicator",
                                  "mpi", "--main_process_port", "0"});
  check_refused(run_accel_command(flags),
                {"cpu_communicator mpi", "command line --cpu_communicator", "--use_mpi"});
  check_refused(run_accel_command(launch_args({"--num_processes", "2", "--multi_cpu",
                                               "--main_process_port", "0"}),
                                  {{"ACCEL_COMM_BACKEND", "mpi"}}),
                {"ACCEL_COMM_BACKEND=mpi", "--use_mpi"});
  // A world of one is an MPI world of one without mpirun: it runs.
  const auto one =
      run_accel_command({"launch", "-q", "--num_processes", "1", "--multi_cpu",
                         "--cpu_communicator", "mpi", "--main_process_port", "0", "true"});
  INFO(one.output);
  CHECK(one.exit_code == 0);
}

TEST_CASE("with --use_mpi the mpi communicator runs") {
  const auto built = available_communicators();
  if (skip_unless(
          std::find(built.begin(), built.end(), "mpi") != built.end() && !find_mpirun().empty(),
          "MPI not built or mpirun not found"))
    return;
  const auto result = run_accel({"test", "--use_mpi", "--num_processes", "2", "--multi_cpu",
                                 "--main_process_port", "0", "--cpu_communicator", "mpi"},
                                {}, std::chrono::seconds(120));
  const std::string& out = result.workers.at(0).output;
  INFO(out);
  REQUIRE_FALSE(result.timed_out);
  CHECK(result.exit_code() == 0);
  CHECK(contains(out, "communicator mpi"));
}

TEST_CASE("a worker asked for mpi but not started by mpirun says how to start it") {
  const auto built = available_communicators();
  if (skip_unless(std::find(built.begin(), built.end(), "mpi") != built.end(), "MPI not built"))
    return;
  if (skip_unless(std::filesystem::exists(bin_path("allreduce_demo")), "allreduce_demo not built"))
    return;
  // Ranks started as plain processes (as torchrun would), each an MPI world of one.
  RanksOptions options;
  options.env = {{"ACCEL_COMM_BACKEND", "mpi"}};
  options.stop_on_failure = false;
  options.timeout = std::chrono::seconds(60);
  const auto result = run_ranks(2, "allreduce_demo", {}, options);
  INFO(describe(result));
  REQUIRE_FALSE(result.timed_out);
  for (const auto& w : result.workers) {
    CHECK(w.exit_code != 0);
    CHECK(w.signal == 0);  // no abort
    CHECK(contains(w.output, "not started by mpirun"));
    CHECK(contains(w.output, "accel launch --use_mpi"));
    CHECK_FALSE(contains(w.output, "terminate called"));
  }
}
