#include "accelerate/process_group.hpp"

#include <charconv>
#include <cmath>

#include "backends/comm/error.hpp"
#include "backends/comm/prefix_store.hpp"
#include "backends/comm/registry.hpp"
#include "backends/comm/tcp_store.hpp"

namespace accel {
namespace {

constexpr Milliseconds kExitHandshakeTimeout = std::chrono::seconds(10);

std::string exit_key(int rank) { return "process_group/exited/" + std::to_string(rank); }

}  // namespace

std::string resolve_backend(const ProcessGroupOptions& options, const ProcessEnv& env) {
  if (!options.backend.empty()) return options.backend;
  const std::string from_env = env_string("ACCEL_COMM_BACKEND", "");
  if (!from_env.empty()) return from_env;
  return env.world_size > 1 ? "auto" : "local";
}

Milliseconds resolve_timeout(const ProcessGroupOptions& options) {
  if (options.timeout) return *options.timeout;
  const std::string text = env_string("ACCEL_COMM_TIMEOUT", "");
  if (text.empty()) return kDefaultCommTimeout;
  double seconds = 0;
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), seconds);
  if (ec != std::errc() || ptr != text.data() + text.size() || !(seconds > 0) ||
      !std::isfinite(seconds))
    throw ConfigError("ACCEL_COMM_TIMEOUT='" + text + "' is not a positive number of seconds");
  return Milliseconds(std::max<long long>(1, std::llround(seconds * 1000)));
}

ProcessGroup::ProcessGroup(ProcessEnv env, std::unique_ptr<TcpStoreServer> server, StorePtr store,
                           CommunicatorPtr comm)
    : env_(std::move(env)),
      server_(std::move(server)),
      store_(std::move(store)),
      comm_(std::move(comm)) {}

ProcessGroup::~ProcessGroup() {
  comm_.reset();
  if (!store_) return;
  try {
    store_->set(exit_key(env_.rank), "1");
    if (server_) {
      std::vector<std::string> keys;
      for (int r = 0; r < env_.world_size; ++r) keys.push_back(exit_key(r));
      store_->wait(keys, kExitHandshakeTimeout);
    }
  } catch (const std::exception&) {
    // A rank that already died cannot be waited for; exiting is all that is left to do.
  }
}

std::unique_ptr<ProcessGroup> init_process_group(const ProcessGroupOptions& options) {
  ProcessEnv env = read_process_env();
  const std::string backend = resolve_backend(options, env);
  const Milliseconds timeout = resolve_timeout(options);

  std::unique_ptr<TcpStoreServer> server;
  StorePtr store;
  // MPI brings its own rendezvous; the world of one needs none.
  if (backend != "mpi" && backend != "local") {
    const std::string token = env_string("ACCEL_STORE_TOKEN", "");
    if (env.rank == 0 && !env.launcher_hosts_store)
      server = std::make_unique<TcpStoreServer>(env.master_addr, env.master_port, token);
    TcpStoreOptions store_options;
    store_options.token = token;
    store_options.connect_timeout = timeout;
    store_options.timeout = timeout;
    store = std::make_shared<TcpStore>(env.master_addr, env.master_port, store_options);
    // `accel launch` keeps one store across restarts: each attempt rendezvouses in its own
    // namespace, so keys a failed attempt left behind cannot pair this one with dead peers.
    const std::string attempt = env_string("ACCEL_RESTART_COUNT", "");
    if (env.launcher_hosts_store && !attempt.empty())
      store = std::make_shared<PrefixStore>("attempt/" + attempt, std::move(store));
  }

  CommOptions comm_options;
  comm_options.rank = env.rank;
  comm_options.world_size = env.world_size;
  comm_options.store = store;
  comm_options.timeout = timeout;
  comm_options.group_name = options.group_name;
  comm_options.cuda_device = env.local_rank;
  // A job rendezvousing on loopback stays on loopback; otherwise Gloo listens on this
  // host's own name (ACCEL_GLOO_HOSTNAME picks an address explicitly).
  const bool loopback = env.master_addr == "localhost" || env.master_addr.starts_with("127.");
  comm_options.hostname = env_string("ACCEL_GLOO_HOSTNAME", loopback ? "127.0.0.1" : "");
  CommunicatorPtr comm = create_communicator(backend, comm_options);
  return std::make_unique<ProcessGroup>(std::move(env), std::move(server), std::move(store),
                                        std::move(comm));
}

}  // namespace accel
