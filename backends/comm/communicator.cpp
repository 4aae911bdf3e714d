#include "backends/comm/communicator.hpp"

#include <pthread.h>
#include <time.h>

#include <algorithm>
#include <sstream>

#include "foundation/error.hpp"

namespace accel {

std::string format_ranks(const std::vector<int>& ranks) {
  std::ostringstream out;
  out << '[';
  for (std::size_t i = 0; i < ranks.size(); ++i) out << (i ? ", " : "") << ranks[i];
  out << ']';
  return out.str();
}

namespace {
using Kind = OperationLabel::Kind;

OperationLabel label_of(Kind kind, const Buffer& buffer) {
  OperationLabel label;
  label.kind = kind;
  label.count = buffer.count;
  label.dtype = buffer.dtype;
  return label;
}

// What an operation's deadline counts from: CLOCK_MONOTONIC as of the last timer tick, the
// clock steady_clock reads but at most one tick (a few ms) behind, for 4 ns instead of 25 ns
// on this VM: a deadline seconds away needs no nanoseconds.
std::chrono::steady_clock::time_point tick_now() {
  timespec now{};
  clock_gettime(CLOCK_MONOTONIC_COARSE, &now);
  return std::chrono::steady_clock::time_point(
      std::chrono::duration_cast<std::chrono::steady_clock::duration>(
          std::chrono::seconds(now.tv_sec) + std::chrono::nanoseconds(now.tv_nsec)));
}
}  // namespace

Communicator::Communicator(int rank, int world_size, Milliseconds timeout)
    : rank_(rank), world_size_(world_size), timeout_(timeout) {
  ACCEL_CHECK_ARG(world_size >= 1,
                  "world size must be at least 1, got " + std::to_string(world_size));
  ACCEL_CHECK_ARG(
      rank >= 0 && rank < world_size,
      "rank " + std::to_string(rank) + " outside world of " + std::to_string(world_size));
  ACCEL_CHECK_ARG(timeout.count() > 0, "communicator timeout must be positive");
  worker_ = std::thread([this] { worker_loop(); });
  pthread_setname_np(worker_.native_handle(), "accel-comm");  // for top -H, perf sched, gdb
}

Communicator::~Communicator() { stop_worker(); }

void Communicator::stop_worker() noexcept {
  {
    std::lock_guard lock(mutex_);
    if ((state_.load() & kStopping) && !worker_.joinable()) return;
    state_.fetch_or(kStopping);  // the worker waits for an inline operation to end, then stops
  }
  queue_cv_.notify_all();
  if (worker_.joinable()) worker_.join();
}

std::uint64_t Communicator::next_sequence() const { return state_.load() >> kSeqShift; }

void Communicator::finish_average(Buffer data) const {
  divide_elements(data.data, data.count, data.dtype, world_size_);
}

void Communicator::set_inline_max_bytes(std::size_t bytes) {
  std::lock_guard lock(mutex_);
  inline_enabled_ = true;
  inline_max_bytes_ = bytes;
}

void Communicator::set_compute_stream(DeviceStream stream) {
  std::lock_guard lock(mutex_);
  compute_stream_ = stream;
}

DeviceStream Communicator::compute_stream() const {
  std::lock_guard lock(mutex_);
  return compute_stream_;
}

void Communicator::defer_completion(std::shared_ptr<DeviceCompletion> completion) {
  ACCEL_CHECK_ARG(!inline_enabled_,
                  "a backend that runs operations inline cannot defer completions");
  deferred_ = std::move(completion);
}

bool Communicator::poll_in_flight() {
  bool progressed = false;
  while (!in_flight_.empty()) {
    InFlight& f = in_flight_.front();
    std::exception_ptr error;
    bool done = false;
    try {
      done = f.completion->poll();
    } catch (const std::exception& e) {
      error = std::make_exception_ptr(CommError(f.label.text() + " failed: " + e.what()));
    }
    if (!done && !error && std::chrono::steady_clock::now() >= f.deadline) {
      f.completion->abandon();
      const std::vector<int> missing = ranks_not_heard_from(f.label.seq);
      std::string msg = f.label.text() + " timed out after " + std::to_string(timeout_.count()) +
                        " ms (launched on the device, not completed)";
      if (!missing.empty()) msg += "; ranks not heard from: " + format_ranks(missing);
      error = std::make_exception_ptr(TimeoutError(msg));
    }
    if (!done && !error) return progressed;
    progressed = true;
    if (error) {
      std::string broken;
      {
        std::lock_guard lock(mutex_);
        mark_broken(f.label.text() + " failed");
        broken = broken_;
      }
      f.work->finish(error);
      in_flight_.pop_front();
      // Launched behind the failed one on a communicator that is now unusable.
      for (InFlight& later : in_flight_)
        later.work->finish(std::make_exception_ptr(CommError(
            later.label.text() + " not completed: the communicator is unusable since " + broken)));
      in_flight_.clear();
      return true;
    }
    f.work->finish();
    in_flight_.pop_front();
  }
  return progressed;
}

void Communicator::worker_loop() {
  // Polling launched device operations: spin briefly (small collectives finish within it),
  // then sleep with growing pauses, woken early by a newly queued operation.
  constexpr auto kSpin = std::chrono::microseconds(100);
  constexpr auto kMaxPause = std::chrono::microseconds(500);
  auto idle_since = std::chrono::steady_clock::now();
  std::chrono::microseconds pause{0};
  for (;;) {
    std::function<void()> task;
    {
      std::unique_lock lock(mutex_);
      const auto running = [&] { return (state_.load(std::memory_order_acquire) & kRunning) != 0; };
      if (!in_flight_.empty() && (running() || queue_.empty())) {
        lock.unlock();
        if (poll_in_flight()) {
          idle_since = std::chrono::steady_clock::now();
          pause = std::chrono::microseconds(0);
          continue;
        }
        lock.lock();
        if (std::chrono::steady_clock::now() - idle_since > kSpin) {
          pause = std::clamp(pause * 2, std::chrono::microseconds(20), kMaxPause);
          queue_cv_.wait_for(lock, pause, [&] { return !running() && !queue_.empty(); });
        }
        continue;
      }
      // An inline operation may be running on a caller's thread: queued ones wait for it.
      queue_cv_.wait(
          lock, [&] { return !running() && ((state_.load() & kStopping) || !queue_.empty()); });
      if (queue_.empty()) return;  // stopping, drained, nothing in flight
      task = std::move(queue_.front());
      queue_.pop_front();
      // With a backlog no inline claim can be made, so kRunning is clear until this sets it.
      state_.fetch_add(kRunning - kBacklogOne, std::memory_order_acq_rel);
    }
    task();
    state_.fetch_sub(kRunning, std::memory_order_release);
    // A freshly launched operation: poll it with the short spin first.
    idle_since = std::chrono::steady_clock::now();
    pause = std::chrono::microseconds(0);
  }
}

std::string Communicator::broken_reason() const {
  if (!is_broken_.load(std::memory_order_acquire)) return {};
  std::lock_guard lock(mutex_);
  return broken_;
}

void Communicator::mark_broken(std::string reason) {
  if (!broken_.empty()) return;
  broken_ = std::move(reason);
  is_broken_.store(true, std::memory_order_release);
}

template <typename Run>
std::exception_ptr Communicator::execute(const Run& run, const OperationLabel& label,
                                         std::shared_ptr<void> inputs, Work* waiting) {
  if (is_broken_.load(std::memory_order_acquire)) [[unlikely]]
    return not_started(label);
  current_label_ = label;
  current_inputs_ = std::move(inputs);
  // The one clock read of an operation: backends watch this deadline (current_deadline()).
  current_deadline_ = tick_now() + timeout_;
  if (waiting) waiting->started(current_deadline_);  // for a caller already waiting
  std::exception_ptr error;
  try {
    run(timeout_);
  } catch (...) {
    error = failed(label, std::current_exception());
  }
  current_inputs_.reset();
  return error;
}

std::exception_ptr Communicator::not_started(const OperationLabel& label) const {
  return std::make_exception_ptr(CommError(
      label.text() + " not started: the communicator is unusable since " + broken_reason()));
}

std::exception_ptr Communicator::failed(const OperationLabel& label, std::exception_ptr caught) {
  std::exception_ptr error;
  std::string missing_text;  // "; ranks not heard from: [1]" after a timeout that knows them
  try {
    std::rethrow_exception(caught);
  } catch (const TimeoutError& e) {
    const std::vector<int> missing = ranks_not_heard_from(label.seq);
    if (!missing.empty()) missing_text = "; ranks not heard from: " + format_ranks(missing);
    error = std::make_exception_ptr(TimeoutError(label.text() + " timed out after " +
                                                 std::to_string(timeout_.count()) + " ms" +
                                                 missing_text + " (" + e.what() + ")"));
  } catch (const std::exception& e) {
    error = std::make_exception_ptr(CommError(label.text() + " failed: " + e.what()));
  }
  // Ranks are now out of step: refuse later collectives instead of mismatching them. Later
  // errors repeat who was not heard from: the cause, whichever error the caller sees first.
  std::lock_guard lock(mutex_);
  mark_broken(label.text() + " failed" + missing_text);
  return error;
}

WorkPtr Communicator::new_work(const OperationLabel& label) {
  // The count drops to 1 with a release decrement (the last other owner's); the acquire
  // fence orders that owner's last use of the Work before the reuse.
  if (last_work_ && last_work_.use_count() == 1) {
    std::atomic_thread_fence(std::memory_order_acquire);
    last_work_->reuse(label);
  } else {
    last_work_ = std::make_shared<Work>(label);
  }
  return last_work_;
}

namespace {
// A Work for an operation that ended before it was handed out.
WorkPtr finished_work(const OperationLabel& label, std::exception_ptr error) {
  if (!error) return Work::completed();
  auto work = std::make_shared<Work>(label);
  work->finish_unshared(std::move(error));
  return work;
}
}  // namespace

template <typename Run>
WorkPtr Communicator::run_inline(const OperationLabel& label, const Run& run) {
  std::exception_ptr error = execute(run, label, nullptr, nullptr);
  // Gives the claim back. A thread that queued meanwhile (from another thread) or a stop
  // left the worker waiting for kRunning to clear: wake it, through mutex_ so that it is
  // either waiting already or yet to check. Waking it for nothing would cost a context switch
  // per operation, more than a 4 KiB all-reduce itself when the ranks keep every core busy.
  if (state_.fetch_sub(kRunning, std::memory_order_acq_rel) & (kBacklogMask | kStopping)) {
    { std::lock_guard relock(mutex_); }
    queue_cv_.notify_all();
  }
  return finished_work(label, std::move(error));
}

template <typename Run>
WorkPtr Communicator::enqueue(OperationLabel label, std::size_t payload_bytes,
                              std::uint64_t bus_bytes, Run run) {
  label.rank = rank_;
  // inline_* are set in the derived constructor, before any operation.
  const bool may_inline = inline_enabled_ && payload_bytes <= inline_max_bytes_;
  if (may_inline) {
    // Nothing queued, nothing running: claim the run and a sequence number at once and run it
    // here, in order, without the round trip to the worker (and without mutex_).
    std::uint64_t s = state_.load(std::memory_order_relaxed);
    if ((s & kBusy) == 0 &&
        state_.compare_exchange_strong(s, s + kSeqOne + kRunning, std::memory_order_acquire,
                                       std::memory_order_relaxed)) {
      label.seq = s >> kSeqShift;
      inline_bus_bytes_.store(inline_bus_bytes_.load(std::memory_order_relaxed) + bus_bytes,
                              std::memory_order_relaxed);
      return run_inline(label, run);
    }
  }
  return enqueue_locked(label, may_inline, bus_bytes, std::move(run));
}

template <typename Run>
WorkPtr Communicator::enqueue_locked(OperationLabel label, bool may_inline, std::uint64_t bus_bytes,
                                     Run run) {
  std::unique_lock lock(mutex_);
  std::uint64_t s = state_.load(std::memory_order_relaxed);
  bool here = false;
  for (;;) {
    here = may_inline && (s & kBusy) == 0;
    if ((s & kBacklogMask) == kBacklogMask)
      throw CommError("rank " + std::to_string(rank_) + ": " +
                      std::to_string(kBacklogMask / kBacklogOne) +
                      " operations are queued already; wait for some before issuing more");
    std::uint64_t next = s + kSeqOne;
    if (here)
      next += kRunning;
    else if (!(s & kStopping))
      next += kBacklogOne;
    if (state_.compare_exchange_weak(s, next, std::memory_order_acquire, std::memory_order_relaxed))
      break;
  }
  label.seq = s >> kSeqShift;
  queued_bus_bytes_.store(queued_bus_bytes_.load(std::memory_order_relaxed) + bus_bytes,
                          std::memory_order_relaxed);
  if (s & kStopping)
    return finished_work(
        label, std::make_exception_ptr(CommError(label.text() + ": communicator is shut down")));
  if (here) {
    lock.unlock();
    return run_inline(label, run);
  }
  std::shared_ptr<void> inputs;
  try {
    inputs = on_issue(compute_stream_);  // here, in issue order: what the caller queued so far
  } catch (const std::exception& e) {
    mark_broken(label.text() + " failed");
    state_.fetch_sub(kBacklogOne);  // not queued after all
    return finished_work(
        label, std::make_exception_ptr(CommError(label.text() + " not issued: " + e.what())));
  }
  WorkPtr work = new_work(label);
  queue_.push_back([this, work, run = std::move(run), label, inputs = std::move(inputs)] {
    deferred_.reset();
    std::exception_ptr error = execute(run, label, inputs, work.get());
    if (!error && deferred_) {
      work->launched(deferred_);
      in_flight_.push_back({work, std::move(deferred_), current_deadline_, label});
      return;
    }
    deferred_.reset();
    work->finish(std::move(error));
  });
  queue_cv_.notify_all();
  return work;
}

std::uint64_t Communicator::bus_share(std::size_t bytes, int numerator, int denominator) const {
  if (world_size_ == 1) return 0;
  return std::uint64_t(bytes) * std::uint64_t(numerator) / std::uint64_t(denominator);
}

void Communicator::reset_bus_bytes() {
  std::lock_guard lock(mutex_);
  queued_bus_bytes_.store(0, std::memory_order_relaxed);
  inline_bus_bytes_.store(0, std::memory_order_relaxed);
}

WorkPtr Communicator::all_reduce(Buffer data, ReduceOp op) {
  OperationLabel label = label_of(Kind::all_reduce, data);
  label.op = op;
  const std::uint64_t bus = bus_share(data.bytes(), 2 * (world_size_ - 1), world_size_);
  return enqueue(label, data.bytes(), bus, [=, this](Milliseconds t) {
    if (data.count > 0) run_all_reduce(data, op, t);
  });
}

WorkPtr Communicator::broadcast(Buffer data, int root) {
  ACCEL_CHECK_ARG(root >= 0 && root < world_size_, "broadcast root " + std::to_string(root) +
                                                       " outside world of " +
                                                       std::to_string(world_size_));
  OperationLabel label = label_of(Kind::broadcast, data);
  label.peer = root;
  return enqueue(label, data.bytes(), bus_share(data.bytes(), 1, 1), [=, this](Milliseconds t) {
    if (data.count > 0) run_broadcast(data, root, t);
  });
}

// Rank r's part from the caller's counts: contiguous, in rank order, covering `total`.
Parts Communicator::parts_of(const char* op, const std::vector<std::size_t>& counts,
                             std::size_t total) const {
  ACCEL_CHECK_ARG(counts.size() == std::size_t(world_size_),
                  std::string(op) + ": " + std::to_string(counts.size()) + " part counts for " +
                      std::to_string(world_size_) + " ranks");
  std::vector<Shard> parts(counts.size());
  std::size_t offset = 0;
  for (std::size_t r = 0; r < counts.size(); ++r) {
    parts[r] = {offset, counts[r]};
    offset += counts[r];
  }
  ACCEL_CHECK_ARG(offset == total, std::string(op) + ": the parts hold " + std::to_string(offset) +
                                       " elements, the buffer " + std::to_string(total));
  return Parts(std::move(parts));
}

WorkPtr Communicator::all_gather(Buffer input, Buffer output) {
  return issue_all_gather(input, output, Parts::even(output.count, world_size_));
}

WorkPtr Communicator::all_gather(Buffer input, Buffer output, std::vector<std::size_t> counts) {
  return issue_all_gather(input, output, parts_of("all_gather", counts, output.count));
}

WorkPtr Communicator::issue_all_gather(Buffer input, Buffer output, Parts parts) {
  ACCEL_CHECK_ARG(input.dtype == output.dtype,
                  "all_gather: input is " + std::string(dtype_name(input.dtype)) +
                      " but output is " + std::string(dtype_name(output.dtype)));
  const Shard mine = parts[std::size_t(rank_)];
  ACCEL_CHECK_ARG(input.count == mine.count, "all_gather: rank " + std::to_string(rank_) +
                                                 " must contribute " + std::to_string(mine.count) +
                                                 " of " + std::to_string(output.count) +
                                                 " elements, got " + std::to_string(input.count));
  return enqueue(label_of(Kind::all_gather, output), output.bytes(),
                 bus_share(output.bytes(), world_size_ - 1, world_size_),
                 [=, this, parts = std::move(parts)](Milliseconds t) {
                   if (output.count > 0) run_all_gather(input, output, parts, t);
                 });
}

WorkPtr Communicator::reduce_scatter(Buffer input, Buffer output, ReduceOp op) {
  return issue_reduce_scatter(input, output, op, Parts::even(input.count, world_size_));
}

WorkPtr Communicator::reduce_scatter(Buffer input, Buffer output, ReduceOp op,
                                     std::vector<std::size_t> counts) {
  return issue_reduce_scatter(input, output, op, parts_of("reduce_scatter", counts, input.count));
}

WorkPtr Communicator::issue_reduce_scatter(Buffer input, Buffer output, ReduceOp op, Parts parts) {
  ACCEL_CHECK_ARG(input.dtype == output.dtype,
                  "reduce_scatter: input is " + std::string(dtype_name(input.dtype)) +
                      " but output is " + std::string(dtype_name(output.dtype)));
  const Shard mine = parts[std::size_t(rank_)];
  ACCEL_CHECK_ARG(output.count == mine.count,
                  "reduce_scatter: rank " + std::to_string(rank_) + " receives " +
                      std::to_string(mine.count) + " of " + std::to_string(input.count) +
                      " elements, but its output holds " + std::to_string(output.count));
  OperationLabel label = label_of(Kind::reduce_scatter, input);
  label.op = op;
  const std::uint64_t bus = bus_share(input.bytes(), world_size_ - 1, world_size_);
  // Host memory only: NCCL refuses such an output itself.
  const bool on_copy = input.device == DeviceKind::cpu && overlaps(input, output) &&
                       output.data != input.slice(mine.offset, mine.count).data;
  return enqueue(label, input.bytes(), bus, [=, this, parts = std::move(parts)](Milliseconds t) {
    if (input.count == 0) return;
    if (on_copy)
      run_reduce_scatter_on_copy(input, output, op, parts, t);
    else
      run_reduce_scatter(input, output, op, parts, t);
  });
}

void Communicator::run_reduce_scatter_on_copy(Buffer input, Buffer output, ReduceOp op,
                                              const Parts& parts, Milliseconds timeout) {
  const DeviceBuffer copy(input.count, input.dtype, MemoryKind::host);
  copy_buffer(copy.view(), input, nullptr);
  run_reduce_scatter(copy.view(), output, op, parts, timeout);
}

WorkPtr Communicator::barrier() {
  return enqueue(OperationLabel{.kind = Kind::barrier}, 0, 0,
                 [this](Milliseconds t) { run_barrier(t); });
}

WorkPtr Communicator::send(Buffer data, int dst, std::uint32_t tag) {
  ACCEL_CHECK_ARG(dst >= 0 && dst < world_size_ && dst != rank_,
                  "send: destination rank " + std::to_string(dst) + " is not another rank of " +
                      std::to_string(world_size_));
  OperationLabel label = label_of(Kind::send, data);
  label.peer = dst;
  label.tag = tag;
  return enqueue(label, data.bytes(), bus_share(data.bytes(), 1, 1),
                 [=, this](Milliseconds t) { run_send(data, dst, tag, t); });
}

WorkPtr Communicator::recv(Buffer data, int src, std::uint32_t tag) {
  ACCEL_CHECK_ARG(src >= 0 && src < world_size_ && src != rank_,
                  "recv: source rank " + std::to_string(src) + " is not another rank of " +
                      std::to_string(world_size_));
  OperationLabel label = label_of(Kind::recv, data);
  label.peer = src;
  label.tag = tag;
  return enqueue(label, data.bytes(), 0,
                 [=, this](Milliseconds t) { run_recv(data, src, tag, t); });
}

}  // namespace accel
