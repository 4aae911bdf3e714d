#pragma once
// The rounds of an elastic job (`--nnodes MIN:MAX`, torchrun's c10d rendezvous): the agents
// of whichever machines are up meet in the store, and each round fixes who takes part and
// with which node rank. A round closes when MAX agents joined, or when at least MIN did and
// no other came for the last-call time; agents that come after it closed (or beyond MAX)
// wait in the next round, whose first joiner tells the running round's agents that the job
// could grow. Keys (under "elastic/", beside the static launcher's "launcher/"):
//
//   elastic/open                 the round new agents join ("0", "1", ...)
//   elastic/<r>/joined           how many agents joined round r (each gets its order)
//   elastic/<r>/node/<i>         the i-th joiner's name (host:pid), for reports
//   elastic/<r>/closed           how many of them take part (the first closer wins)
//   elastic/<r>/ended            an agent of round r left it (to restart): round r+1 may close
//   elastic/host                 the name of the agent hosting the store (node rank 0)
//   elastic/<r>/timed_out        why the wait for round r ended (every agent in it says so)
//
// Round r+1 closes only after round r ended, so an agent that arrives while a round runs
// waits for it (the running agents see it and restart bigger, below MAX) instead of starting
// a job of its own.
// Every wait is bounded by the join timeout and names what it waited for.

#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "foundation/store/store.hpp"

namespace accel::launch {

struct ElasticRendezvousOptions {
  int min_nodes = 1;
  int max_nodes = 1;
  std::chrono::milliseconds join_timeout{std::chrono::seconds(600)};  // torchrun's defaults
  std::chrono::milliseconds last_call_timeout{std::chrono::seconds(30)};
  std::chrono::milliseconds poll_interval{100};
  std::string node_name;  // this agent, as reports name it (unique: host:pid)
  // The agent hosting the store takes node rank 0 of every round it is in: the rank that
  // decides each round's outcome, which only the store's own loss can take away.
  bool hosts_store = false;
  std::function<bool()> interrupted;  // gives up the wait when true
};

// One closed round, as this agent takes part in it.
struct ElasticRound {
  int round = 0;      // also the namespace of its workers' keys (attempt/<round>/)
  int node_rank = 0;  // this agent's order among the round's agents
  int num_nodes = 0;
  std::vector<std::string> nodes;  // the agents' names, by node rank
};

class ElasticRendezvous {
 public:
  ElasticRendezvous(StorePtr store, ElasticRendezvousOptions options);

  // Joins the open round (or, leaving round `after`, marks it ended and joins a later one)
  // and returns once a round closed with this agent in it. Throws
  // TimeoutError naming the round, how many joined and MIN, and Interrupted.
  ElasticRound next_round(int after = -1);

  // Whether an agent waits in the round after `round` (the job could grow), cheap enough to
  // ask every monitor interval.
  bool newcomer_waiting(const ElasticRound& round);

  struct Interrupted {};

 private:
  std::string key(int round, const std::string& what) const;
  int open_round();
  // Closes round r with `count` agents unless another agent closed it first; returns the
  // count that stands.
  int close(int round, int count);
  // Ends the wait for round r on every agent in it with one reason (the first agent's; `why`
  // is ours, "" when another gave up first): throws TimeoutError.
  [[noreturn]] void give_up(int round, const std::string& why);

  StorePtr store_;
  ElasticRendezvousOptions opt_;
};

}  // namespace accel::launch
