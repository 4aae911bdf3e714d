#include "launch/elastic_agent.hpp"

#include <unistd.h>

#include <memory>

#include "launch/elastic_rendezvous.hpp"

namespace accel::launch {
namespace {

void say(const std::string& text) {
  const std::string line = "accel launch: " + text + "\n";
  (void)!write(STDERR_FILENO, line.data(), line.size());
}

std::string node_name() {
  char host[256] = {};
  if (gethostname(host, sizeof(host) - 1) != 0) host[0] = '\0';
  return std::string(host) + ":" + std::to_string(getpid());
}

}  // namespace

int run_elastic(AttemptPlan plan, NodeRendezvousOptions round, int min_machines, int max_machines,
                const ElasticStore& store) {
  const LaunchOptions& options = *plan.options;
  ElasticRendezvousOptions eo;
  eo.min_nodes = min_machines;
  eo.max_nodes = max_machines;
  eo.join_timeout = round.join_timeout;
  eo.last_call_timeout = options.last_call_timeout;
  eo.poll_interval = round.poll_interval;
  eo.node_name = node_name();
  eo.hosts_store = store.hosted_here;
  const auto interrupt = round.interrupt_signal;
  eo.interrupted = [interrupt] { return interrupt && interrupt() != 0; };
  ElasticRendezvous rounds(store.store, eo);
  std::unique_ptr<NodeRendezvous> current;  // this round's agreement and heartbeat

  plan.join = [&](const Attempt* previous, int restarts) {
    // Those who come next read how many restarts were counted (all of us write the same).
    if (previous) store.store->set("elastic/restarts", std::to_string(restarts));
    current.reset();  // the last round's heartbeat stops
    ElasticRound r;
    try {
      r = rounds.next_round(previous ? previous->number : -1);
    } catch (const ElasticRendezvous::Interrupted&) {
      throw NodeRendezvous::Interrupted{};
    }
    std::string nodes;
    for (const std::string& n : r.nodes) nodes += (nodes.empty() ? "" : ", ") + n;
    say("round " + std::to_string(r.round) + ": " + std::to_string(r.num_nodes) +
        (r.num_nodes == 1 ? " machine (" : " machines (") + nodes + "); this is node " +
        std::to_string(r.node_rank));
    NodeRendezvousOptions o = round;
    o.num_machines = r.num_nodes;
    o.machine_rank = r.node_rank;
    o.lost_restartable = true;
    o.alive_prefix = "elastic/" + std::to_string(r.round) + "/alive/";
    o.store_name = "the rendezvous store at " + store.endpoint;
    o.machine_names = r.nodes;
    current = std::make_unique<NodeRendezvous>(store.store, store.heartbeat_store, o);
    current->join(r.round);
    Attempt a;
    a.number = r.round;
    a.restarts = std::stoi(store.store->compare_set("elastic/restarts", "", "0"));
    a.machine_rank = r.node_rank;
    a.num_machines = r.num_nodes;
    a.label = "machine " + std::to_string(r.node_rank) + " (" + eo.node_name + ")";
    a.rendezvous = current.get();
    return a;
  };
  plan.newcomer_waiting = [&](const Attempt& a) {
    ElasticRound r;
    r.round = a.number;
    r.num_nodes = a.num_machines;
    return rounds.newcomer_waiting(r);
  };
  return run_attempts(plan);
}

}  // namespace accel::launch
