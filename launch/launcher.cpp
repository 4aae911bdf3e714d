#include "launch/launcher.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "config/resolve.hpp"
#include "foundation/error.hpp"
#include "foundation/store/tcp_store.hpp"
#include "launch/elastic_agent.hpp"
#include "launch/mpirun.hpp"
#include "launch/node_rendezvous.hpp"
#include "launch/reaper.hpp"
#include "launch/restart_loop.hpp"
#include "launch/summary.hpp"
#include "launch/worker_env.hpp"

namespace accel::launch {
namespace {

std::string getenv_or(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return (v && *v) ? std::string(v) : fallback;
}

// SIGINT/SIGTERM to the launcher are turned into a readable pipe the worker group polls,
// so the workers are stopped the same orderly way as after a failure.
int g_signal_pipe[2] = {-1, -1};
std::atomic<int> g_signal{0};

void on_signal(int sig) {
  int expected = 0;
  g_signal.compare_exchange_strong(expected, sig);
  const char c = 1;
  (void)!write(g_signal_pipe[1], &c, 1);
}

void install_signal_forwarding() {
  if (g_signal_pipe[0] >= 0) return;
  if (pipe2(g_signal_pipe, O_CLOEXEC | O_NONBLOCK) != 0)
    throw Error("launch: pipe failed: " + errno_text(errno));
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGHUP, &sa, nullptr);  // the terminal went away: stop the job the same way
  // A console that went away must not kill the launcher while its workers run on.
  signal(SIGPIPE, SIG_IGN);
}

void say(const std::string& text) { std::fprintf(stderr, "accel launch: %s\n", text.c_str()); }

// A secret only this launcher and its workers know, so no other local user can join or
// poison a single-machine job's store. Machines of a multi-machine job share ACCEL_STORE_TOKEN.
std::string random_token() {
  unsigned char bytes[16];
  if (getrandom(bytes, sizeof(bytes), 0) != ssize_t(sizeof(bytes))) return "";
  static const char hex[] = "0123456789abcdef";
  std::string out;
  for (unsigned char b : bytes) {
    out += hex[b >> 4];
    out += hex[b & 15];
  }
  return out;
}

struct Rendezvous {
  std::unique_ptr<TcpStoreServer> server;  // machine 0 only
  StorePtr store;                          // the launchers' own client
  StorePtr heartbeat_store;                // a second one, for the heartbeat's thread
  int port = 0;
  std::string token;
};

std::chrono::milliseconds join_timeout(const config::Config& cfg, const LaunchOptions& options) {
  return options.rdzv_timeout.value_or(config::is_elastic(cfg) ? std::chrono::seconds(600)
                                                               : std::chrono::seconds(300));
}

Rendezvous open_rendezvous(const config::Config& cfg, const LaunchOptions& options) {
  Rendezvous r;
  const bool one_machine = cfg.num_machines == 1;
  r.token = getenv_or("ACCEL_STORE_TOKEN", one_machine ? random_token() : "");
  r.port = cfg.main_process_port;
  std::string connect_host = cfg.main_process_ip;
  if (config::is_elastic(cfg)) {
    // torchrun's c10d: the agent on the endpoint's machine hosts the store; binding the
    // endpoint's own address fails on every other machine (or when another agent there holds
    // it), which then connects to it.
    try {
      r.server =
          std::make_unique<TcpStoreServer>(cfg.main_process_ip, cfg.main_process_port, r.token);
      r.port = r.server->port();
    } catch (const Error&) {
    }
  } else if (cfg.machine_rank == 0) {
    // One machine: listen only where the workers look (loopback by default). Several: on
    // every interface, as torchrun does, since main_process_ip may be an address that is
    // not this machine's own (NAT, a load balancer) while the others still reach us.
    const std::string bind = one_machine ? cfg.main_process_ip : "0.0.0.0";
    try {
      r.server = std::make_unique<TcpStoreServer>(bind, cfg.main_process_port, r.token);
    } catch (const Error& e) {
      throw Error("cannot host the rendezvous store on " + bind + ":" +
                  std::to_string(cfg.main_process_port) + ": " + e.what() +
                  "\n(is another job using that port? choose one with --main_process_port, or 0 "
                  "for a free one on a single machine)");
    }
    r.port = r.server->port();
    if (!one_machine) connect_host = "127.0.0.1";
  }
  TcpStoreOptions client;
  client.token = r.token;
  client.connect_timeout = join_timeout(cfg, options);
  // The launchers only make requests the store answers at once: one not answered within the
  // heartbeat's limit means machine 0 is out of reach (the client adds a few seconds).
  client.timeout = std::max<std::chrono::milliseconds>(
      std::chrono::milliseconds(1),
      options.heartbeat_interval * options.heartbeat_misses - std::chrono::seconds(5));
  try {
    r.store = std::make_shared<TcpStore>(connect_host, r.port, client);
    if (!one_machine || config::is_elastic(cfg)) {
      TcpStoreOptions beat = client;
      beat.connect_timeout = options.heartbeat_interval * options.heartbeat_misses;
      r.heartbeat_store = std::make_shared<TcpStore>(connect_host, r.port, beat);
    }
  } catch (const Error& e) {
    throw Error(std::string(config::is_elastic(cfg)
                                ? "cannot reach the rendezvous store (--rdzv_endpoint)"
                                : "cannot reach machine 0's rendezvous store") +
                ": " + e.what());
  }
  return r;
}

// A program that cannot be started would fail every rank the same way (exit 127), and every
// restart again: say so before starting anything.
void check_program(const std::string& program) {
  auto runnable = [](const std::string& path) { return access(path.c_str(), X_OK) == 0; };
  if (program.find('/') != std::string::npos) {
    if (!runnable(program))
      throw ConfigError("accel launch: cannot run '" + program + "': " +
                        (access(program.c_str(), F_OK) == 0 ? "not executable" : "no such file"));
    return;
  }
  const std::string path = getenv_or("PATH", "/usr/local/bin:/usr/bin:/bin");
  std::size_t start = 0;
  for (;;) {
    const auto end = path.find(':', start);
    const std::string dir = path.substr(start, end == std::string::npos ? end : end - start);
    if (runnable((dir.empty() ? std::string(".") : dir) + "/" + program)) return;
    if (end == std::string::npos) break;
    start = end + 1;
  }
  throw ConfigError("accel launch: cannot run '" + program + "': not found in PATH");
}

// Descriptors the launcher holds per local worker: its stdout and stderr pipes, its log file
// and its connection to the rendezvous store; and a reserve for the launcher's own work.
constexpr rlim_t kDescriptorsPerWorker = 4;
constexpr rlim_t kDescriptorReserve = 64;

// Settings that are each valid but cannot work together on this machine, refused before
// anything starts (every worker would fail the same way, or the launcher half-way through).
void check_settings(const config::ResolvedConfig& resolved, const LaunchOptions& options) {
  const config::Config& cfg = resolved.config;
  const int local = config::processes_per_machine(cfg);

  // The mpi communicator joins MPI_COMM_WORLD, which only mpirun makes bigger than one.
  const char* env_backend = std::getenv("ACCEL_COMM_BACKEND");
  const bool from_env = env_backend != nullptr && *env_backend != '\0';
  const std::string backend = from_env ? env_backend : config::comm_backend(cfg);
  if (backend == "mpi" && !options.use_mpi && cfg.num_processes > 1)
    throw ConfigError(
        "accel launch: " +
        (from_env ? std::string("ACCEL_COMM_BACKEND=mpi (environment)")
                  : "cpu_communicator mpi (" + resolved.origins.at("cpu_communicator") + ")") +
        " needs the " + std::to_string(cfg.num_processes) +
        " processes started by mpirun: add --use_mpi, or choose another cpu_communicator");

  if (config::uses_gpu(cfg)) {
    const config::Hardware hw = config::detect_hardware();
    if (hw.gpus == 0)
      throw ConfigError(
          "accel launch: distributed_type " + config::to_string(cfg.distributed_type) + " (" +
          resolved.origins.at("distributed_type") + ") runs on GPUs (use_cpu false, " +
          resolved.origins.at("use_cpu") + "), but no CUDA device is visible on this machine (" +
          config::describe(hw) + "); use --multi_cpu or --cpu to run on the CPU");
  }

  // Starting more workers than descriptors allow would fail half-way ("pipe failed"), with
  // the first workers already waiting for the others.
  struct rlimit limit {};
  if (!options.use_mpi && ::getrlimit(RLIMIT_NOFILE, &limit) == 0) {
    const rlim_t needed = kDescriptorReserve + kDescriptorsPerWorker * rlim_t(local);
    if (limit.rlim_cur != RLIM_INFINITY && limit.rlim_cur < needed) {
      // Raising the soft limit up to the hard one is what it is for (Go's runtime does it too).
      if (limit.rlim_max == RLIM_INFINITY || limit.rlim_max >= needed) {
        limit.rlim_cur = needed;
        ::setrlimit(RLIMIT_NOFILE, &limit);
      } else {
        throw ConfigError("accel launch: " + std::to_string(local) +
                          " processes on this machine (num_processes, " +
                          resolved.origins.at("num_processes") + ") need about " +
                          std::to_string(needed) + " file descriptors, but at most " +
                          std::to_string(limit.rlim_max) +
                          " may be open here (ulimit -n); raise the limit or run fewer "
                          "processes per machine");
      }
    }
  }
}

std::string plural(int n, const char* word) {
  return std::to_string(n) + " " + word +
         (n == 1 ? "" : (std::string(word).ends_with("s") ? "es" : "s"));
}

}  // namespace

int launch(const LaunchOptions& options) {
  if (options.program.empty()) throw ConfigError("accel launch: no program to launch");
  // With a hostfile the program may live only on the other hosts.
  if (!(options.use_mpi && !options.mpi_hostfile.empty())) check_program(options.program.front());
  config::ResolvedConfig resolved = config::resolve_config(options.config_file, options.overrides);
  if (options.nproc_per_node) {
    // Per machine, as torchrun counts; the config counts over all machines.
    const std::string total = std::to_string(static_cast<long long>(*options.nproc_per_node) *
                                             resolved.config.num_machines);
    if (options.overrides.count("num_processes") != 0 &&
        std::to_string(resolved.config.num_processes) != total)
      throw ConfigError("accel launch: --nproc_per_node " +
                        std::to_string(*options.nproc_per_node) + " (x " +
                        plural(resolved.config.num_machines, "machine") + " = " + total +
                        " processes) contradicts --num_processes " +
                        std::to_string(resolved.config.num_processes) + "; give one of them");
    config::Overrides overrides = options.overrides;
    overrides["num_processes"] = total;
    resolved = config::resolve_config(options.config_file, overrides);
  }
  check_settings(resolved, options);
  const config::Config& cfg = resolved.config;
  if (options.use_mpi && config::is_elastic(cfg))
    throw ConfigError(
        "accel launch: --use_mpi starts every process from machine 0, which an elastic job "
        "(--nnodes MIN:MAX, min_machines, rdzv_backend c10d) has not: choose one");
  if (options.use_mpi && cfg.machine_rank != 0)
    throw ConfigError(
        "accel launch: with --use_mpi only machine 0 runs accel launch; mpirun "
        "starts the processes on the other machines (--mpi_hostfile)");

  JobLayout layout;
  layout.world_size = cfg.num_processes;
  layout.local_world_size = config::processes_per_machine(cfg);
  layout.node_rank = cfg.machine_rank;
  layout.master_addr = cfg.main_process_ip;

  std::string mpirun;
  if (options.use_mpi) {
    mpirun = find_mpirun_executable();
    if (mpirun.empty()) throw ConfigError("accel launch: --use_mpi but no mpirun in PATH");
  }

  install_signal_forwarding();
  // Orphaned descendants of the workers are reparented to us, so they can be ended too.
  const bool subreaper = become_child_subreaper();

  Rendezvous rdzv_store = open_rendezvous(cfg, options);
  layout.master_port = rdzv_store.port;
  layout.store_token = rdzv_store.token;
  const WorkerEnvPlan env = plan_worker_env(cfg, options, layout);

  if (!options.quiet) {
    std::string text =
        "accel launch: settings (command line > environment > config file > default):\n" +
        describe_settings(resolved);
    for (const auto& w : guess_warnings(resolved)) text += "accel launch: " + w + "\n";
    if (!env.defaults.empty())
      text += "accel launch: worker environment defaults:\n" + describe_env_defaults(env.defaults);
    for (const auto& w : env.warnings) text += "accel launch: warning: " + w + "\n";
    if (!subreaper)
      text +=
          "accel launch: warning: cannot become a child subreaper; processes that leave "
          "their worker's process group may outlive the job\n";
    if (cfg.num_machines > 1 && rdzv_store.token.empty() && cfg.machine_rank == 0)
      text +=
          "accel launch: warning: the rendezvous store listens on every interface without a "
          "token; set the same ACCEL_STORE_TOKEN on every machine to keep others out\n";
    if (options.log_dir.empty() && options.tee)
      text += "accel launch: warning: --tee only matters with --log_dir; ignored\n";
    if (config::is_elastic(cfg))
      text += "accel launch: elastic, " + std::to_string(config::fewest_machines(cfg)) + " to " +
              plural(cfg.num_machines, "machine") + " of " +
              plural(layout.local_world_size, "process") + "; rendezvous store at " +
              cfg.main_process_ip + ":" + std::to_string(layout.master_port) +
              (rdzv_store.server ? " (hosted here)" : "") + "\n";
    else
      text += "accel launch: " + plural(layout.world_size, "process") + " on " +
              plural(cfg.num_machines, "machine") + " (this is machine " +
              std::to_string(cfg.machine_rank) + ", " + std::to_string(layout.local_world_size) +
              " here" + (options.use_mpi ? ", started by mpirun" : "") + "); rendezvous store at " +
              cfg.main_process_ip + ":" + std::to_string(layout.master_port) + "\n";
    std::fputs(text.c_str(), stderr);
    std::fflush(stderr);
  }

  auto log_file = [&](const std::string& name) {
    return options.log_dir.empty()
               ? std::string()
               : (std::filesystem::path(options.log_dir) / (name + ".log")).string();
  };
  AttemptPlan plan;
  plan.options = &options;
  plan.stop_fd = g_signal_pipe[0];
  plan.interrupt_signal = [] { return g_signal.load(); };
  plan.prefix_output = !options.use_mpi;  // mpirun --tag-output names the rank itself
  plan.workers = [&](const Attempt& attempt) {
    // An elastic round's size and node rank (a static job's are the config's).
    config::Config round = cfg;
    round.num_machines = attempt.num_machines;
    round.machine_rank = attempt.machine_rank;
    round.num_processes = attempt.num_machines * layout.local_world_size;
    JobLayout at = layout;
    at.world_size = round.num_processes;
    at.node_rank = attempt.machine_rank;
    const JobLayout& layout = at;
    std::vector<WorkerSpec> specs;
    EnvList common = plan_worker_env(round, options, layout).common;
    const EnvList restarts =
        restart_env(attempt.number, attempt.restarts, options.max_restarts, options.run_id);
    common.insert(common.end(), restarts.begin(), restarts.end());
    if (options.use_mpi) {
      MpirunPlan mp;
      mp.mpirun = mpirun;
      mp.num_processes = layout.world_size;
      mp.local_processes = layout.local_world_size;
      mp.env = common;
      mp.options = options;
      WorkerSpec spec;
      spec.argv = mpirun_command(mp);
      spec.env = common;
      spec.label = "mpirun";
      spec.log_file = log_file("mpirun");
      specs.push_back(std::move(spec));
      return specs;
    }
    for (int local = 0; local < layout.local_world_size; ++local) {
      WorkerSpec spec;
      spec.argv = options.program;
      spec.env = common;
      const EnvList ranks = rank_env(layout, local);
      spec.env.insert(spec.env.end(), ranks.begin(), ranks.end());
      const std::string rank = ranks.front().second;
      spec.label = "rank " + rank;
      spec.rank = std::stoi(rank);
      spec.log_file = log_file("rank_" + rank);
      specs.push_back(std::move(spec));
    }
    return specs;
  };

  NodeRendezvousOptions nro;
  nro.num_machines = cfg.num_machines;
  nro.machine_rank = cfg.machine_rank;
  nro.join_timeout = join_timeout(cfg, options);
  nro.poll_interval = std::min(options.monitor_interval, std::chrono::milliseconds(500));
  nro.heartbeat_interval = options.heartbeat_interval;
  nro.heartbeat_misses = options.heartbeat_misses;
  nro.interrupt_signal = [] { return g_signal.load(); };
  plan.store = rdzv_store.store;
  if (config::is_elastic(cfg))
    return run_elastic(plan, nro, config::fewest_machines(cfg), cfg.num_machines,
                       {rdzv_store.store, rdzv_store.heartbeat_store, rdzv_store.server != nullptr,
                        cfg.main_process_ip + ":" + std::to_string(rdzv_store.port)});
  NodeRendezvous node_rdzv(rdzv_store.store, rdzv_store.heartbeat_store, nro);
  plan.join = [&](const Attempt* previous, int restarts) {
    Attempt a;
    a.number = previous ? previous->number + 1 : 0;
    a.restarts = restarts;
    a.machine_rank = cfg.machine_rank;
    a.num_machines = cfg.num_machines;
    a.label = "machine " + std::to_string(cfg.machine_rank);
    a.rendezvous = &node_rdzv;
    node_rdzv.join(a.number);
    return a;
  };
  return run_attempts(plan);
}

}  // namespace accel::launch
