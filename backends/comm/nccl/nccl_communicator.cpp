#include "backends/comm/nccl/nccl_communicator.hpp"

#include <algorithm>
#include <atomic>
#include <charconv>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

#include "backends/comm/nccl/nccl_check.hpp"
#include "foundation/error.hpp"

namespace accel {

namespace {

using Clock = std::chrono::steady_clock;

// The longest the destructor waits for ncclCommFinalize (which waits for every rank) before
// it aborts instead: a destructor must end even when a peer is gone.
constexpr Milliseconds kMaxFinalizeWait = std::chrono::seconds(60);

// Numbers the NcclCommunicators of this process, so each finds its own unique id in a store
// that outlives one communicator. Every rank creates its communicators in the same order
// (as with any collective), so the numbers agree across ranks.
std::atomic<std::uint64_t> g_communicators_created{0};

// Polling a GPU operation: spin briefly (small collectives finish within it), then sleep with
// growing pauses so a long wait does not burn the core the training loop needs.
class Backoff {
 public:
  explicit Backoff(Clock::time_point deadline)
      : deadline_(deadline), spin_until_(Clock::now() + kSpin) {}
  void pause() {
    const auto now = Clock::now();
    if (now < spin_until_) return;
    pause_ = pause_ == Clock::duration::zero() ? Clock::duration(kMinPause)
                                               : std::min<Clock::duration>(pause_ * 2, kMaxPause);
    std::this_thread::sleep_for(std::min<Clock::duration>(pause_, deadline_ - now));
  }

 private:
  static constexpr auto kSpin = std::chrono::microseconds(100);
  static constexpr auto kMinPause = std::chrono::microseconds(20);
  static constexpr auto kMaxPause = std::chrono::microseconds(500);
  Clock::time_point deadline_;
  Clock::time_point spin_until_;
  Clock::duration pause_{};
};

int pick_device(const CommOptions& options) {
  if (options.cuda_device >= 0) return options.cuda_device;
  const char* env = std::getenv("LOCAL_RANK");
  if (!env || !*env) return 0;
  const std::string_view text(env);
  int device = -1;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), device);
  if (ec != std::errc() || end != text.data() + text.size() || device < 0)
    throw InvalidArgument("NcclCommunicator: LOCAL_RANK='" + std::string(text) +
                          "' is not a CUDA device index");
  return device;
}

ncclDataType_t nccl_type(DType dtype) {
  switch (dtype) {
    case DType::f32:
      return ncclFloat32;
    case DType::f64:
      return ncclFloat64;
    case DType::f16:
      return ncclFloat16;
    case DType::bf16:
      return ncclBfloat16;
    case DType::i32:
      return ncclInt32;
    case DType::i64:
      return ncclInt64;
  }
  throw InvalidArgument("NcclCommunicator: unsupported dtype");
}

// NCCL averages natively (integers: sum, then division truncating toward zero, as ours).
ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
      return ncclSum;
    case ReduceOp::avg:
      return ncclAvg;
    case ReduceOp::min:
      return ncclMin;
    case ReduceOp::max:
      return ncclMax;
  }
  throw InvalidArgument("NcclCommunicator: unsupported reduce op");
}

void require_cuda(const Buffer& b, const char* op) {
  if (b.count > 0 && b.device != DeviceKind::cuda)
    throw InvalidArgument(std::string("NcclCommunicator ") + op +
                          ": NCCL moves CUDA device memory, but the buffer is marked cpu");
}

}  // namespace

struct NcclCommunicator::State {
  int device = -1;
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  void* barrier_word = nullptr;  // one zero int: NCCL has no barrier, so we all-reduce this
  bool failed = false;           // then only ncclCommAbort is safe
  Milliseconds finalize_wait = kMaxFinalizeWait;

  State() = default;
  State(const State&) = delete;
  State& operator=(const State&) = delete;
  ~State() { release(); }

  // Stops the communicator's kernels and frees it; every later operation fails.
  void abort() noexcept {
    failed = true;
    if (comm) ncclCommAbort(comm);
    comm = nullptr;
  }

  // Fails with the asynchronous error NCCL reported (a peer gone, a network error).
  [[noreturn]] void fail(ncclResult_t error, const std::string& what) {
    std::string text = what + " failed: " + ncclGetErrorString(error) + " (NCCL error code " +
                       std::to_string(static_cast<int>(error)) + ")";
    if (const char* last = ncclGetLastError(comm); last && *last) text += ": " + std::string(last);
    abort();
    throw CommError(text + "; the NCCL communicator was aborted");
  }

  // Throws when NCCL reports an asynchronous error; true while it is still in progress.
  bool in_progress(const std::string& what) {
    ncclResult_t state = ncclSuccess;
    ACCEL_NCCL_CHECK(ncclCommGetAsyncError(comm, &state));
    if (state == ncclInProgress) return true;
    if (state != ncclSuccess) fail(state, what);
    return false;
  }

  // A nonblocking communicator may accept a call before it has carried it out (ncclInProgress):
  // nothing else may be done with it until its state says ncclSuccess.
  void wait_ready(const std::string& what, Clock::time_point deadline, Milliseconds timeout) {
    Backoff backoff(deadline);
    while (in_progress(what)) {
      if (Clock::now() >= deadline) {
        abort();
        throw TimeoutError(what + " was not carried out by NCCL within " +
                           std::to_string(timeout.count()) +
                           " ms; the NCCL communicator was aborted");
      }
      backoff.pause();
    }
  }

  // Launches one operation (enqueue() makes the NCCL calls, grouped) on our stream after its
  // inputs are ready and returns its completion event: the worker polls it (Completion).
  // `inputs`: the event on_issue() recorded on the caller's compute stream.
  template <typename Enqueue>
  cudaEvent_t launch(const std::string& what, Milliseconds timeout, cudaEvent_t inputs,
                     Enqueue&& enqueue) {
    if (!comm)
      throw CommError(what + ": the NCCL communicator was aborted after an earlier failure");
    const auto deadline = Clock::now() + timeout;
    cudaEvent_t done = nullptr;
    try {
      // The current device is per thread, and this is the worker's.
      ACCEL_CUDA_CHECK(cudaSetDevice(device));
      ACCEL_CUDA_CHECK(cudaStreamWaitEvent(stream, inputs, 0));
      ACCEL_NCCL_CHECK_ASYNC(ncclGroupStart());
      try {
        enqueue();
      } catch (...) {
        ncclGroupEnd();
        throw;
      }
      ACCEL_NCCL_CHECK_ASYNC(ncclGroupEnd());
      wait_ready(what, deadline, timeout);
      ACCEL_CUDA_CHECK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
      ACCEL_CUDA_CHECK(cudaEventRecord(done, stream));
      return done;
    } catch (...) {
      if (done) cudaEventDestroy(done);
      failed = true;  // the destructor must abort rather than finalise
      throw;
    }
  }

  // Frees everything; never throws. A healthy communicator is finalised (which waits for every
  // rank, boundedly) and destroyed; a failed or stuck one is aborted.
  void release() noexcept {
    if (device >= 0) cudaSetDevice(device);
    if (comm) {
      bool clean = !failed;
      if (clean) {
        const ncclResult_t rc = ncclCommFinalize(comm);
        clean = rc == ncclSuccess || rc == ncclInProgress;
        const auto deadline = Clock::now() + finalize_wait;
        Backoff backoff(deadline);
        while (clean) {
          ncclResult_t state = ncclSuccess;
          if (ncclCommGetAsyncError(comm, &state) != ncclSuccess ||
              (state != ncclSuccess && state != ncclInProgress)) {
            clean = false;
          } else if (state == ncclSuccess) {
            break;
          } else if (Clock::now() >= deadline) {
            clean = false;
          } else {
            backoff.pause();
          }
        }
      }
      if (clean)
        ncclCommDestroy(comm);
      else
        ncclCommAbort(comm);
      comm = nullptr;
    }
    if (barrier_word) cudaFree(barrier_word);
    if (stream) cudaStreamDestroy(stream);
    barrier_word = nullptr;
    stream = nullptr;
  }
};

namespace {

// An event recorded on the caller's compute stream when an operation was issued.
struct InputsEvent {
  cudaEvent_t event = nullptr;
  ~InputsEvent() {
    if (event) cudaEventDestroy(event);
  }
};

// A launched operation: its completion event on our stream, polled by the worker.
class Completion final : public DeviceCompletion {
 public:
  Completion(NcclCommunicator::State& state, cudaEvent_t done, std::string what)
      : state_(state), done_(done), what_(std::move(what)) {}
  ~Completion() override { cudaEventDestroy(done_); }
  bool poll() override;
  void order_before(DeviceStream stream) override {
    ACCEL_CUDA_CHECK(cudaStreamWaitEvent(
        stream ? static_cast<cudaStream_t>(stream) : cudaStreamLegacy, done_, 0));
  }
  void abandon() noexcept override;

 private:
  NcclCommunicator::State& state_;
  cudaEvent_t done_;
  std::string what_;
};

}  // namespace

bool Completion::poll() {
  const cudaError_t query = cudaEventQuery(done_);
  if (query == cudaSuccess) return true;
  if (query != cudaErrorNotReady) {
    state_.failed = true;
    detail::throw_cuda_error(query, "cudaEventQuery (waiting for the NCCL kernels)", __FILE__,
                             __LINE__);
  }
  if (state_.comm) (void)state_.in_progress(what_);  // throws on an asynchronous NCCL error
  return false;
}

void Completion::abandon() noexcept { state_.abort(); }

std::shared_ptr<void> NcclCommunicator::on_issue(DeviceStream compute_stream) {
  State& s = *state_;
  // The caller's thread: its current device becomes this rank's (events belong to a device).
  ACCEL_CUDA_CHECK(cudaSetDevice(s.device));
  auto inputs = std::make_shared<InputsEvent>();
  ACCEL_CUDA_CHECK(cudaEventCreateWithFlags(&inputs->event, cudaEventDisableTiming));
  ACCEL_CUDA_CHECK(cudaEventRecord(inputs->event, compute_stream
                                                      ? static_cast<cudaStream_t>(compute_stream)
                                                      : cudaStreamLegacy));
  return inputs;
}

template <typename Enqueue>
void NcclCommunicator::run(const std::string& what, Milliseconds timeout, Enqueue&& enqueue) {
  State& s = *state_;
  const auto* inputs = static_cast<const InputsEvent*>(issued_inputs().get());
  ACCEL_CHECK_ARG(inputs != nullptr,
                  "NcclCommunicator: " + what + " was not issued through on_issue");
  cudaEvent_t done = s.launch(what, timeout, inputs->event, std::forward<Enqueue>(enqueue));
  defer_completion(std::make_shared<Completion>(s, done, what));
}

NcclCommunicator::NcclCommunicator(const CommOptions& options)
    : Communicator(options.rank, options.world_size, options.timeout),
      state_(std::make_unique<State>()) {
  ACCEL_CHECK_ARG(options.store != nullptr,
                  "NcclCommunicator needs a rendezvous store to exchange the NCCL unique id");
  State& s = *state_;
  s.finalize_wait = std::min(timeout(), kMaxFinalizeWait);
  const int device = pick_device(options);
  int visible = 0;
  ACCEL_CUDA_CHECK(cudaGetDeviceCount(&visible));
  if (device >= visible)
    throw InvalidArgument("NcclCommunicator: rank " + std::to_string(rank()) +
                          " was given CUDA device " + std::to_string(device) + ", but only " +
                          std::to_string(visible) + " device(s) are visible");
  s.device = device;
  try {
    ACCEL_CUDA_CHECK(cudaSetDevice(s.device));
    // Non-blocking: our stream must not serialise with the legacy default stream, or every
    // collective would stall the caller's compute (and the reverse); run() orders the inputs
    // explicitly instead.
    ACCEL_CUDA_CHECK(cudaStreamCreateWithFlags(&s.stream, cudaStreamNonBlocking));
    ACCEL_CUDA_CHECK(cudaMalloc(&s.barrier_word, sizeof(std::int32_t)));
    ACCEL_CUDA_CHECK(cudaMemset(s.barrier_word, 0, sizeof(std::int32_t)));

    const std::string key = "nccl/unique_id/" + std::to_string(g_communicators_created++);
    ncclUniqueId id;
    if (rank() == 0) {
      ACCEL_NCCL_CHECK(ncclGetUniqueId(&id));
      options.store->set(key, std::string(reinterpret_cast<const char*>(&id), sizeof(id)));
    } else {
      const std::string value = options.store->get(key, timeout());
      if (value.size() != sizeof(id))
        throw CommError("NcclCommunicator: store key '" + key + "' holds " +
                        std::to_string(value.size()) + " bytes, not an NCCL unique id (" +
                        std::to_string(sizeof(id)) + " bytes)");
      std::memcpy(&id, value.data(), sizeof(id));
    }

    // Nonblocking, so that joining returns at once and can time out: a blocking
    // ncclCommInitRank waits for every rank with no limit.
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    const auto deadline = Clock::now() + timeout();
    const ncclResult_t rc = ncclCommInitRankConfig(&s.comm, world_size(), id, rank(), &config);
    if (rc != ncclSuccess && rc != ncclInProgress)
      detail::throw_nccl_error(rc, "ncclCommInitRankConfig", __FILE__, __LINE__);
    s.wait_ready("NcclCommunicator: rank " + std::to_string(rank()) + " of " +
                     std::to_string(world_size()) + " joining (ncclCommInitRankConfig)",
                 deadline, timeout());
  } catch (...) {
    s.failed = true;  // ~State aborts whatever was created
    throw;
  }
}

NcclCommunicator::~NcclCommunicator() {
  stop_worker();
  state_.reset();
}

int NcclCommunicator::cuda_device() const { return state_->device; }

void NcclCommunicator::run_all_reduce(Buffer data, ReduceOp op, Milliseconds timeout) {
  require_cuda(data, "all_reduce");
  State& s = *state_;
  run("ncclAllReduce", timeout, [&] {
    ACCEL_NCCL_CHECK_ASYNC(ncclAllReduce(data.data, data.data, data.count, nccl_type(data.dtype),
                                         nccl_op(op), s.comm, s.stream));
  });
}

void NcclCommunicator::run_broadcast(Buffer data, int root, Milliseconds timeout) {
  require_cuda(data, "broadcast");
  State& s = *state_;
  run("ncclBroadcast", timeout, [&] {
    ACCEL_NCCL_CHECK_ASYNC(ncclBroadcast(data.data, data.data, data.count, nccl_type(data.dtype),
                                         root, s.comm, s.stream));
  });
}

void NcclCommunicator::run_all_gather(Buffer input, Buffer output, const Parts& parts,
                                      Milliseconds timeout) {
  require_cuda(input, "all_gather");
  require_cuda(output, "all_gather");
  const int world = world_size();
  const int me = rank();
  const Shard mine = parts[std::size_t(me)];
  void* const own = output.slice(mine.offset, mine.count).data;
  ACCEL_CHECK_ARG(input.data == own || !overlaps(input, output),
                  "NcclCommunicator all_gather: the input overlaps the output other than as this "
                  "rank's own part of it");
  const ncclDataType_t type = nccl_type(output.dtype);
  State& s = *state_;
  if (parts.equal()) {
    run("ncclAllGather", timeout, [&] {
      ACCEL_NCCL_CHECK_ASYNC(
          ncclAllGather(input.data, output.data, mine.count, type, s.comm, s.stream));
    });
    return;
  }
  // Unequal parts: ncclAllGather cannot take them, so each rank broadcasts its part, all in one
  // group (NCCL then runs the broadcasts concurrently, as one operation).
  run("all_gather as grouped ncclBroadcast", timeout, [&] {
    for (int r = 0; r < world; ++r) {
      const Shard part = parts[std::size_t(r)];
      if (part.count == 0) continue;
      void* const slot = output.slice(part.offset, part.count).data;
      // sendbuff is read on the root only.
      ACCEL_NCCL_CHECK_ASYNC(
          ncclBroadcast(r == me ? input.data : slot, slot, part.count, type, r, s.comm, s.stream));
    }
  });
}

void NcclCommunicator::run_reduce_scatter(Buffer input, Buffer output, ReduceOp op,
                                          const Parts& parts, Milliseconds timeout) {
  require_cuda(input, "reduce_scatter");
  require_cuda(output, "reduce_scatter");
  const int world = world_size();
  const int me = rank();
  const Shard mine = parts[std::size_t(me)];
  ACCEL_CHECK_ARG(
      output.data == input.slice(mine.offset, mine.count).data || !overlaps(input, output),
      "NcclCommunicator reduce_scatter: the output overlaps the input other than as "
      "this rank's own part of it");
  const ncclDataType_t type = nccl_type(input.dtype);
  const ncclRedOp_t nop = nccl_op(op);
  State& s = *state_;
  if (parts.equal()) {
    run("ncclReduceScatter", timeout, [&] {
      ACCEL_NCCL_CHECK_ASYNC(
          ncclReduceScatter(input.data, output.data, mine.count, type, nop, s.comm, s.stream));
    });
    return;
  }
  // Unequal parts: one reduce to each part's owner, all in one group.
  run("reduce_scatter as grouped ncclReduce", timeout, [&] {
    for (int r = 0; r < world; ++r) {
      const Shard part = parts[std::size_t(r)];
      if (part.count == 0) continue;
      // recvbuff is written on the root only.
      ACCEL_NCCL_CHECK_ASYNC(ncclReduce(input.slice(part.offset, part.count).data,
                                        r == me ? output.data : nullptr, part.count, type, nop, r,
                                        s.comm, s.stream));
    }
  });
}

void NcclCommunicator::run_barrier(Milliseconds timeout) {
  State& s = *state_;
  run("barrier (ncclAllReduce of one int)", timeout, [&] {
    ACCEL_NCCL_CHECK_ASYNC(
        ncclAllReduce(s.barrier_word, s.barrier_word, 1, ncclInt32, ncclSum, s.comm, s.stream));
  });
}

void NcclCommunicator::run_send(Buffer data, int dst, std::uint32_t /*tag*/, Milliseconds timeout) {
  require_cuda(data, "send");
  State& s = *state_;
  run("ncclSend to rank " + std::to_string(dst), timeout, [&] {
    ACCEL_NCCL_CHECK_ASYNC(
        ncclSend(data.data, data.count, nccl_type(data.dtype), dst, s.comm, s.stream));
  });
}

void NcclCommunicator::run_recv(Buffer data, int src, std::uint32_t /*tag*/, Milliseconds timeout) {
  require_cuda(data, "recv");
  State& s = *state_;
  run("ncclRecv from rank " + std::to_string(src), timeout, [&] {
    ACCEL_NCCL_CHECK_ASYNC(
        ncclRecv(data.data, data.count, nccl_type(data.dtype), src, s.comm, s.stream));
  });
}

std::string nccl_library_version() {
  int v = 0;
  if (ncclGetVersion(&v) != ncclSuccess) return "unknown";
  // NCCL_VERSION(X,Y,Z) is X*10000 + Y*100 + Z since 2.9 (X*1000 + Y*100 + Z before).
  const int major = v >= 10000 ? v / 10000 : v / 1000;
  const int minor = v >= 10000 ? (v / 100) % 100 : (v / 100) % 10;
  return std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(v % 100);
}

std::string cuda_summary() {
  auto version = [](int v) {
    return std::to_string(v / 1000) + "." + std::to_string((v % 1000) / 10);
  };
  int runtime = 0, driver = 0, devices = 0;
  cudaRuntimeGetVersion(&runtime);
  std::string out = "runtime " + version(runtime);
  if (cudaDriverGetVersion(&driver) != cudaSuccess || driver == 0) return out + ", no driver";
  out += ", driver " + version(driver);
  const cudaError_t rc = cudaGetDeviceCount(&devices);
  if (rc != cudaSuccess) return out + ", no device usable: " + cudaGetErrorString(rc);
  out += ", " + std::to_string(devices) + (devices == 1 ? " device" : " devices");
  for (int d = 0; d < devices; ++d) {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, d) == cudaSuccess)
      out += std::string(d == 0 ? ": " : ", ") + std::to_string(d) + " " + prop.name + " (" +
             std::to_string(prop.totalGlobalMem >> 30) + " GiB)";
  }
  return out;
}

}  // namespace accel
