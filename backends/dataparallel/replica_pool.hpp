#pragma once
// K persistent worker threads, one per DataParallel replica: run(fn) runs fn(k) on worker k
// for every k at once and returns when all are done. Persistent because a replica's forward
// and backward take milliseconds and a thread start costs tens of microseconds, and because a
// framework's per-thread settings (LibTorch's intra-op thread count) are set once per worker.

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace accel {

class ReplicaPool {
 public:
  // init(k) runs on worker k once, before its first task (e.g. its intra-op thread count).
  explicit ReplicaPool(int workers, std::function<void(int)> init = {});
  ~ReplicaPool();
  ReplicaPool(const ReplicaPool&) = delete;
  ReplicaPool& operator=(const ReplicaPool&) = delete;

  int size() const { return int(threads_.size()); }

  // Runs fn(k) on worker k for k = 0 .. size()-1 and waits for all of them. If any threw, the
  // lowest such k's error is rethrown as accel::Error "replica k: <what>" once all finished.
  // No timeout: the workers run this process's own computation, which waits on nobody else.
  // Not reentrant: one run at a time (a second caller waits for the first).
  void run(const std::function<void(int)>& fn);

  // Splits [0, count) into size() contiguous ranges (shard_of) and runs fn(begin, end) on each
  // worker with a non-empty range: element-wise work over replicas' buffers.
  void run_ranges(std::size_t count, const std::function<void(std::size_t, std::size_t)>& fn);

 private:
  void work(int k);

  std::vector<std::thread> threads_;
  std::function<void(int)> init_;
  std::mutex run_mutex_;  // one run at a time
  std::mutex mutex_;
  std::condition_variable start_, done_;
  const std::function<void(int)>* task_ = nullptr;
  std::uint64_t generation_ = 0;
  int pending_ = 0;
  bool stop_ = false;
  std::vector<std::exception_ptr> errors_;       // this run's, per worker
  std::vector<std::exception_ptr> init_errors_;  // written before the worker's first wait
};

}  // namespace accel
