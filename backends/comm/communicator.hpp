#pragma once
// The one interface every strategy talks to, whatever moves the bytes (Gloo, MPI, NCCL,
// shared memory, or the world of one). Calls are asynchronous: each returns a Work handle.
// Operations run on one background thread per communicator, strictly in call order, so ranks
// that make the same calls issue the same collective sequence; each gets a sequence number
// (#1, #2, ...) that error messages name.
//
// Inline execution (one mechanism, opted into by a backend through set_inline_max_bytes):
// handing an operation to the worker thread and waking the caller again costs tens of
// microseconds, which is most of a small collective over shared memory. A backend that opts
// in has an operation of at most that many payload bytes run synchronously on the caller's
// thread, when nothing is queued or running; otherwise it is queued as usual. Order, sequence
// numbers, error texts and the "unusable after the first failure" rule are the same either
// way. What the caller sees: such a call may return a Work that is already complete, having
// blocked until the peers joined, so a caller must not make a peer's arrival at the same
// operation depend on something it does between issuing the operation and waiting for it.
//
// Shapes:
//   all_reduce(data, op)           in place, any count (0 included)
//   broadcast(data, root)          in place
//   all_gather(input, output)      output holds all ranks' parts in rank order; this rank's
//                                  part is shard_of(output.count, world, rank) and input has
//                                  exactly that many elements (counts need not divide); input
//                                  may lie inside output, as this rank's part (in place) or
//                                  anywhere (CPU communicators: the result is as if it were a
//                                  separate buffer; NCCL: only in place)
//   all_gather(input, output, counts)
//                                  the same with parts the caller chooses: rank r contributes
//                                  counts[r] elements, in rank order (ZeRO-3: a unit's overlap
//                                  with each rank's owned slice)
//   reduce_scatter(input, output)  output gets this rank's part shard_of(input.count, ...)
//                                  of the element-wise reduction of every rank's input; output
//                                  may lie inside input, as this rank's part (in place) or
//                                  anywhere (CPU communicators: the result is as if it were a
//                                  separate buffer; NCCL: only in place)
//   reduce_scatter(input, output, op, counts)
//                                  the same with parts the caller chooses: rank r gets
//                                  counts[r] elements, in rank order (ZeRO-2: a gradient
//                                  bucket's overlap with each rank's owned slice)
//   barrier(), send(data, dst, tag), recv(data, src, tag)
//
// Device buffers and streams (CUDA communicators; CPU ones ignore all of this). The caller
// computes on one CUDA stream, set_compute_stream() (default: the legacy default stream). The
// contract, for every device operation:
//   - inputs: the operation reads its buffers only after everything queued on the compute
//     stream before the call was issued (the backend records an event on that stream in the
//     issuing call, on_issue(), and its own stream waits for it: no host wait);
//   - outputs: Work::wait() blocks the host until the result is in memory, as for CPU
//     backends; Work::wait_stream(compute_stream()) instead makes the compute stream wait for
//     the operation's completion event, so later kernels on it see the result while the host
//     runs ahead. The host must wait (wait(), or a bounded stream synchronisation) before it
//     reads a result itself;
//   - timeouts: the worker polls each launched operation (DeviceCompletion) up to the timeout,
//     then abandons it (NCCL aborts) and fails it naming the operation; the communicator is
//     unusable afterwards, and every later wait says so.

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "backends/comm/parts.hpp"
#include "backends/comm/work.hpp"
#include "foundation/device_memory.hpp"
#include "foundation/dtype.hpp"
#include "foundation/reduce.hpp"
#include "foundation/store/store.hpp"
#include "foundation/timeout.hpp"

namespace accel {

// What every backend needs to join a group. Backends that bring their own world (MPI) check
// rank and world_size against it when they are set (>= 0).
struct CommOptions {
  int rank = 0;
  int world_size = 1;
  StorePtr store;                              // rendezvous; Gloo and NCCL need it
  Milliseconds timeout = kDefaultCommTimeout;  // per operation, and for joining
  std::string hostname = "127.0.0.1";          // address this rank listens on (Gloo)
  int cuda_device = -1;                        // NCCL: device index; -1 = LOCAL_RANK
  // Store keys of this group live under "<backend>/<group_name>/", so several groups (or a
  // benchmark's baseline) can rendezvous through one store.
  std::string group_name = "world";
};

class Communicator {
 public:
  Communicator(int rank, int world_size, Milliseconds timeout);
  virtual ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const { return rank_; }
  int world_size() const { return world_size_; }
  Milliseconds timeout() const { return timeout_; }
  virtual std::string_view backend_name() const = 0;
  // Where buffers must live for this communicator.
  virtual DeviceKind device() const { return DeviceKind::cpu; }
  // The CUDA device this rank's operations run on (-1 for CPU communicators).
  virtual int cuda_device() const { return -1; }
  // Whether host buffers work too (small host values need no staging through device memory):
  // CPU communicators, and the world of one wherever it works.
  virtual bool accepts_host_buffers() const { return device() == DeviceKind::cpu; }

  // Symmetric memory: `count` zeroed elements of `dtype` that every rank of the group can
  // read, at the same offset on every rank (as PyTorch's symmetric memory, or NCCL's
  // registered buffers). Collective: every rank calls it in the same order with the same
  // count and dtype. A collective on such a buffer may read the peers' copies in place
  // instead of staging them through its own memory. The memory lives as long as the returned
  // buffer, even past the communicator. An empty buffer (view().data == nullptr) where the
  // backend has none: the caller allocates its own.
  virtual DeviceBuffer allocate_symmetric(std::size_t count, DType dtype) {
    (void)count;
    (void)dtype;
    return {};
  }

  // The stream the caller computes on (see the top of this file). Set it before issuing the
  // operations it concerns; strategies order their copies on it too.
  void set_compute_stream(DeviceStream stream);
  DeviceStream compute_stream() const;

  WorkPtr all_reduce(Buffer data, ReduceOp op);
  WorkPtr broadcast(Buffer data, int root);
  WorkPtr all_gather(Buffer input, Buffer output);
  WorkPtr all_gather(Buffer input, Buffer output, std::vector<std::size_t> counts);
  WorkPtr reduce_scatter(Buffer input, Buffer output, ReduceOp op);
  WorkPtr reduce_scatter(Buffer input, Buffer output, ReduceOp op, std::vector<std::size_t> counts);
  WorkPtr barrier();
  WorkPtr send(Buffer data, int dst, std::uint32_t tag = 0);
  WorkPtr recv(Buffer data, int src, std::uint32_t tag = 0);

  // Sequence number the next call will get.
  std::uint64_t next_sequence() const;

  // Bytes this rank has put on the wire for collectives since construction (or the last
  // reset), counted as nccl-tests' bus bandwidth counts them, so strategies compare by
  // algorithm-independent volume: all_reduce 2(n-1)/n x bytes, reduce_scatter (n-1)/n x input
  // bytes, all_gather (n-1)/n x output bytes, broadcast and send their bytes (n > 1), barrier
  // and recv nothing; a world of one moves nothing. Counted when an operation is issued.
  std::uint64_t bus_bytes() const {
    return queued_bus_bytes_.load(std::memory_order_relaxed) +
           inline_bus_bytes_.load(std::memory_order_relaxed);
  }
  void reset_bus_bytes();

 protected:
  // Backends implement these synchronously; they run on the worker thread. Each must give
  // up after `timeout`, throwing TimeoutError. avg arrives as avg: a backend without a native
  // average reduces with wire_op(op) and calls finish_average().
  virtual void run_all_reduce(Buffer data, ReduceOp op, Milliseconds timeout) = 0;
  virtual void run_broadcast(Buffer data, int root, Milliseconds timeout) = 0;
  // parts[r]: rank r's piece of output (contiguous, in rank order, covering all of it); the
  // public call has checked that input holds parts[rank()].count elements.
  virtual void run_all_gather(Buffer input, Buffer output, const Parts& parts,
                              Milliseconds timeout) = 0;
  // parts[r]: rank r's piece of input (contiguous, in rank order, covering all of it); the
  // public call has checked that output holds parts[rank()].count elements.
  virtual void run_reduce_scatter(Buffer input, Buffer output, ReduceOp op, const Parts& parts,
                                  Milliseconds timeout) = 0;
  virtual void run_barrier(Milliseconds timeout) = 0;
  virtual void run_send(Buffer data, int dst, std::uint32_t tag, Milliseconds timeout) = 0;
  virtual void run_recv(Buffer data, int src, std::uint32_t tag, Milliseconds timeout) = 0;

  // After operation `seq` timed out: the ranks known not to have reached it (empty when
  // unknowable). Runs on the worker thread.
  virtual std::vector<int> ranks_not_heard_from(std::uint64_t seq) {
    (void)seq;
    return {};
  }

  // The operation now running, as its errors name it; its seq is what ranks_not_heard_from
  // is later asked about. Valid inside run_*.
  const OperationLabel& current_label() const { return current_label_; }
  std::uint64_t current_sequence() const { return current_label_.seq; }
  // When the operation now running times out (it started, plus timeout()): read once per
  // operation by the base, so a backend that watches the time needs no clock read of its own.
  std::chrono::steady_clock::time_point current_deadline() const { return current_deadline_; }

  // Device backends: runs on the caller's thread as each queued operation is issued, in issue
  // order (with the issue lock held: it must not call back into this class); `compute_stream`
  // is compute_stream() at that moment. What it returns is handed to that operation's run_* as
  // issued_inputs() (NCCL: an event recorded on the compute stream, which its own stream then
  // waits for). Operations run inline skip it: a backend that opts into inline execution
  // must not need it. Default: nothing.
  virtual std::shared_ptr<void> on_issue(DeviceStream compute_stream) {
    (void)compute_stream;
    return nullptr;
  }
  // Inside run_*: what on_issue() returned for the operation now running.
  const std::shared_ptr<void>& issued_inputs() const { return current_inputs_; }
  // Inside run_*: the operation was only launched; the worker polls `completion` until it
  // finished (up to the timeout) and then finishes the Work, while later operations are
  // launched meanwhile. Not for backends that opt into inline execution.
  void defer_completion(std::shared_ptr<DeviceCompletion> completion);

  // Divides a CPU buffer that holds a sum by the world size.
  void finish_average(Buffer data) const;

  // Derived destructors call this first, so no operation runs on a half-destroyed object.
  void stop_worker() noexcept;

  // Opts into inline execution (see the top of this file) for operations whose payload is at
  // most `bytes` (barriers count as 0). Without it everything is queued. Call from the derived
  // constructor.
  void set_inline_max_bytes(std::size_t bytes);

 private:
  // Gives `label` its rank and sequence number, counts `bus_bytes` (bus_bytes()), and runs or
  // queues the operation. A template, defined in communicator.cpp (its only caller): `run` is
  // called in place when the operation runs inline, and wrapped in a std::function (an
  // allocation) only when it is queued.
  template <typename Run>
  WorkPtr enqueue(OperationLabel label, std::size_t payload_bytes, std::uint64_t bus_bytes,
                  Run run);
  // The rest of enqueue, under mutex_: queues the operation (or runs it inline when the
  // lock-free claim lost a race). Out of line, as are execute's errors (not_started, failed):
  // the inline path stays a few cache lines, where a small operation between two real
  // collectives finds its code evicted (bench/journal/2026-12-06, "The issuing path's instruction
  // cache").
  template <typename Run>
  [[gnu::noinline]] WorkPtr enqueue_locked(OperationLabel label, bool may_inline,
                                           std::uint64_t bus_bytes, Run run);
  // Runs an operation on the caller's thread, which has claimed kRunning; gives the claim up.
  template <typename Run>
  WorkPtr run_inline(const OperationLabel& label, const Run& run);
  WorkPtr issue_all_gather(Buffer input, Buffer output, Parts parts);
  WorkPtr issue_reduce_scatter(Buffer input, Buffer output, ReduceOp op, Parts parts);
  // reduce_scatter with an output inside the input elsewhere than this rank's part: the
  // backend would overwrite input it has yet to read, so it reduces a copy of the input.
  void run_reduce_scatter_on_copy(Buffer input, Buffer output, ReduceOp op, const Parts& parts,
                                  Milliseconds timeout);
  // This rank's bus bytes for an operation on `bytes` (bus_bytes()): x numerator/denominator.
  std::uint64_t bus_share(std::size_t bytes, int numerator, int denominator) const;
  // The Work for a new queued operation: the last one again when its caller has let go of it
  // (no allocation), else a new one. With mutex_ held.
  WorkPtr new_work(const OperationLabel& label);
  Parts parts_of(const char* op, const std::vector<std::size_t>& counts, std::size_t total) const;
  void worker_loop();
  // Worker thread: finishes launched device operations that completed, failed or timed out,
  // in launch order; returns whether any did.
  bool poll_in_flight();
  // Runs one operation (on the worker, or inline on the caller's thread) and returns its
  // error. `waiting` (queued operations only) learns the operation's deadline as it starts.
  template <typename Run>
  std::exception_ptr execute(const Run& run, const OperationLabel& label,
                             std::shared_ptr<void> inputs, Work* waiting);
  // execute's errors: the communicator is broken already; `caught` ended the operation
  // (named, the communicator then marked broken).
  [[gnu::noinline]] std::exception_ptr not_started(const OperationLabel& label) const;
  [[gnu::noinline]] std::exception_ptr failed(const OperationLabel& label,
                                              std::exception_ptr caught);
  // Whether the communicator failed, and why (broken_); the flag spares every operation the
  // lock and the string copy while it has not.
  std::string broken_reason() const;
  // Records the first failure (later ones keep it). With mutex_ held.
  void mark_broken(std::string reason);

  const int rank_;
  const int world_size_;
  const Milliseconds timeout_;

  // Who may execute, and the next sequence number, in one word, so an operation that runs
  // inline claims both with one compare-and-swap and gives them back with one subtraction,
  // without mutex_ (bench/journal/2026-12-05, "One word for the inline path"):
  //   kRunning   an operation is executing (on the worker, or inline on a caller's thread);
  //   kStopping  stop_worker() was called;
  //   backlog    operations queued for the worker (queue_.size(); changed under mutex_);
  //   sequence   the next operation's number, from bit kSeqShift (40 bits: it wraps after
  //              2^40 operations, on every rank alike).
  // An inline claim needs the word's low bits all clear: nothing queued, nothing running, not
  // stopping. The worker claims kRunning only while it has a backlog, which an inline claim
  // never has, so the two never both hold it.
  static constexpr std::uint64_t kRunning = 1;
  static constexpr std::uint64_t kStopping = 2;
  static constexpr std::uint64_t kBacklogOne = 4;
  static constexpr int kSeqShift = 24;
  static constexpr std::uint64_t kBacklogMask = (std::uint64_t(1) << kSeqShift) - kBacklogOne;
  static constexpr std::uint64_t kSeqOne = std::uint64_t(1) << kSeqShift;
  // The bits an inline claim needs clear: running, stopping and the backlog.
  static constexpr std::uint64_t kBusy = kSeqOne - 1;
  std::atomic<std::uint64_t> state_{kSeqOne};

  mutable std::mutex mutex_;
  std::condition_variable queue_cv_;
  std::deque<std::function<void()>> queue_;
  WorkPtr last_work_;  // new_work's: the last operation's Work, reused once nobody else holds it
  // bus_bytes(), in two parts so no issuing path needs a locked add: what is issued under
  // mutex_ (queued operations, and inline ones that took it), and what the lock-free inline
  // claim issues (its holders are ordered by state_).
  std::atomic<std::uint64_t> queued_bus_bytes_{0};
  std::atomic<std::uint64_t> inline_bus_bytes_{0};
  OperationLabel current_label_;  // written and read only by whoever executes operations
  std::chrono::steady_clock::time_point current_deadline_;  // as current_label_
  bool inline_enabled_ = false;
  std::size_t inline_max_bytes_ = 0;
  std::string broken_;                  // first failure; later operations fail fast with it
  std::atomic<bool> is_broken_{false};  // set with broken_, under mutex_
  DeviceStream compute_stream_ = nullptr;
  // Written and read only by whoever executes operations (as current_label_).
  std::shared_ptr<void> current_inputs_;
  std::shared_ptr<DeviceCompletion> deferred_;
  struct InFlight {
    WorkPtr work;
    std::shared_ptr<DeviceCompletion> completion;
    std::chrono::steady_clock::time_point deadline;
    OperationLabel label;
  };
  std::deque<InFlight> in_flight_;  // worker thread only
  std::thread worker_;
};

using CommunicatorPtr = std::unique_ptr<Communicator>;

// "[0, 2]"
std::string format_ranks(const std::vector<int>& ranks);

// The communicator's compute stream (set_compute_stream), device and timeout.
inline DeviceContext compute_context(const Communicator& comm) {
  return {comm.compute_stream(), comm.cuda_device(), comm.timeout()};
}

}  // namespace accel
