#pragma once
// The asynchronous handle every communicator call returns (c10d's Work): the operation runs
// in the background, wait(timeout) blocks for it and rethrows the error it failed with.

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <string>

namespace accel {

class Work {
 public:
  // `description` names the operation for error messages: "rank 1: all_reduce #7".
  explicit Work(std::string description) : description_(std::move(description)) {}

  // Blocks until the operation finished; rethrows its error. Throws TimeoutError naming the
  // operation when it has not finished within `timeout`.
  void wait(std::chrono::milliseconds timeout = std::chrono::minutes(30));
  bool is_completed() const;
  const std::string& description() const { return description_; }

  // Called once by whoever ran the operation.
  void finish(std::exception_ptr error = nullptr);

 private:
  std::string description_;
  mutable std::mutex mutex_;
  std::condition_variable done_cv_;
  bool done_ = false;
  std::exception_ptr error_;
};

using WorkPtr = std::shared_ptr<Work>;

}  // namespace accel
