#include "launch/launcher.hpp"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cstdio>

#include "backends/comm/error.hpp"
#include "backends/comm/tcp_store.hpp"
#include "launch/worker_group.hpp"

namespace accel::launch {
namespace {

// SIGINT/SIGTERM to the launcher are turned into a readable pipe the worker group polls,
// so the workers are stopped the same orderly way as after a failure.
int g_signal_pipe[2] = {-1, -1};

void on_signal(int) {
  const char c = 1;
  (void)!write(g_signal_pipe[1], &c, 1);
}

void install_signal_forwarding() {
  if (g_signal_pipe[0] >= 0) return;
  if (pipe2(g_signal_pipe, O_CLOEXEC | O_NONBLOCK) != 0)
    throw Error("launch: pipe failed: " + errno_text(errno));
  struct sigaction sa{};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
}

}  // namespace

int launch(const LaunchOptions& options) {
  if (options.program.empty()) throw ConfigError("accel launch: no program to launch");
  if (options.num_processes < 1)
    throw ConfigError("accel launch: --num_processes must be at least 1, got " +
                      std::to_string(options.num_processes));
  install_signal_forwarding();

  TcpStoreServer store(options.main_process_ip, options.main_process_port,
                       std::getenv("ACCEL_STORE_TOKEN") ? std::getenv("ACCEL_STORE_TOKEN") : "");
  const int world = options.num_processes;
  if (!options.quiet)
    std::fprintf(stderr, "accel launch: %d process%s, rendezvous at %s:%d%s\n", world,
                 world == 1 ? "" : "es", options.main_process_ip.c_str(), store.port(),
                 options.comm_backend.empty() ? "" : (", communicator " + options.comm_backend).c_str());

  std::vector<WorkerSpec> specs;
  for (int r = 0; r < world; ++r) {
    WorkerSpec spec;
    spec.argv = options.program;
    spec.label = "rank " + std::to_string(r);
    spec.env = {{"RANK", std::to_string(r)},
                {"LOCAL_RANK", std::to_string(r)},
                {"WORLD_SIZE", std::to_string(world)},
                {"LOCAL_WORLD_SIZE", std::to_string(world)},
                {"NODE_RANK", "0"},
                {"MASTER_ADDR", options.main_process_ip},
                {"MASTER_PORT", std::to_string(store.port())},
                {"ACCEL_LAUNCHER_STORE", "1"}};
    if (!options.comm_backend.empty()) spec.env.emplace_back("ACCEL_COMM_BACKEND", options.comm_backend);
    specs.push_back(std::move(spec));
  }
  WorkerGroupOptions group_options;
  group_options.stop_fd = g_signal_pipe[0];
  const GroupResult result = run_worker_group(specs, group_options);
  if (result.exit_code() != 0)
    std::fprintf(stderr, "accel launch: %s\n", result.failure_report().c_str());
  return result.exit_code();
}

}  // namespace accel::launch
