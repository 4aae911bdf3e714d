#pragma once
// What `accel launch` was asked to do. Settings that belong to the run configuration (process
// count, machines, distributed type, ...) are not fields here: they travel as config
// overrides keyed by their YAML names and are resolved, with the config file and the
// environment, by config::resolve_config. Only what concerns launching itself is here.

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "config/config.hpp"
#include "launch/worker_group.hpp"

namespace accel::launch {

// Environment defaults the launcher adds for the workers when the variable is unset. Each
// can be switched off; all of them with --no_default_env.
struct EnvDefaults {
  bool omp_num_threads = true;  // OMP_NUM_THREADS = cores / local workers
  bool malloc_hugetlb = true;   // GLIBC_TUNABLES=glibc.malloc.hugetlb=1 for CPU workers
  bool gloo_hostname = true;    // ACCEL_GLOO_HOSTNAME = our address toward main_process_ip
};

struct LaunchOptions {
  std::optional<std::string> config_file;  // --config_file
  config::Overrides overrides;             // command-line settings by YAML key
  // torchrun's --nproc_per_node: num_processes becomes this times num_machines, whichever
  // source num_machines comes from.
  std::optional<int> nproc_per_node;

  int max_restarts = 0;         // whole-group restarts after a failure
  std::string run_id = "none";  // torchrun's --rdzv_id, TORCHELASTIC_RUN_ID in the workers
  bool standalone = false;      // torchrun's --standalone: one machine, a free local port
  // Elastic jobs (config min_machines / rdzv_backend c10d, elastic_agent.hpp): how long a
  // round that has its fewest machines waits for more.
  std::chrono::milliseconds last_call_timeout{std::chrono::seconds(30)};
  std::chrono::milliseconds monitor_interval{100};  // how often workers are checked
  std::chrono::milliseconds grace{5000};            // SIGTERM -> SIGKILL
  // Machines joining: 300 s by default, an elastic job's 600 s (torchrun's join_timeout).
  std::optional<std::chrono::milliseconds> rdzv_timeout;
  // The launchers' heartbeat (heartbeat.hpp): a machine silent for interval x misses is lost.
  std::chrono::milliseconds heartbeat_interval{std::chrono::seconds(5)};
  int heartbeat_misses = 3;
  std::string log_dir;                             // one log file per rank when set
  std::optional<Streams> tee;                      // console streams with --log_dir
  std::optional<int> num_cpu_threads_per_process;  // OMP_NUM_THREADS, explicitly
  EnvDefaults env_defaults;

  bool use_mpi = false;                  // start the workers with mpirun instead of forking them
  std::string mpi_hostfile;              // --mpi_hostfile, passed to mpirun as --hostfile
  std::vector<std::string> mpirun_args;  // --mpirun_arg, each passed through as is

  bool quiet = false;
  std::vector<std::string> program;  // the training program and its arguments
};

}  // namespace accel::launch
