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

[[noreturn]] void fail(const char* call) {
  throw CommError(std::string("the communicator's worker wake-up: ") + call +
                  " failed: " + std::strerror(errno));
}

timespec to_timespec(std::chrono::nanoseconds ns) {
  const auto s = std::chrono::duration_cast<std::chrono::seconds>(ns);
  return timespec{static_cast<time_t>(s.count()), static_cast<long>((ns - s).count())};
}

}  // namespace

WorkerWake::WorkerWake() : fd_(timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC | TFD_NONBLOCK)) {
  if (fd_ < 0) fail("timerfd_create");
}

WorkerWake::~WorkerWake() { ::close(fd_); }

void WorkerWake::set(Clock::time_point when) {
  itimerspec spec{};
  spec.it_value = to_timespec(when.time_since_epoch());
  // An absolute time already past fires at once; {0, 0} would disarm instead.
  if (spec.it_value.tv_sec == 0 && spec.it_value.tv_nsec == 0) spec.it_value.tv_nsec = 1;
  if (timerfd_settime(fd_, TFD_TIMER_ABSTIME, &spec, nullptr) != 0) fail("timerfd_settime");
}

void WorkerWake::now() { set(Clock::time_point(Clock::duration(1))); }

void WorkerWake::at(Clock::time_point when) { set(when); }

void WorkerWake::cancel() {
  // Disarming also drops an expiry not yet read (the kernel resets the count).
  const itimerspec off{};
  if (timerfd_settime(fd_, 0, &off, nullptr) != 0) fail("timerfd_settime");
}

void WorkerWake::sleep(std::optional<Clock::duration> timeout) {
  pollfd p{fd_, POLLIN, 0};
  timespec limit{};
  if (timeout) limit = to_timespec(std::max(*timeout, Clock::duration::zero()));
  if (ppoll(&p, 1, timeout ? &limit : nullptr, nullptr) < 0 && errno != EINTR) fail("ppoll");
  std::uint64_t expiries = 0;
  // Consumes the wake; EAGAIN when it timed out, or a cancel() came between poll and read.
  (void)!::read(fd_, &expiries, sizeof expiries);
}

}  // namespace accel
