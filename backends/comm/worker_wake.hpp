#pragma once
// How a communicator's worker thread sleeps and is woken: a timerfd, so an issuing thread can
// wake it now (a queued operation) or set it to wake later (the waiter's claim window,
// communicator.hpp) without waking it in between, and take a later wake back when the waiter
// ran the operation itself. A condition variable can only wake at once: two wakes per claimed
// operation, which cost more than the hand-off they save (bench/README).
//
// now(), at() and cancel() are called with the communicator's lock held, so they apply in one
// order; sleep() is the worker's, without the lock, and returns on any wake (or spuriously):
// the worker checks its state again after every return. None of them throws: with the
// descriptor made and valid arguments the kernel refuses nothing but an interrupted poll, and
// a poll that fails otherwise only returns early.

#include <chrono>
#include <optional>

namespace accel {

class WorkerWake {
 public:
  using Clock = std::chrono::steady_clock;  // CLOCK_MONOTONIC, as the timerfd's

  WorkerWake();  // CommError when the kernel gives no timer (out of descriptors)
  ~WorkerWake();
  WorkerWake(const WorkerWake&) = delete;
  WorkerWake& operator=(const WorkerWake&) = delete;

  void now() noexcept;                  // the sleeper returns at once (or the next sleep does)
  void at(Clock::time_point) noexcept;  // ... once this time has come; replaces any earlier setting
  void cancel() noexcept;               // takes back a wake that has not been slept through yet

  // Returns when woken, or after `timeout` when given.
  void sleep(std::optional<Clock::duration> timeout = std::nullopt) noexcept;

 private:
  void set(Clock::time_point when) noexcept;
  int fd_ = -1;
};

}  // namespace accel
