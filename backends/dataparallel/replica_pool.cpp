#include "backends/dataparallel/replica_pool.hpp"

#include <algorithm>
#include <string>

#include "foundation/error.hpp"
#include "foundation/reduce.hpp"

namespace accel {

ReplicaPool::ReplicaPool(int workers, std::function<void(int)> init) : init_(std::move(init)) {
  ACCEL_CHECK_ARG(workers >= 1, "DataParallel: " + std::to_string(workers) +
                                    " replicas asked for, at least 1 is needed");
  errors_.resize(std::size_t(workers));
  init_errors_.resize(std::size_t(workers));
  threads_.reserve(std::size_t(workers));
  for (int k = 0; k < workers; ++k) threads_.emplace_back([this, k] { work(k); });
}

ReplicaPool::~ReplicaPool() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  start_.notify_all();
  for (std::thread& t : threads_) t.join();
}

void ReplicaPool::work(int k) {
  if (init_) {
    try {
      init_(k);
    } catch (...) {
      init_errors_[std::size_t(k)] = std::current_exception();  // every run reports it
    }
  }
  std::uint64_t seen = 0;
  while (true) {
    const std::function<void(int)>* task = nullptr;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      start_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      task = task_;
    }
    std::exception_ptr error;
    if (!init_errors_[std::size_t(k)]) {
      try {
        (*task)(k);
      } catch (...) {
        error = std::current_exception();
      }
    }
    std::lock_guard<std::mutex> lock(mutex_);
    if (error) errors_[std::size_t(k)] = error;
    if (--pending_ == 0) done_.notify_one();
  }
}

void ReplicaPool::run(const std::function<void(int)>& fn) {
  std::lock_guard<std::mutex> one_run(run_mutex_);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    task_ = &fn;
    pending_ = size();
    ++generation_;
  }
  start_.notify_all();
  std::vector<std::exception_ptr> errors;
  {
    std::unique_lock<std::mutex> lock(mutex_);
    done_.wait(lock, [&] { return pending_ == 0; });
    task_ = nullptr;
    errors = errors_;
    std::fill(errors_.begin(), errors_.end(), nullptr);
    for (std::size_t k = 0; k < errors.size(); ++k)
      if (init_errors_[k]) errors[k] = init_errors_[k];
  }
  for (std::size_t k = 0; k < errors.size(); ++k) {
    if (!errors[k]) continue;
    try {
      std::rethrow_exception(errors[k]);
    } catch (const std::exception& e) {
      throw Error("replica " + std::to_string(k) + ": " + e.what());
    } catch (...) {
      throw Error("replica " + std::to_string(k) + ": unknown exception");
    }
  }
}

void ReplicaPool::run_ranges(std::size_t count,
                             const std::function<void(std::size_t, std::size_t)>& fn) {
  if (count == 0) return;
  run([&](int k) {
    const Shard s = shard_of(count, size(), k);
    if (s.count > 0) fn(s.offset, s.offset + s.count);
  });
}

}  // namespace accel
