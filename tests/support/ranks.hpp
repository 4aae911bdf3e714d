#pragma once
// Runs a test program as the ranks of a real job: separate processes with the launcher's
// environment and a rendezvous store hosted by this test process (as `accel launch` does),
// or under mpirun. Output is captured so a failing test shows what every rank said.

#include <string>
#include <utility>
#include <vector>

#include "launch/worker_group.hpp"

namespace accel::test {

struct RanksOptions {
  std::vector<std::pair<std::string, std::string>> env;  // extra, for every rank
  std::chrono::milliseconds timeout{120000};             // the whole job
  std::string store_token;                               // ACCEL_STORE_TOKEN, when set
  bool stop_on_failure = true;  // false: every rank runs to its end (to see what each says)
  // The ranks as this many machines of world / nodes ranks each (LOCAL_RANK, NODE_RANK and
  // LOCAL_WORLD_SIZE as each machine's launcher sets them), all on this host.
  int nodes = 1;
};

// `program` is a file name in build/bin; args follow it.
launch::GroupResult run_ranks(int world, const std::string& program,
                              const std::vector<std::string>& args,
                              const RanksOptions& options = {});

// The same job started by `mpirun -np world` (one worker: mpirun itself).
launch::GroupResult run_under_mpirun(int world, const std::string& program,
                                     const std::vector<std::string>& args,
                                     const RanksOptions& options = {});

// `accel launch -q --num_processes world --main_process_port 0 program args...` in a mount
// namespace of its own whose /dev/shm is a tmpfs of `shm_size` (mount's size=, e.g. "12m"):
// what a job does when /dev/shm is too small. Needs can_make_mount_namespace().
launch::GroupResult run_with_dev_shm_of(const std::string& shm_size, int world,
                                        const std::string& program,
                                        const std::vector<std::string>& args,
                                        const RanksOptions& options = {});
// Whether this process may make a mount namespace (root, no seccomp filter against unshare).
bool can_make_mount_namespace();

// The mpirun executable, or "" when MPI is not installed.
std::string find_mpirun();

// Runs `accel ARGS...` as one process, as a user would start it: the rank, thread, communicator,
// token and config variables an outer environment may set are removed (and the config home
// points nowhere), so only `env` and the launcher's own defaults apply. Captures its output.
// A shell_prefix runs first in `sh -c` (e.g. "ulimit -n 100"), then execs accel.
launch::GroupResult run_accel(const std::vector<std::string>& args,
                              const std::vector<std::pair<std::string, std::string>>& env = {},
                              std::chrono::milliseconds timeout = std::chrono::seconds(90),
                              const std::string& shell_prefix = "");

// Everything the ranks printed, rank by rank, for a failure message.
std::string describe(const launch::GroupResult& result);
// How many times `what` occurs in all the workers' output (under mpirun: the one output).
int count_in_output(const launch::GroupResult& result, const std::string& what);

std::string bin_path(const std::string& program);

// The environment that makes a worker's Accelerator run ZeRO at `stage` (1 or 2).
inline std::vector<std::pair<std::string, std::string>> zero_env(int stage) {
  return {{"ACCEL_DISTRIBUTED_TYPE", "ZERO"}, {"ACCEL_ZERO_STAGE", std::to_string(stage)}};
}

}  // namespace accel::test
