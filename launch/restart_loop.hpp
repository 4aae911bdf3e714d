#pragma once
// The attempts of one job on one machine: join the other machines, run this machine's
// workers, agree on the outcome, and start over while --max_restarts allows. Each attempt's
// workers get ACCEL_RESTART_COUNT (and torchrun's TORCHELASTIC_RESTART_COUNT), which also
// names their rendezvous namespace in the store ("attempt/N/", see init_process_group), so
// keys a failed attempt left behind cannot confuse the next one.

#include <functional>
#include <string>
#include <vector>

#include "launch/launch_options.hpp"
#include "launch/membership.hpp"
#include "launch/node_rendezvous.hpp"
#include "launch/worker_group.hpp"

namespace accel::launch {

// One attempt as this machine takes part in it. A static job's machines are the same in
// every attempt; an elastic job's (elastic_agent.hpp) are whoever joined its round.
struct Attempt {
  int number = 0;    // the workers' namespace in the store (attempt/N/), ACCEL_RESTART_COUNT
  int restarts = 0;  // restarts counted against --max_restarts before this attempt
  int machine_rank = 0;
  int num_machines = 1;
  std::string label;                     // how reports name this machine: "machine 1 (host:pid)"
  NodeRendezvous* rendezvous = nullptr;  // the machines' agreement on this attempt
};

struct AttemptPlan {
  const LaunchOptions* options = nullptr;
  // Returns once every machine of the next attempt is ready (previous: null for the first;
  // restarts: counted so far). Throws TimeoutError, or NodeRendezvous::Interrupted.
  std::function<Attempt(const Attempt* previous, int restarts)> join;
  // Elastic jobs: whether a machine waits to join (the attempt then restarts bigger).
  std::function<bool(const Attempt&)> newcomer_waiting;
  // The workers of an attempt on this machine (their environment already complete).
  std::function<std::vector<WorkerSpec>(const Attempt&)> workers;
  StorePtr store;                         // the launchers' client of the rendezvous store
  int stop_fd = -1;                       // readable once the launcher was interrupted
  std::function<int()> interrupt_signal;  // which signal, 0 = none
  bool prefix_output = true;              // false when mpirun tags the lines itself
};

// Returns the exit status of the job (see launch()).
int run_attempts(const AttemptPlan& plan);

}  // namespace accel::launch
