#include "backends/comm/work.hpp"

#include "backends/comm/error.hpp"

namespace accel {

void Work::wait(std::chrono::milliseconds timeout) {
  std::unique_lock lock(mutex_);
  if (!done_cv_.wait_for(lock, timeout, [&] { return done_; }))
    throw TimeoutError(description_ + " did not complete within " +
                       std::to_string(timeout.count()) + " ms (Work::wait)");
  if (error_) std::rethrow_exception(error_);
}

void Work::wait_stream(DeviceStream stream, std::chrono::milliseconds timeout) {
  std::shared_ptr<DeviceCompletion> completion;
  {
    std::unique_lock lock(mutex_);
    // Host operations never get a completion: this is wait(). Device ones get it as soon as
    // the worker launched them, well before they finish.
    if (!done_cv_.wait_for(lock, timeout, [&] { return done_ || completion_ != nullptr; }))
      throw TimeoutError(description_ + " was not launched within " +
                         std::to_string(timeout.count()) + " ms (Work::wait_stream)");
    if (done_) {
      if (error_) std::rethrow_exception(error_);
      return;  // finished on the device, as the host has seen: nothing left to order
    }
    completion = completion_;
  }
  completion->order_before(stream);
}

bool Work::is_completed() const {
  std::lock_guard lock(mutex_);
  return done_;
}

void Work::launched(std::shared_ptr<DeviceCompletion> completion) {
  {
    std::lock_guard lock(mutex_);
    if (done_) return;
    completion_ = std::move(completion);
  }
  done_cv_.notify_all();
}

void Work::finish(std::exception_ptr error) {
  std::shared_ptr<DeviceCompletion> completion;
  {
    std::lock_guard lock(mutex_);
    done_ = true;
    error_ = std::move(error);
    completion = std::move(completion_);  // released outside the lock
  }
  done_cv_.notify_all();
}

}  // namespace accel
