#include "backends/comm/work.hpp"

#include "foundation/error.hpp"

namespace accel {

std::string OperationLabel::text() const {
  const std::string buffer = std::to_string(count) + " x " + std::string(dtype_name(dtype));
  const std::string reduce(reduce_op_name(op));
  std::string what;
  switch (kind) {
    case Kind::all_reduce:
      what = "all_reduce(" + reduce + ", " + buffer + ")";
      break;
    case Kind::broadcast:
      what = "broadcast(root " + std::to_string(peer) + ", " + buffer + ")";
      break;
    case Kind::all_gather:
      what = "all_gather(" + buffer + ")";
      break;
    case Kind::reduce_scatter:
      what = "reduce_scatter(" + reduce + ", " + buffer + ")";
      break;
    case Kind::barrier:
      what = "barrier";
      break;
    case Kind::send:
      what =
          "send(to " + std::to_string(peer) + ", tag " + std::to_string(tag) + ", " + buffer + ")";
      break;
    case Kind::recv:
      what = "recv(from " + std::to_string(peer) + ", tag " + std::to_string(tag) + ", " + buffer +
             ")";
      break;
  }
  return "rank " + std::to_string(rank) + ": " + what + " #" + std::to_string(seq);
}

WorkPtr Work::completed() {
  static Work* const done = [] {
    auto* work = new Work(OperationLabel{});
    work->finish_unshared(nullptr);
    return work;
  }();
  // The aliasing constructor with no owner: copies and drops touch no count.
  return WorkPtr(WorkPtr(), done);
}

std::string Work::description() const {
  if (this == completed().get()) return "an operation that completed before its call returned";
  return label_.text();
}

template <typename Ready>
bool Work::wait_for_verdict(std::unique_lock<std::mutex>& lock, std::chrono::milliseconds timeout,
                            Ready ready) {
  if (ready()) return true;  // the usual case after an inline operation: no clock read
  ++waiters_;
  const auto until = std::chrono::steady_clock::now() + timeout;
  bool ok = done_cv_.wait_until(lock, until, ready);
  // The operation's own deadline passes about now (it started at most a moment after the
  // caller began to wait as long): its communicator's error is the one that says which peer
  // never came. A shorter wait is the caller's own business and ends when it said.
  constexpr auto kMoment = std::chrono::seconds(1);
  if (!ok && deadline_ && *deadline_ <= until + kMoment)
    ok = done_cv_.wait_until(lock, *deadline_ + kVerdictSlack, ready);
  --waiters_;
  return ok;
}

void Work::wait(std::chrono::milliseconds timeout) {
  if (done_.load(std::memory_order_acquire)) {
    if (error_) std::rethrow_exception(error_);
    return;
  }
  std::unique_lock lock(mutex_);
  if (!wait_for_verdict(lock, timeout, [&] { return done_.load(std::memory_order_relaxed); }))
    throw TimeoutError(description() + " did not complete within " +
                       std::to_string(timeout.count()) + " ms (Work::wait)");
  if (error_) std::rethrow_exception(error_);
}

void Work::wait_stream(DeviceStream stream, std::chrono::milliseconds timeout) {
  std::shared_ptr<DeviceCompletion> completion;
  {
    std::unique_lock lock(mutex_);
    // Host operations never get a completion: this is wait(). Device ones get it as soon as
    // the worker launched them, well before they finish.
    if (!wait_for_verdict(lock, timeout,
                          [&] { return done_.load(std::memory_order_relaxed) || completion_; }))
      throw TimeoutError(description() + " was not launched within " +
                         std::to_string(timeout.count()) + " ms (Work::wait_stream)");
    if (done_.load(std::memory_order_relaxed)) {
      if (error_) std::rethrow_exception(error_);
      return;  // finished on the device, as the host has seen: nothing left to order
    }
    completion = completion_;
  }
  completion->order_before(stream);
}

bool Work::is_completed() const { return done_.load(std::memory_order_acquire); }

void Work::launched(std::shared_ptr<DeviceCompletion> completion) {
  bool waited_for = false;
  {
    std::lock_guard lock(mutex_);
    if (done_.load(std::memory_order_relaxed)) return;
    completion_ = std::move(completion);
    waited_for = waiters_ > 0;
  }
  if (waited_for) done_cv_.notify_all();
}

void Work::started(std::chrono::steady_clock::time_point deadline) {
  std::lock_guard lock(mutex_);
  deadline_ = deadline;
}

void Work::finish_unshared(std::exception_ptr error) {
  error_ = std::move(error);
  done_.store(true, std::memory_order_release);
}

void Work::reuse(const OperationLabel& label) {
  label_ = label;
  error_ = nullptr;
  completion_.reset();
  deadline_.reset();
  done_.store(false, std::memory_order_relaxed);
}

void Work::finish(std::exception_ptr error) {
  std::shared_ptr<DeviceCompletion> completion;
  bool waited_for = false;
  {
    std::lock_guard lock(mutex_);
    error_ = std::move(error);
    done_.store(true, std::memory_order_release);
    completion = std::move(completion_);  // released outside the lock
    waited_for = waiters_ > 0;
  }
  if (waited_for) done_cv_.notify_all();
}

}  // namespace accel
