#pragma once
// The environment every worker starts with: torchrun's names for who it is and where to
// rendezvous, ACCEL_* for what the config chose, and a few defaults that make workers fast
// on shared machines (thread counts, huge pages), each explained when printed and each
// switchable off.

#include <string>
#include <utility>
#include <vector>

#include "config/config.hpp"
#include "launch/launch_options.hpp"

namespace accel::launch {

using EnvList = std::vector<std::pair<std::string, std::string>>;

// GLIBC_TUNABLES for CPU workers unless the user set it (worker_env.cpp says why): malloc on
// transparent huge pages, the mmap and trim thresholds out of reach, and one arena for all
// threads.
inline constexpr const char* kWorkerMallocTunables =
    "glibc.malloc.hugetlb=1:glibc.malloc.mmap_threshold=4294967296:"
    "glibc.malloc.trim_threshold=4294967296:glibc.malloc.arena_max=1";

// Where this machine's workers sit in the job.
struct JobLayout {
  int world_size = 1;        // processes over all machines
  int local_world_size = 1;  // processes on this machine
  int node_rank = 0;         // this machine's rank
  std::string master_addr;   // the rendezvous store (machine 0)
  int master_port = 0;
  std::string store_token;  // ACCEL_STORE_TOKEN for the workers; "" = none
};

// A variable the launcher chose on its own, with why and how to stop it: printed once.
struct EnvDefault {
  std::string name, value;
  std::string why;      // "16 cores / 4 workers"
  std::string opt_out;  // "set OMP_NUM_THREADS yourself, or --no_omp_num_threads"
};

struct WorkerEnvPlan {
  EnvList common;                     // the same for every worker on this machine
  std::vector<EnvDefault> defaults;   // the part of `common` that was a default (for the summary)
  std::vector<std::string> warnings;  // e.g. no address toward main_process_ip was found
};

WorkerEnvPlan plan_worker_env(const config::Config& config, const LaunchOptions& options,
                              const JobLayout& layout);

// Who the job is and where it meets (torchrun's names): WORLD_SIZE, LOCAL_WORLD_SIZE,
// NODE_RANK, MASTER_ADDR, MASTER_PORT, ACCEL_LAUNCHER_STORE, ACCEL_STORE_TOKEN.
EnvList job_env(const JobLayout& layout);

// RANK and LOCAL_RANK of this machine's local_rank-th worker.
EnvList rank_env(const JobLayout& layout, int local_rank);

// ACCEL_RESTART_COUNT, the attempt's number (0 = the first run; the namespace of its keys in
// the store), TORCHELASTIC_RESTART_COUNT, the restarts counted against the limit (the same,
// but for an elastic job growing), the restarts allowed, and TORCHELASTIC_RUN_ID (--rdzv_id).
EnvList restart_env(int attempt, int restarts, int max_restarts, const std::string& run_id);

// The local address the kernel would use to reach `host` ("" when it has no route): the
// address Gloo must listen on for the other machines to reach this one.
std::string local_address_toward(const std::string& host);

bool is_loopback(const std::string& host);

}  // namespace accel::launch
