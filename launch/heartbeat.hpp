#pragma once
// The launchers of a job watching each other for as long as it lives (torchrun's keep-alive):
// each bumps its counter launcher/alive/<m> in the store every interval, from a thread of its
// own, so a launcher busy starting or stopping workers still beats. Machine 0 watches every
// other machine, the others watch machine 0. A machine whose counter, once seen, has not moved
// for interval x misses is lost; a launcher whose own beats do not reach the store for that
// long has lost machine 0 (which hosts it).

#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "foundation/store/store.hpp"

namespace accel::launch {

struct HeartbeatOptions {
  int num_machines = 1;
  int machine_rank = 0;
  std::chrono::milliseconds interval{std::chrono::seconds(5)};
  int misses = 3;  // beats a machine may miss before it is lost
  // Where the counters live: one set per elastic round, whose machine numbers are its own.
  std::string key_prefix = "launcher/alive/";
};

class Heartbeat {
 public:
  // `store` is this thread's own client (a blocked request must not hold up the launcher's).
  Heartbeat(StorePtr store, HeartbeatOptions options);
  ~Heartbeat();
  Heartbeat(const Heartbeat&) = delete;
  Heartbeat& operator=(const Heartbeat&) = delete;

  // interval x misses: how long a machine may stay silent.
  std::chrono::milliseconds limit() const { return opt_.interval * opt_.misses; }
  std::string limit_text() const;  // "15 s"

  // The first of `among` that was heard from once and then stayed silent for limit().
  std::optional<int> lost(const std::vector<int>& among) const;
  // Why our own beats stopped reaching the store, once they did not for limit().
  std::optional<std::string> store_lost() const;

  std::string alive_key(int machine) const { return opt_.key_prefix + std::to_string(machine); }

 private:
  void run();
  void beat_and_watch();

  StorePtr store_;
  HeartbeatOptions opt_;
  std::vector<int> watched_;

  mutable std::mutex mutex_;
  std::condition_variable wake_;
  bool stopping_ = false;
  struct Seen {
    std::int64_t value = 0;
    std::chrono::steady_clock::time_point since;
  };
  std::map<int, Seen> seen_;
  std::chrono::steady_clock::time_point last_beat_;  // our last beat that reached the store
  std::optional<std::string> store_lost_;
  std::thread thread_;
};

}  // namespace accel::launch
