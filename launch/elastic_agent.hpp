#pragma once
// An elastic job's agent (`--nnodes MIN:MAX`, torchrun's c10d backend): the attempts of
// run_attempts, each one an elastic round (elastic_rendezvous.hpp) with the machines that
// joined it, numbered by join order (the store's host first). A failure or a lost machine
// restarts whoever is left (counted against --max_restarts) once at least MIN meet again; a
// machine that joins a running job restarts it bigger (not counted).

#include <string>

#include "foundation/store/store.hpp"
#include "launch/node_rendezvous.hpp"
#include "launch/restart_loop.hpp"

namespace accel::launch {

struct ElasticStore {
  StorePtr store;            // the agent's client
  StorePtr heartbeat_store;  // a second one, for the heartbeat's thread
  bool hosted_here = false;
  std::string endpoint;  // host:port, as errors name it
};

// `plan` has everything but join and newcomer_waiting; `round` the options each round's
// NodeRendezvous starts from (heartbeat, timeouts, interrupt).
int run_elastic(AttemptPlan plan, NodeRendezvousOptions round, int min_machines, int max_machines,
                const ElasticStore& store);

}  // namespace accel::launch
