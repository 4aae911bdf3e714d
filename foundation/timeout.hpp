#pragma once
// The one default for how long anything waits on another rank or process: a collective,
// joining, a store request, a Work. 30 minutes, as c10d's: long enough for a slow first
// step, short enough that a lost rank ends the job. ACCEL_COMM_TIMEOUT overrides it per job.

#include <chrono>

namespace accel {

using Milliseconds = std::chrono::milliseconds;

inline constexpr Milliseconds kDefaultCommTimeout = std::chrono::minutes(30);

}  // namespace accel
