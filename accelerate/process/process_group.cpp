#include "accelerate/process/process_group.hpp"

#include <atomic>
#include <charconv>
#include <cmath>

#include "backends/comm/registry.hpp"
#include "foundation/error.hpp"
#include "foundation/process_group_records.hpp"
#include "foundation/store/prefix_store.hpp"
#include "foundation/store/tcp_store.hpp"

namespace accel {
namespace {

namespace records = process_group_records;

// Process groups alive in this process that talk to other processes. A second one would
// rendezvous again on the same store and port as the first (a rank-0 server already bound,
// keys of the first group read as the second's): refused at once instead.
std::atomic<int> live_groups{0};

constexpr Milliseconds kExitHandshakeTimeout = std::chrono::seconds(10);

// Records that this rank joins `group` with `backend`; throws ConfigError when an earlier rank
// joined with another communicator (they would wait for each other in two rendezvous until
// the timeout).
void record_joining(Store& store, const ProcessEnv& env, const std::string& group,
                    const std::string& backend) {
  // The i-th group of each process is compared with the i-th of the others.
  static std::atomic<int> calls{0};
  const std::string mine = backend + "|" + std::to_string(env.rank);
  const std::string first = store.compare_set(records::communicator_key(calls++, group), "", mine);
  const auto bar = first.find('|');
  if (first.substr(0, bar) != backend) {
    throw ConfigError("rank " + std::to_string(env.rank) + " asks for the '" + backend +
                      "' communicator, but rank " + first.substr(bar + 1) +
                      " joined the process group with '" + first.substr(0, bar) +
                      "': every rank must use the same one (ACCEL_COMM_BACKEND, "
                      "--cpu_communicator)");
  }
  store.set(records::joined_key(env.rank), backend);
  store.add(records::kJoinedCount, 1);
}

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
                           CommunicatorPtr comm, bool counted)
    : env_(std::move(env)),
      server_(std::move(server)),
      store_(std::move(store)),
      comm_(std::move(comm)),
      counted_(counted) {}

ProcessGroup::~ProcessGroup() {
  if (counted_) --live_groups;
  comm_.reset();
  if (!store_) return;
  try {
    store_->set(records::left_key(env_.rank), "1");
    if (server_) {
      std::vector<std::string> keys;
      for (int r = 0; r < env_.world_size; ++r) keys.push_back(records::left_key(r));
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
  const bool counted = backend != "local";
  if (counted && live_groups.load() > 0)
    throw InvalidArgument(
        "rank " + std::to_string(env.rank) +
        ": a second Accelerator (or process group) in this "
        "process while the first is alive: it would rendezvous again on the same store (" +
        env.master_addr + ":" + std::to_string(env.master_port) + ", backend " + backend +
        "). Create one Accelerator per process and prepare every model through it; several "
        "prepared models per accelerator are not supported yet");

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
    if (env.launcher_hosts_store && !env_string("ACCEL_RESTART_COUNT", "").empty())
      store = std::make_shared<PrefixStore>(
          records::attempt_prefix(env_int("ACCEL_RESTART_COUNT", 0)), std::move(store));
    record_joining(*store, env, options.group_name, backend);
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
  if (counted) ++live_groups;
  auto group = std::make_unique<ProcessGroup>(std::move(env), std::move(server), std::move(store),
                                              std::move(comm), counted);
  group->comm_options = comm_options;
  return group;
}

CommunicatorPtr ProcessGroup::subgroup(std::string_view backend, int rank, int world_size,
                                       const std::string& name) const {
  ACCEL_CHECK_ARG(store_ != nullptr, "rank " + std::to_string(env_.rank) + ": a group of some " +
                                         "ranks needs the rendezvous store, which the " +
                                         std::string(comm_->backend_name()) +
                                         " communicator does not use");
  CommOptions options = comm_options;
  options.rank = rank;
  options.world_size = world_size;
  options.group_name = name;
  return create_communicator(backend, options);
}

}  // namespace accel
