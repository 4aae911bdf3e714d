#include "backends/comm/worker_wake.hpp"

#include <poll.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string>

#include "core/error.hpp"

namespace accel {
namespace {

timespec to_timespec(std::chrono::nanoseconds ns) {
  const auto s = std::chrono::duration_cast<std::chrono::seconds>(ns);
  return timespec{static_cast<time_t>(s.count()), static_cast<long>((ns - s).count())};
}

}  // namespace

WorkerWake::WorkerWake() : fd_(timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC | TFD_NONBLOCK)) {
  if (fd_ < 0)
    throw CommError(std::string("a communicator's worker thread needs a timer: timerfd_create "
                                "failed: ") +
                    std::strerror(errno));
}

WorkerWake::~WorkerWake() { ::close(fd_); }

void WorkerWake::set(Clock::time_point when) noexcept {
  itimerspec spec{};
  spec.it_value = to_timespec(when.time_since_epoch());
  // An absolute time already past fires at once; {0, 0} would disarm instead.
  if (spec.it_value.tv_sec == 0 && spec.it_value.tv_nsec == 0) spec.it_value.tv_nsec = 1;
  timerfd_settime(fd_, TFD_TIMER_ABSTIME, &spec, nullptr);
}

void WorkerWake::now() noexcept { set(Clock::time_point(Clock::duration(1))); }

void WorkerWake::at(Clock::time_point when) noexcept { set(when); }

void WorkerWake::cancel() noexcept {
  // Disarming also drops an expiry not yet read (the kernel resets the count).
  const itimerspec off{};
  timerfd_settime(fd_, 0, &off, nullptr);
}

void WorkerWake::sleep(std::optional<Clock::duration> timeout) noexcept {
  pollfd p{fd_, POLLIN, 0};
  timespec limit{};
  if (timeout) limit = to_timespec(std::max(*timeout, Clock::duration::zero()));
  ppoll(&p, 1, timeout ? &limit : nullptr, nullptr);
  std::uint64_t expiries = 0;
  // Consumes the wake; EAGAIN when it timed out, or a cancel() came between poll and read.
  (void)!::read(fd_, &expiries, sizeof expiries);
}

}  // namespace accel
