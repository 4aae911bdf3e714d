#include "launch/worker_env.hpp"

#include <arpa/inet.h>
#include <gnu/libc-version.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "config/resolve.hpp"
#include "foundation/host_cores.hpp"

namespace accel::launch {
namespace {

bool env_set(const char* name) { return std::getenv(name) != nullptr; }

// glibc.malloc.hugetlb exists from glibc 2.35; older versions ignore unknown tunables, but
// then promising it in the summary would be a lie.
bool glibc_has_malloc_hugetlb() {
  int major = 0, minor = 0;
  if (std::sscanf(gnu_get_libc_version(), "%d.%d", &major, &minor) != 2) return false;
  return major > 2 || (major == 2 && minor >= 35);
}

void add(WorkerEnvPlan& plan, std::string name, std::string value) {
  for (auto& [k, v] : plan.common)
    if (k == name) {
      v = std::move(value);
      return;
    }
  plan.common.emplace_back(std::move(name), std::move(value));
}

void add_default(WorkerEnvPlan& plan, EnvDefault d) {
  add(plan, d.name, d.value);
  plan.defaults.push_back(std::move(d));
}

}  // namespace

bool is_loopback(const std::string& host) {
  return host == "localhost" || host.starts_with("127.") || host == "::1";
}

std::string local_address_toward(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  if (getaddrinfo(host.c_str(), "9", &hints, &found) != 0 || !found) return "";
  std::string out;
  // Connecting a UDP socket sends nothing; it only asks the routing table which local
  // address packets to `host` would leave from.
  const int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd >= 0 && connect(fd, found->ai_addr, found->ai_addrlen) == 0) {
    sockaddr_in local{};
    socklen_t len = sizeof(local);
    char text[INET_ADDRSTRLEN] = {};
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0 &&
        inet_ntop(AF_INET, &local.sin_addr, text, sizeof(text)))
      out = text;
  }
  if (fd >= 0) close(fd);
  freeaddrinfo(found);
  return out;
}

EnvList job_env(const JobLayout& layout) {
  EnvList env = {{"WORLD_SIZE", std::to_string(layout.world_size)},
                 {"LOCAL_WORLD_SIZE", std::to_string(layout.local_world_size)},
                 {"NODE_RANK", std::to_string(layout.node_rank)},
                 {"GROUP_RANK", std::to_string(layout.node_rank)},  // torchrun's name for it
                 {"MASTER_ADDR", layout.master_addr},
                 {"MASTER_PORT", std::to_string(layout.master_port)},
                 {"ACCEL_LAUNCHER_STORE", "1"}};
  if (!layout.store_token.empty()) env.emplace_back("ACCEL_STORE_TOKEN", layout.store_token);
  return env;
}

WorkerEnvPlan plan_worker_env(const config::Config& config, const LaunchOptions& options,
                              const JobLayout& layout) {
  WorkerEnvPlan plan;
  // Who the workers are (RANK and LOCAL_RANK are added per worker) and where to meet.
  for (const auto& [name, value] : job_env(layout)) add(plan, name, value);

  // What the config chose, in the ACCEL_* variables the library reads.
  for (const auto& [name, value] : config::to_environment(config)) add(plan, name, value);
  // The communicator follows from the distributed type; a user's own ACCEL_COMM_BACKEND wins.
  const std::string implied = config::comm_backend(config);
  if (!env_set("ACCEL_COMM_BACKEND"))
    add(plan, "ACCEL_COMM_BACKEND", implied);
  else if (std::getenv("ACCEL_COMM_BACKEND") != implied)
    plan.warnings.push_back(std::string("ACCEL_COMM_BACKEND=") + std::getenv("ACCEL_COMM_BACKEND") +
                            " from the environment replaces the communicator the settings imply (" +
                            implied + ")");

  if (config.gpu_ids != "all") add(plan, "CUDA_VISIBLE_DEVICES", config.gpu_ids);

  if (options.num_cpu_threads_per_process) {
    add(plan, "OMP_NUM_THREADS", std::to_string(*options.num_cpu_threads_per_process));
  } else if (options.env_defaults.omp_num_threads && !env_set("OMP_NUM_THREADS")) {
    // Without it every worker's OpenMP (LibTorch, OpenBLAS) starts one thread per core, and
    // N workers oversubscribe the machine N times.
    const int cores = usable_cores();
    const int threads = std::max(1, cores / std::max(1, layout.local_world_size));
    add_default(plan,
                {"OMP_NUM_THREADS", std::to_string(threads),
                 std::to_string(cores) + " cores / " + std::to_string(layout.local_world_size) +
                     " local worker" + (layout.local_world_size == 1 ? "" : "s"),
                 "set OMP_NUM_THREADS or --num_cpu_threads_per_process; --no_omp_num_threads"});
  }

  if (!config::uses_gpu(config) && options.env_defaults.malloc_hugetlb &&
      !env_set("GLIBC_TUNABLES") && glibc_has_malloc_hugetlb()) {
    // Measured on the machines this was built on: page faults are costly enough that a
    // 25M-parameter LibTorch CPU step runs 4.4x faster when malloc uses transparent huge pages.
    // LibTorch also allocates and frees large temporaries every step, which glibc maps and
    // unmaps (or trims) each time: with both thresholds out of reach they are reused from the
    // heap, and a 25M-parameter Adam step took 0 page faults instead of 1664 and 22% less time.
    // One arena: another thread's arena is a heap of at most 64 MiB that glibc shrinks and
    // faults in again whatever the thresholds, so LibTorch work on other threads (DataParallel's
    // replicas) paid the page faults again: a 1-replica DataParallel CNN step took 123 ms with
    // per-thread arenas and 49 ms (as on the main thread) with one.
    add_default(plan, {"GLIBC_TUNABLES", kWorkerMallocTunables,
                       "CPU workers: malloc on transparent huge pages, big blocks reused instead "
                       "of mapped and unmapped every step: far fewer page faults",
                       "set GLIBC_TUNABLES (even empty); --no_malloc_hugetlb"});
  }

  // Gloo listens on an address of this machine that the others can reach. Left to itself it
  // resolves the host name, which can name an interface the other machines cannot see.
  const std::string backend = env_set("ACCEL_COMM_BACKEND") ? std::getenv("ACCEL_COMM_BACKEND")
                                                            : config::comm_backend(config);
  // "auto" and "hierarchical" use Gloo between machines.
  const bool gloo_between_machines =
      backend == "gloo" || backend == "auto" || backend == "hierarchical";
  if (gloo_between_machines && !is_loopback(layout.master_addr) &&
      options.env_defaults.gloo_hostname && !env_set("ACCEL_GLOO_HOSTNAME")) {
    const std::string local = local_address_toward(layout.master_addr);
    if (local.empty())
      plan.warnings.push_back("no route from this machine to main_process_ip " +
                              layout.master_addr + "; Gloo will listen on its host name's address");
    else
      add_default(plan, {"ACCEL_GLOO_HOSTNAME", local,
                         "this machine's address on the route to " + layout.master_addr,
                         "set ACCEL_GLOO_HOSTNAME; --no_gloo_hostname"});
  }
  return plan;
}

EnvList rank_env(const JobLayout& layout, int local_rank) {
  return {{"RANK", std::to_string(layout.node_rank * layout.local_world_size + local_rank)},
          {"LOCAL_RANK", std::to_string(local_rank)}};
}

EnvList restart_env(int attempt, int restarts, int max_restarts, const std::string& run_id) {
  return {{"ACCEL_RESTART_COUNT", std::to_string(attempt)},
          {"ACCEL_MAX_RESTARTS", std::to_string(max_restarts)},
          {"TORCHELASTIC_RESTART_COUNT", std::to_string(restarts)},
          {"TORCHELASTIC_MAX_RESTARTS", std::to_string(max_restarts)},
          {"TORCHELASTIC_RUN_ID", run_id}};
}

}  // namespace accel::launch
