#pragma once
// Waiting for other ranks without burning the cores that compute: a brief spin (the peer is
// usually a few microseconds away), then sleep on a futex in the shared segment, woken by
// whoever posts progress. Every wait is bounded by the operation's deadline, and while asleep
// it looks, every few milliseconds, whether the ranks it waits for still run, so a rank that
// died is reported at once instead of after the timeout.

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>

#include "backends/comm/shm/segment.hpp"

namespace accel::shm {

using Clock = std::chrono::steady_clock;

// After changing a counter in the segment: wakes the sleepers, if there are any.
void post(Header& header);

struct WaitPolicy {
  std::chrono::nanoseconds spin{20000};          // busy-poll this long before sleeping
  std::chrono::milliseconds check_interval{10};  // liveness checks while asleep
  // sched_yield every 64 polls while spinning, so a rank waited for that is queued behind this
  // one on the core (ranks outnumber cores, or other work shares them) gets to run.
  bool yield = true;
};

// Blocks until ready() holds. Throws TimeoutError("shm: " + what) at the deadline, or the
// error dead_peer() returns (non-empty = a rank waited for is gone) as CommError.
void wait_until(Header& header, const std::function<bool()>& ready, Clock::time_point deadline,
                const WaitPolicy& policy, const std::function<std::string()>& dead_peer,
                const std::function<std::string()>& what);

}  // namespace accel::shm
