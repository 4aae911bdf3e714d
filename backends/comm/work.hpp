#pragma once
// The asynchronous handle every communicator call returns (c10d's Work): the operation runs
// in the background, wait(timeout) blocks for it and rethrows the error it failed with.
//
// Device operations (NCCL) can also be waited for by a CUDA stream instead of the host:
// wait_stream(stream) makes the stream wait for the operation's completion event and returns
// without waiting for the GPU (see Communicator::set_compute_stream for the whole contract).

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "foundation/device_stream.hpp"
#include "foundation/dtype.hpp"
#include "foundation/reduce.hpp"
#include "foundation/timeout.hpp"

namespace accel {

// What a device backend hands the worker when its run_* only launched the operation on the
// backend's own stream: the worker polls it until the operation finished (the Work then
// finishes), a caller's stream may be ordered after it meanwhile.
class DeviceCompletion {
 public:
  virtual ~DeviceCompletion() = default;
  // True once the operation finished on the device; throws when the backend reports an
  // asynchronous error (a peer gone).
  virtual bool poll() = 0;
  // Makes `stream` wait for the operation's completion without blocking the host.
  virtual void order_before(DeviceStream stream) = 0;
  // The operation did not finish within its timeout: stop it (NCCL: abort the communicator).
  virtual void abandon() noexcept = 0;
};

// How long past an operation's own deadline its communicator may take to fail it with its own
// error (Gloo asks the peers which operation each reached, for up to 5 s).
inline constexpr std::chrono::milliseconds kVerdictSlack{std::chrono::seconds(10)};

// What an operation is, for messages: "rank 1: all_reduce(sum, 16 x f32) #7". Kept as fields
// and put into words only when a message needs them: building the text on every call cost
// about 0.4 us, as much as a small collective itself (64 B all_reduce at world 2: MPI 1.68 us
// against 1.19 us without it, shm 0.78 us against 0.36 us).
struct OperationLabel {
  enum class Kind : std::uint8_t {
    all_reduce,
    broadcast,
    all_gather,
    reduce_scatter,
    barrier,
    send,
    recv
  };
  Kind kind = Kind::barrier;
  int rank = 0;
  std::uint64_t seq = 0;
  ReduceOp op = ReduceOp::sum;  // all_reduce, reduce_scatter
  std::size_t count = 0;        // elements of the buffer named (all_gather: its output)
  DType dtype = DType::f32;
  int peer = 0;  // broadcast: the root; send: the destination; recv: the source
  std::uint32_t tag = 0;

  std::string text() const;
};

class Work;
using WorkPtr = std::shared_ptr<Work>;

class Work {
 public:
  explicit Work(const OperationLabel& label) : label_(label) {}

  // The Work of every operation that completed without error before its call returned (run
  // inline): one object for the whole process, never destroyed, handed out without a
  // reference count, where copying and dropping a counted shared_ptr are a locked add each
  // (bench/journal/2026-12-05, "One word for the inline path"). It is complete and never changes,
  // so a holder sees what a Work of its own would show; only description() does not name the
  // operation.
  static WorkPtr completed();

  // Blocks until the operation finished; rethrows its error. Throws TimeoutError naming the
  // operation when it has not finished within `timeout`, unless the communicator's own
  // verdict is due by then (a wait with the communicator's timeout, begun a moment before the
  // operation started): that one, which names the ranks not heard from, is waited for
  // (up to kVerdictSlack past it), so the caller's timeout never hides it.
  void wait(std::chrono::milliseconds timeout = kDefaultCommTimeout);
  // Orders `stream` after the operation: for a device operation the stream waits for its
  // completion event and the host only waits (up to `timeout`) until the operation was
  // launched; an operation that already finished, or a host one, is waited for as wait().
  // An error of the operation that shows after this returned surfaces at the next host wait
  // on the communicator (it is unusable from then on).
  void wait_stream(DeviceStream stream, std::chrono::milliseconds timeout = kDefaultCommTimeout);
  bool is_completed() const;
  // "rank 1: all_reduce(sum, 16 x f32) #7"
  std::string description() const;

  // Called once by whoever ran the operation.
  void finish(std::exception_ptr error = nullptr);
  // Called by the worker when a device operation was launched and is still running.
  void launched(std::shared_ptr<DeviceCompletion> completion);
  // Called by the communicator as the operation starts: it has finished or failed by
  // `deadline` (+ kVerdictSlack).
  void started(std::chrono::steady_clock::time_point deadline);

  // A Work finished before it is handed out (an inline operation that failed), and one the
  // communicator reuses because nobody else holds it: no other thread can see the Work, so
  // neither takes the lock. At world 1, lock and unlock were over half of an inline MPI
  // operation's own time (perf).
  void finish_unshared(std::exception_ptr error);
  void reuse(const OperationLabel& label);

 private:
  // Waits on `lock` until `ready`, up to `timeout`, or up to the verdict (see wait()).
  template <typename Ready>
  bool wait_for_verdict(std::unique_lock<std::mutex>& lock, std::chrono::milliseconds timeout,
                        Ready ready);

  OperationLabel label_;
  mutable std::mutex mutex_;
  std::condition_variable done_cv_;
  // Set last, with release, once error_ is final: wait() reads a finished Work without the lock.
  std::atomic<bool> done_{false};
  // Threads blocked on done_cv_: finish() and launched() notify only when there are any (a
  // caller of an inline operation never waits, and the notify was a per-call cost).
  int waiters_ = 0;
  std::exception_ptr error_;
  std::shared_ptr<DeviceCompletion> completion_;  // while launched and not finished
  std::optional<std::chrono::steady_clock::time_point> deadline_;  // once started
};

}  // namespace accel
