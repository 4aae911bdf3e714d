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

bool Work::is_completed() const {
  std::lock_guard lock(mutex_);
  return done_;
}

void Work::finish(std::exception_ptr error) {
  {
    std::lock_guard lock(mutex_);
    done_ = true;
    error_ = std::move(error);
  }
  done_cv_.notify_all();
}

}  // namespace accel
