#pragma once
// How the `accel launch` of every machine agrees, attempt by attempt, on starting, on the
// first failure, and on what comes next (done, restart, stop). They talk through the
// rendezvous store machine 0 hosts, under "launcher/" (the workers' keys live under
// "attempt/N/", so neither can confuse the other). One machine is the same code path with a
// world of one launcher.
//
//   launcher/<a>/ready/<m>   machine m is about to start attempt a's workers
//   launcher/<a>/failure     the first failure of attempt a (first writer wins)
//   launcher/<a>/done/<m>    machine m's workers of attempt a have all ended
//   launcher/<a>/decision    machine 0's verdict: success, restart or stop
//   launcher/<a>/ack/<m>     machine m read the final verdict (machine 0 may now exit)
//   launcher/alive/<m>       a counter machine m bumps every heartbeat interval for as long
//                            as it runs (heartbeat.hpp), so a launcher that died or a machine
//                            cut off is noticed, while waiting and while the workers run

#include <chrono>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "foundation/error.hpp"
#include "foundation/store/store.hpp"
#include "launch/heartbeat.hpp"

namespace accel::launch {

struct Failure {
  int machine = 0;
  int exit_code = 1;        // what every launcher exits with when the job stops on it
  bool restartable = true;  // false: the user interrupted, or a launcher was lost
  // false: a restart this failure causes is not counted against --max_restarts (an elastic
  // job restarting bigger because a machine joined).
  bool counts = true;
  std::string what;  // "rank 3 exited with code 3"

  // Whether this failure restarts the job with `restarts_left` counted restarts to go.
  bool restarts(int restarts_left) const { return restartable && (restarts_left > 0 || !counts); }

  std::string encode() const;
  static Failure decode(const std::string& text);
};

enum class Decision { success, restart, stop };

struct Outcome {
  Decision decision = Decision::success;
  std::optional<Failure> failure;  // set for restart and stop
};

struct NodeRendezvousOptions {
  int num_machines = 1;
  int machine_rank = 0;
  std::chrono::milliseconds join_timeout{std::chrono::seconds(300)};
  std::chrono::milliseconds poll_interval{100};
  // A machine whose alive counter does not move for interval x misses is lost.
  std::chrono::milliseconds heartbeat_interval{std::chrono::seconds(5)};
  int heartbeat_misses = 3;
  // The signal (SIGINT/SIGTERM) that interrupted this launcher, 0 while none did. Waits give
  // up on it, and the job then stops without a restart.
  std::function<int()> interrupt_signal;
  // Elastic jobs: a lost machine is a failure to restart from (without it), and each round
  // has its own heartbeat counters.
  bool lost_restartable = false;
  std::string alive_prefix = "launcher/alive/";
  // How errors name the store when it is lost ("" = machine 0's).
  std::string store_name;
  // The machines' names, by rank, for reports (elastic rounds: host:pid); may be empty.
  std::vector<std::string> machine_names;
};

class NodeRendezvous {
 public:
  // `heartbeat_store`: a second client of the same store, for the heartbeat's own thread.
  NodeRendezvous(StorePtr store, StorePtr heartbeat_store, NodeRendezvousOptions options);

  // Returns once every machine is ready for attempt `attempt`. Throws TimeoutError naming
  // the machines that did not come, or Interrupted once this launcher is interrupted.
  void join(int attempt);

  // Cheap enough to call every monitor interval while workers run: whether some machine
  // reported a failure of this attempt. A machine found lost is reported here as that
  // failure; machine 0 lost (our beats no longer reach its store) throws MachineLost.
  bool failure_reported(int attempt);

  // Publishes a failure unless another was first; returns the one that counts.
  Failure report_failure(int attempt, const Failure& failure);

  // After this machine's workers of `attempt` ended (local_exit 0 = all succeeded): waits for
  // machine 0's verdict (machine 0: decides it, once every machine is done or some machine
  // failed). `restarts_left` only matters on machine 0. Bounded: a silent machine is a failure.
  Outcome finish(int attempt, int local_exit, int restarts_left);

  struct Interrupted {};

 private:
  std::string key(int attempt, const std::string& what) const;
  std::string key(int attempt, const std::string& what, int machine) const;
  // The failure that stops the job when machine m is lost.
  Failure lost_failure(int machine) const;
  void throw_if_store_lost() const;
  std::string store_lost_text() const;  // "machine 0 is lost: its rendezvous store"
  int interrupted() const;

  StorePtr store_;
  NodeRendezvousOptions opt_;
  Heartbeat heartbeat_;
};

// Machine 0, and with it the store, can no longer be reached.
class MachineLost : public Error {
 public:
  using Error::Error;
};

}  // namespace accel::launch
