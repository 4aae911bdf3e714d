#include "tests/support/ranks.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>

#include "config/config.hpp"
#include "foundation/store/tcp_store.hpp"
#include "launch/worker_env.hpp"

namespace accel::test {

std::string bin_path(const std::string& program) {
  return (std::filesystem::path(ACCEL_BIN_DIR) / program).string();
}

launch::GroupResult run_ranks(int world, const std::string& program,
                              const std::vector<std::string>& args, const RanksOptions& options) {
  // The store lives here, on a free port, as the launcher would host it.
  TcpStoreServer server("127.0.0.1", 0, options.store_token);
  launch::JobLayout layout;
  layout.world_size = world;
  layout.local_world_size = world / std::max(options.nodes, 1);
  layout.master_addr = "127.0.0.1";
  layout.master_port = server.port();
  layout.store_token = options.store_token;
  std::vector<launch::WorkerSpec> specs;
  for (int r = 0; r < world; ++r) {
    launch::WorkerSpec spec;
    spec.argv = {bin_path(program)};
    spec.argv.insert(spec.argv.end(), args.begin(), args.end());
    spec.label = "rank " + std::to_string(r);
    // Exactly what `accel launch` gives its workers, with the store hosted here.
    layout.node_rank = r / layout.local_world_size;
    spec.env = launch::job_env(layout);
    const auto ranks = launch::rank_env(layout, r % layout.local_world_size);
    spec.env.insert(spec.env.end(), ranks.begin(), ranks.end());
    spec.env.emplace_back("OMP_NUM_THREADS", "1");
    spec.env.insert(spec.env.end(), options.env.begin(), options.env.end());
    specs.push_back(std::move(spec));
  }
  launch::WorkerGroupOptions group_options;
  group_options.capture = true;
  group_options.echo = false;
  group_options.timeout = options.timeout;
  group_options.stop_on_failure = options.stop_on_failure;
  return launch::run_worker_group(specs, group_options);
}

std::string find_mpirun() {
  for (const char* dir : {"/usr/bin", "/usr/local/bin"}) {
    const auto p = std::filesystem::path(dir) / "mpirun";
    if (std::filesystem::exists(p)) return p.string();
  }
  return "";
}

launch::GroupResult run_under_mpirun(int world, const std::string& program,
                                     const std::vector<std::string>& args,
                                     const RanksOptions& options) {
  launch::WorkerSpec spec;
  spec.argv = {find_mpirun()};
  if (geteuid() == 0) spec.argv.push_back("--allow-run-as-root");
  // This machine may have fewer cores than ranks; shared memory between ranks on one host.
  for (const char* a :
       {"--oversubscribe", "--bind-to", "none", "--mca", "btl", "self,vader", "-np"})
    spec.argv.push_back(a);
  spec.argv.push_back(std::to_string(world));
  spec.argv.push_back(bin_path(program));
  spec.argv.insert(spec.argv.end(), args.begin(), args.end());
  spec.label = "mpirun";
  spec.env = options.env;
  spec.env.emplace_back("OMP_NUM_THREADS", "1");
  launch::WorkerGroupOptions group_options;
  group_options.capture = true;
  group_options.echo = false;
  group_options.timeout = options.timeout;
  return launch::run_worker_group({spec}, group_options);
}

launch::GroupResult run_with_dev_shm_of(const std::string& shm_size, int world,
                                        const std::string& program,
                                        const std::vector<std::string>& args,
                                        const RanksOptions& options) {
  launch::WorkerSpec spec;
  spec.argv = {"unshare",
               "--mount",
               "--propagation",
               "private",
               "sh",
               "-c",
               "mount -t tmpfs -o size=\"$1\" tmpfs /dev/shm && shift && exec \"$@\"",
               "sh",
               shm_size,
               bin_path("accel"),
               "launch",
               "-q",
               "--num_processes",
               std::to_string(world),
               "--main_process_port",
               "0",
               bin_path(program)};
  spec.argv.insert(spec.argv.end(), args.begin(), args.end());
  spec.label = "accel launch with a /dev/shm of " + shm_size;
  spec.unset_env = {"ACCEL_CONFIG_FILE", "ACCEL_COMM_BACKEND", "ACCEL_NUM_PROCESSES"};
  spec.env = options.env;
  spec.env.emplace_back("OMP_NUM_THREADS", "1");
  launch::WorkerGroupOptions group_options;
  group_options.capture = true;
  group_options.echo = false;
  group_options.timeout = options.timeout;  // anti-hang only
  return launch::run_worker_group({spec}, group_options);
}

bool can_make_mount_namespace() {
  return std::system("unshare --mount --propagation private true >/dev/null 2>&1") == 0;
}

launch::GroupResult run_accel(const std::vector<std::string>& args,
                              const std::vector<std::pair<std::string, std::string>>& env,
                              std::chrono::milliseconds timeout, const std::string& shell_prefix) {
  launch::WorkerSpec spec;
  if (!shell_prefix.empty()) spec.argv = {"sh", "-c", shell_prefix + " && exec \"$0\" \"$@\""};
  spec.argv.push_back(bin_path("accel"));
  spec.argv.insert(spec.argv.end(), args.begin(), args.end());
  spec.label = "accel";
  spec.unset_env = {"RANK",
                    "WORLD_SIZE",
                    "LOCAL_RANK",
                    "OMP_NUM_THREADS",
                    "GLIBC_TUNABLES",
                    "ACCEL_COMM_BACKEND",
                    "ACCEL_CONFIG_FILE",
                    "ACCEL_STORE_TOKEN",
                    "ACCEL_GLOO_HOSTNAME",
                    "CUDA_VISIBLE_DEVICES"};
  for (const auto& key : config::schema()) spec.unset_env.push_back(config::env_var_for(key.name));
  spec.env = env;
  spec.env.emplace_back("XDG_CONFIG_HOME", "/nonexistent-accel-test-config");
  // A launch that names no port (nor a config file that might) hosts its store on a free one,
  // not the default 29500 that another job on the machine may hold.
  auto names_port = [](const std::string& arg) {
    for (const char* flag : {"--main_process_port", "--master_port", "--rdzv_endpoint",
                             "--standalone", "--config_file", "--num_machines", "--nnodes"})
      if (arg.rfind(flag, 0) == 0) return true;
    return false;
  };
  const bool env_port = std::any_of(env.begin(), env.end(), [](const auto& kv) {
    return kv.first == "ACCEL_MAIN_PROCESS_PORT" || kv.first == "MASTER_PORT";
  });
  if (!args.empty() && args[0] == "launch" && !env_port &&
      std::none_of(args.begin(), args.end(), names_port))
    spec.env.emplace_back("ACCEL_MAIN_PROCESS_PORT", "0");
  launch::WorkerGroupOptions options;
  options.capture = true;
  options.echo = false;
  options.timeout = timeout;  // anti-hang only
  return launch::run_worker_group({spec}, options);
}

int count_in_output(const launch::GroupResult& result, const std::string& what) {
  int n = 0;
  for (const auto& w : result.workers)
    for (std::size_t pos = 0; (pos = w.output.find(what, pos)) != std::string::npos; ++pos) ++n;
  return n;
}

std::string describe(const launch::GroupResult& result) {
  std::string out = result.failure_report() + "\n";
  for (const auto& w : result.workers)
    out += "--- " + w.label + " (exit " + std::to_string(w.exit_code) + ", signal " +
           std::to_string(w.signal) + ") ---\n" + w.output;
  return out;
}

}  // namespace accel::test
