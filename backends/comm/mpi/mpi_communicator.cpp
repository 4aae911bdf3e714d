#include "backends/comm/mpi/mpi_communicator.hpp"

#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "backends/comm/mpi/mpi_check.hpp"
#include "backends/comm/mpi/mpi_watchdog.hpp"
#include "foundation/env_value.hpp"
#include "foundation/error.hpp"
#include "foundation/host_cores.hpp"
#include "foundation/store/store_join.hpp"

// The most elements one MPI call is given. MPI counts are int, hence INT_MAX; a test may
// build this file with a tiny value to exercise the chunked paths on small buffers.
#ifndef ACCEL_MPI_MAX_COUNT
#define ACCEL_MPI_MAX_COUNT INT_MAX
#endif

namespace accel {

namespace {

using Clock = std::chrono::steady_clock;

constexpr std::size_t kMaxCount = ACCEL_MPI_MAX_COUNT;
static_assert(kMaxCount >= 1 && kMaxCount <= static_cast<std::size_t>(INT_MAX));

// The ring reduce_scatter's messages, on `internal` (whose tags 1 and 2 are the watchdog's).
constexpr int kRingTag = 3;

// What the whole process shares: MPI is one per process, whatever number of communicators.
struct Process {
  // Held around our MPI calls, except the blocking collectives (which may wait long for a
  // peer, and MPI_THREAD_MULTIPLE lets communicators run theirs at once) and the watchdogs'.
  std::mutex mutex;
  bool ops_created = false;
  MPI_Op half_ops[2][3] = {};  // [f16, bf16][sum, min, max]: user ops over 16-bit floats
  // Some operation was given up while MPI still had it in flight: MPI_Finalize (which waits
  // for peers) and MPI_Comm_free are then skipped, so the process can still exit.
  std::atomic<bool> abandoned{false};
  // Set as MPI_Finalize begins, whoever calls it (watch_finalize): refuse_once_finalizing
  // reads it rather than MPI_Finalized, which takes Open MPI's bootstrap mutex on every call.
  std::atomic<bool> finalizing{false};
  bool finalize_watched = false;
};

Process& process() {
  // Never destroyed: the atexit handler and destructors of late objects still need it.
  static Process* const p = new Process;
  return *p;
}

// Refuses once MPI_Finalize has begun: the application's, or our atexit handler's while a
// leaked communicator's worker still runs (the flag watch_finalize's callback sets; every
// communicator exists only after MPI was initialised and that callback registered).
bool refuse_once_finalizing() {
  if (process().finalizing.load(std::memory_order_acquire))
    throw CommError("MPI has already been finalised in this process");
  return true;
}

// The process-wide MPI lock, refusing once MPI_Finalize has begun.
class MpiLock {
 public:
  MpiLock() : lock_(process().mutex) { refuse_once_finalizing(); }

 private:
  std::unique_lock<std::mutex> lock_;
};

void finalize_at_exit() {
  mpi_detail::Watchdog::quiesce();
  Process& p = process();
  std::lock_guard lock(p.mutex);
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized || p.abandoned) return;
  MPI_Finalize();
}

const char* thread_level_name(int level) {
  switch (level) {
    case MPI_THREAD_SINGLE:
      return "MPI_THREAD_SINGLE";
    case MPI_THREAD_FUNNELED:
      return "MPI_THREAD_FUNNELED";
    case MPI_THREAD_SERIALIZED:
      return "MPI_THREAD_SERIALIZED";
    case MPI_THREAD_MULTIPLE:
      return "MPI_THREAD_MULTIPLE";
  }
  return "an unknown thread level";
}

// MPI has no 16-bit float types: f16 and bf16 travel as MPI_UINT16_T and reduce through
// these user ops, which widen to float like every other CPU backend (reduce_kernel).
// MPI's contract: inout[i] = in[i] (op) inout[i].
template <DType D, ReduceOp Op>
void half_reduce(void* in, void* inout, int* len, MPI_Datatype*) {
  reduce_kernel(D, Op)(inout, in, inout, static_cast<std::size_t>(*len));
}

// MPI_Finalize frees MPI_COMM_SELF before anything else, calling the delete callbacks of its
// attributes (the MPI standard's way to run code at finalisation), ours or the application's:
// this one marks the process and stops the watchdogs' MPI calls, as our atexit handler does.
int on_finalize(MPI_Comm, int, void*, void*) {
  process().finalizing.store(true, std::memory_order_release);
  mpi_detail::Watchdog::quiesce();
  return MPI_SUCCESS;
}

// Caller holds the process lock; MPI is initialised and not finalised.
void watch_finalize(Process& p) {
  if (p.finalize_watched) return;
  int key = MPI_KEYVAL_INVALID;
  ACCEL_MPI_CHECK(MPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN, &on_finalize, &key, nullptr));
  ACCEL_MPI_CHECK(MPI_Comm_set_attr(MPI_COMM_SELF, key, nullptr));
  p.finalize_watched = true;
}

// Caller holds the process lock.
void initialise_mpi(Process& p) {
  int initialized = 0;
  int finalized = 0;
  ACCEL_MPI_CHECK(MPI_Initialized(&initialized));
  ACCEL_MPI_CHECK(MPI_Finalized(&finalized));
  if (finalized)
    throw CommError(
        "MpiCommunicator: MPI has already been finalised in this process and "
        "cannot be initialised again");
  int provided = MPI_THREAD_SINGLE;
  if (!initialized) {
    ACCEL_MPI_CHECK(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided));
    // At exit rather than in a destructor: MPI cannot be initialised twice, so finalising
    // when one communicator goes would make every later one in this process impossible.
    std::atexit(&finalize_at_exit);
    if (provided < MPI_THREAD_MULTIPLE)
      throw CommError(std::string("MpiCommunicator: this MPI library provides only ") +
                      thread_level_name(provided) +
                      "; MpiCommunicator calls MPI from several threads at once (each "
                      "communicator's, and its watchdog) and needs MPI_THREAD_MULTIPLE");
  } else {
    ACCEL_MPI_CHECK(MPI_Query_thread(&provided));
    if (provided < MPI_THREAD_MULTIPLE)
      throw CommError(std::string("MpiCommunicator: MPI was initialised by the application "
                                  "with ") +
                      thread_level_name(provided) +
                      ", but MpiCommunicator calls MPI from several threads at once (each "
                      "communicator's, and its watchdog); initialise with "
                      "MPI_Init_thread(..., MPI_THREAD_MULTIPLE, ...), or let MpiCommunicator "
                      "initialise MPI");
  }
  watch_finalize(p);
  if (!p.ops_created) {
    ACCEL_MPI_CHECK(MPI_Op_create(&half_reduce<DType::f16, ReduceOp::sum>, 1, &p.half_ops[0][0]));
    ACCEL_MPI_CHECK(MPI_Op_create(&half_reduce<DType::f16, ReduceOp::min>, 1, &p.half_ops[0][1]));
    ACCEL_MPI_CHECK(MPI_Op_create(&half_reduce<DType::f16, ReduceOp::max>, 1, &p.half_ops[0][2]));
    ACCEL_MPI_CHECK(MPI_Op_create(&half_reduce<DType::bf16, ReduceOp::sum>, 1, &p.half_ops[1][0]));
    ACCEL_MPI_CHECK(MPI_Op_create(&half_reduce<DType::bf16, ReduceOp::min>, 1, &p.half_ops[1][1]));
    ACCEL_MPI_CHECK(MPI_Op_create(&half_reduce<DType::bf16, ReduceOp::max>, 1, &p.half_ops[1][2]));
    p.ops_created = true;
  }
}

MPI_Datatype mpi_type(DType dtype) {
  switch (dtype) {
    case DType::f32:
      return MPI_FLOAT;
    case DType::f64:
      return MPI_DOUBLE;
    case DType::f16:
    case DType::bf16:
      return MPI_UINT16_T;
    case DType::i32:
      return MPI_INT32_T;
    case DType::i64:
      return MPI_INT64_T;
  }
  throw InvalidArgument("MpiCommunicator: unsupported dtype");
}

// `op` is a wire op (avg already turned into sum).
MPI_Op mpi_op(DType dtype, ReduceOp op) {
  int index = 0;
  MPI_Op native = MPI_SUM;
  switch (op) {
    case ReduceOp::sum:
      index = 0;
      native = MPI_SUM;
      break;
    case ReduceOp::min:
      index = 1;
      native = MPI_MIN;
      break;
    case ReduceOp::max:
      index = 2;
      native = MPI_MAX;
      break;
    case ReduceOp::avg:
      throw InvalidArgument("MpiCommunicator: avg is not a wire op");
  }
  if (dtype == DType::f16) return process().half_ops[0][index];
  if (dtype == DType::bf16) return process().half_ops[1][index];
  return native;
}

// Calls f(offset, n) for consecutive pieces of at most kMaxCount elements (once, with n = 0,
// for an empty buffer).
template <typename F>
void for_each_chunk(std::size_t count, F&& f) {
  std::size_t offset = 0;
  do {
    const std::size_t n = std::min(kMaxCount, count - offset);
    f(offset, static_cast<int>(n));
    offset += n;
  } while (offset < count);
}

// How one send or recv describes its buffer: as a single message whatever the count, so a
// receiver always sees a size mismatch (pieces sent separately could pair up wrongly). Up to
// kMaxCount elements that is the element type itself; beyond, a struct of kMaxCount-element
// blocks plus the remainder, counted once. The caller frees a derived type.
struct MessageType {
  MPI_Datatype type = MPI_DATATYPE_NULL;
  int count = 0;
  bool derived = false;
};

// Caller holds the process lock.
MessageType message_type(DType dtype, std::size_t count) {
  const MPI_Datatype base = mpi_type(dtype);
  if (count <= kMaxCount) return {base, static_cast<int>(count), false};
  const std::size_t blocks = count / kMaxCount;
  const std::size_t rest = count % kMaxCount;
  if (blocks > static_cast<std::size_t>(INT_MAX))
    throw InvalidArgument("MpiCommunicator: " + std::to_string(count) +
                          " elements are more than one MPI message can describe");
  MPI_Datatype block = MPI_DATATYPE_NULL;
  ACCEL_MPI_CHECK(MPI_Type_contiguous(static_cast<int>(kMaxCount), base, &block));
  int lengths[2] = {static_cast<int>(blocks), static_cast<int>(rest)};
  MPI_Aint displacements[2] = {0, static_cast<MPI_Aint>(blocks * kMaxCount * element_size(dtype))};
  MPI_Datatype types[2] = {block, base};
  MessageType message{MPI_DATATYPE_NULL, 1, true};
  const int rc = MPI_Type_create_struct(2, lengths, displacements, types, &message.type);
  MPI_Type_free(&block);  // the struct keeps what it needs
  if (rc != MPI_SUCCESS) detail::throw_mpi_error(rc, "MPI_Type_create_struct", __FILE__, __LINE__);
  ACCEL_MPI_CHECK(MPI_Type_commit(&message.type));
  return message;
}

void check_tag(std::uint32_t tag, int tag_ub, const char* op) {
  if (tag > static_cast<std::uint32_t>(tag_ub))
    throw InvalidArgument(std::string(op) + ": tag " + std::to_string(tag) +
                          " exceeds this MPI's largest tag (MPI_TAG_UB " + std::to_string(tag_ub) +
                          ")");
}

// How long a waiter polls MPI without any system call before it starts yielding: while the
// peer's message is a microsecond away, a sched_yield (a system call, about a microsecond in
// this VM with page-table isolation) delays noticing it. Measured at world 2 on 2 cores: a
// polled meeting before each collective cost 3-4 us yielding against MPI_Barrier's 0.5 us
// (bench/README). Point-to-point operations and the join wait so.
// With more ranks on this host than cores a spinning rank holds the core its peer needs, so
// then it yields at once. The host's online cores count, not this process's affinity (mpirun
// --bind-to core leaves each rank one). ACCEL_MPI_SPIN_US overrides (experiments); mpi_world()
// asks first, so a bad value fails the join.
Clock::duration spin_window() {
  static const Clock::duration window = [] {
    // Ranks on this host unknown: yield.
    const int ranks_here = ranks_on_this_host();
    const bool spin = ranks_here >= 1 && ranks_here <= online_cores();
    return Clock::duration(std::chrono::microseconds(env_uint("ACCEL_MPI_SPIN_US", spin ? 50 : 0)));
  }();
  return window;
}

// Waiting means calling MPI_Test*: without a progress thread MPI advances only inside its
// own calls, so every pause between tests stalls the whole collective (a sleeping poller made
// a 64 MiB all-reduce 2x slower than blocking MPI_Allreduce). So: poll continuously, first
// without system calls (spin_window), then yielding the core to anyone else who wants it
// (what OpenMPI's own blocking calls do when oversubscribed), and only after a long stretch
// without any completion (a straggling peer, not a transfer in progress) fall back to short
// sleeps so a long wait does not burn a core.
class Backoff {
 public:
  explicit Backoff(Clock::time_point deadline) : deadline_(deadline) { reset(); }
  void reset() {
    const auto now = Clock::now();
    spin_until_ = now + spin_window();
    yield_until_ = now + kYieldWindow;
    pause_ = Clock::duration::zero();
  }
  void pause() {
    const auto now = Clock::now();
    if (now < spin_until_) return;
    if (now < yield_until_) {
      sched_yield();
      return;
    }
    pause_ = pause_ == Clock::duration::zero() ? Clock::duration(kMinPause)
                                               : std::min<Clock::duration>(pause_ * 2, kMaxPause);
    std::this_thread::sleep_for(std::min<Clock::duration>(pause_, deadline_ - now));
  }

 private:
  static constexpr auto kYieldWindow = std::chrono::seconds(5);
  static constexpr auto kMinPause = std::chrono::microseconds(50);
  static constexpr auto kMaxPause = std::chrono::microseconds(1000);
  Clock::time_point deadline_;
  Clock::time_point spin_until_;
  Clock::time_point yield_until_;
  Clock::duration pause_{};
};

// What MPI may still touch while requests are in flight, besides the caller's buffers: the
// communicators MPI_Comm_idup is making.
struct Scratch {
  MPI_Comm new_comm = MPI_COMM_NULL;
  MPI_Comm new_internal = MPI_COMM_NULL;
};

// The requests of one operation, polled to completion against a deadline. If it is given up
// (timeout or error) while MPI still has requests in flight, the scratch is leaked on purpose:
// MPI may write into it later, and a little leaked memory beats corrupted memory.
class Pending {
 public:
  using OnDone = std::function<void(std::size_t index, const MPI_Status& status)>;

  Pending() : scratch_(std::make_unique<Scratch>()) {}
  Pending(const Pending&) = delete;
  Pending& operator=(const Pending&) = delete;
  ~Pending() {
    if (!in_flight()) return;
    process().abandoned = true;
    (void)scratch_.release();
  }

  // A slot for the next request; the pointer is valid until the next call.
  MPI_Request* next() {
    requests_.push_back(MPI_REQUEST_NULL);
    return &requests_.back();
  }
  Scratch& scratch() { return *scratch_; }

  // Polls until every request completed; on_done sees each completion's status. Throws
  // TimeoutError naming `what` after `timeout`, CommError when MPI reports an error.
  void wait(const std::string& what, Milliseconds timeout, bool point_to_point = false,
            const OnDone& on_done = {}) {
    const int n = static_cast<int>(requests_.size());
    std::vector<int> indices(requests_.size());
    std::vector<MPI_Status> statuses(requests_.size());
    const auto deadline = Clock::now() + timeout;
    Backoff backoff(deadline);
    while (in_flight()) {
      int done = 0;
      int rc = MPI_SUCCESS;
      {
        MpiLock lock;
        rc = MPI_Testsome(n, requests_.data(), &done, indices.data(), statuses.data());
      }
      if (rc == MPI_ERR_IN_STATUS) {
        for (int i = 0; i < done; ++i)
          if (statuses[i].MPI_ERROR != MPI_SUCCESS)
            detail::throw_mpi_error(statuses[i].MPI_ERROR, what.c_str(), __FILE__, __LINE__);
      }
      if (rc != MPI_SUCCESS) detail::throw_mpi_error(rc, what.c_str(), __FILE__, __LINE__);
      if (done == MPI_UNDEFINED) break;  // no active request left
      if (on_done)
        for (int i = 0; i < done; ++i) on_done(static_cast<std::size_t>(indices[i]), statuses[i]);
      if (done > 0) {
        backoff.reset();
        continue;
      }
      if (Clock::now() >= deadline) {
        if (point_to_point) try_cancel();
        throw TimeoutError(what + " did not complete within " + std::to_string(timeout.count()) +
                           " ms");
      }
      backoff.pause();
    }
  }

 private:
  bool in_flight() const {
    return std::any_of(requests_.begin(), requests_.end(),
                       [](MPI_Request r) { return r != MPI_REQUEST_NULL; });
  }

  // Unlike collectives, point-to-point requests can be cancelled; a cancelled request
  // completes locally, so its buffer is ours again. Whatever does not complete within a short
  // grace period (MPI may refuse to cancel a send) stays abandoned.
  void try_cancel() noexcept {
    try {
      {
        MpiLock lock;
        for (MPI_Request& r : requests_)
          if (r != MPI_REQUEST_NULL) MPI_Cancel(&r);
      }
      const auto until = Clock::now() + std::chrono::milliseconds(100);
      while (in_flight() && Clock::now() < until) {
        {
          MpiLock lock;
          int flag = 0;
          MPI_Testall(static_cast<int>(requests_.size()), requests_.data(), &flag,
                      MPI_STATUSES_IGNORE);
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
    } catch (...) {
      // Best effort: the destructor marks whatever is left as abandoned.
    }
  }

  std::vector<MPI_Request> requests_;
  std::unique_ptr<Scratch> scratch_;
};

// kInlineBytes where the worker thread can run beside the caller, else every size (see the
// header); ACCEL_MPI_INLINE_BYTES overrides (experiments; mpi_world() asks first).
std::size_t inline_max_bytes() {
  static const std::size_t bytes = env_uint(
      "ACCEL_MPI_INLINE_BYTES", worker_can_overlap() ? MpiCommunicator::kInlineBytes
                                                     : std::numeric_limits<std::size_t>::max());
  return bytes;
}

}  // namespace

struct MpiCommunicator::State {
  MPI_Comm comm = MPI_COMM_NULL;
  // The watchdogs' questions and answers, apart from the user's send/recv on `comm`, so a
  // message of ours can never match a receive of theirs.
  MPI_Comm internal = MPI_COMM_NULL;
  std::unique_ptr<mpi_detail::Watchdog> watchdog;  // on `internal`
  int tag_ub = 32767;  // the least MPI guarantees; replaced by the library's MPI_TAG_UB
  // The ring reduce_scatter's two part-sized buffers (what is received, what is sent on),
  // kept between operations: fresh pages cost more than the copy through them.
  std::vector<std::byte> ring_scratch;
};

MpiCommunicator::World MpiCommunicator::mpi_world() {
  // The knobs are read now, so a bad value fails before MPI is touched.
  (void)spin_window();
  (void)inline_max_bytes();
  Process& p = process();
  World world;
  std::lock_guard lock(p.mutex);
  initialise_mpi(p);
  ACCEL_MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &world.rank));
  ACCEL_MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &world.size));
  return world;
}

MpiCommunicator::World MpiCommunicator::join_world(const CommOptions& options) {
  const World world = mpi_world();
  const bool rank_ok = options.rank < 0 || options.rank == world.rank;
  const bool size_ok = options.world_size < 0 || options.world_size == world.size;
  // The usual way to get here: a job's processes started by something other than mpirun
  // (`accel launch` without --use_mpi, torchrun), each of them an MPI world of one.
  if (world.size == 1 && options.world_size > 1)
    throw InvalidArgument(
        "MpiCommunicator: rank " + std::to_string(options.rank) + " of " +
        std::to_string(options.world_size) +
        " asked for the mpi communicator, but this process was not started by mpirun (its "
        "MPI_COMM_WORLD holds only itself): start the job with `accel launch --use_mpi` (or "
        "mpirun -np " +
        std::to_string(options.world_size) +
        "), or choose another communicator (cpu_communicator, ACCEL_COMM_BACKEND)");
  if (!rank_ok || !size_ok)
    throw InvalidArgument("MpiCommunicator: the options say rank " + std::to_string(options.rank) +
                          " of world size " + std::to_string(options.world_size) +
                          ", but MPI_COMM_WORLD has this process as rank " +
                          std::to_string(world.rank) + " of " + std::to_string(world.size) +
                          " (pass -1 to take MPI's)");
  return world;
}

MpiCommunicator::MpiCommunicator(const CommOptions& options)
    : MpiCommunicator(options, join_world(options)) {}

MpiCommunicator::MpiCommunicator(const CommOptions& options, World world)
    : Communicator(world.rank, world.size, options.timeout), state_(std::make_unique<State>()) {
  // A communicator of our own, so our traffic never matches the application's own messages on
  // MPI_COMM_WORLD. MPI_Comm_idup rather than MPI_Comm_dup: duplicating is collective, and a
  // rank that never arrives must become a timeout, not a hang.
  Pending pending;
  {
    MpiLock lock;
    ACCEL_MPI_CHECK(MPI_Comm_idup(MPI_COMM_WORLD, &pending.scratch().new_comm, pending.next()));
    ACCEL_MPI_CHECK(MPI_Comm_idup(MPI_COMM_WORLD, &pending.scratch().new_internal, pending.next()));
  }
  try {
    pending.wait("MPI_Comm_idup(MPI_COMM_WORLD)", timeout());
  } catch (const TimeoutError& e) {
    throw TimeoutError("MpiCommunicator: rank " + std::to_string(rank()) + " of " +
                       std::to_string(world_size()) + " could not join: " + e.what() +
                       "; does every rank construct an MpiCommunicator?");
  }
  adopt(&pending.scratch().new_comm, &pending.scratch().new_internal);
}

MpiCommunicator::MpiCommunicator(const CommOptions& options, const std::vector<int>& members)
    : Communicator(options.rank, options.world_size, options.timeout),
      state_(std::make_unique<State>()) {
  const int n = world_size();
  ACCEL_CHECK_ARG(int(members.size()) == n, "MpiCommunicator: a group of " + std::to_string(n) +
                                                " ranks needs " + std::to_string(n) +
                                                " members, not " + std::to_string(members.size()));
  ACCEL_CHECK_ARG(options.store != nullptr,
                  "MpiCommunicator: a group of MPI_COMM_WORLD's ranks meets on the store first");
  const int world_rank = mpi_world().rank;
  ACCEL_CHECK_ARG(members[std::size_t(rank())] == world_rank,
                  "MpiCommunicator: group '" + options.group_name + "' has rank " +
                      std::to_string(rank()) + " as MPI rank " +
                      std::to_string(members[std::size_t(rank())]) + ", but this process is " +
                      std::to_string(world_rank));
  // MPI_Comm_create_group involves the members alone but blocks with no timeout: they meet on
  // the store first, where one that never comes is a TimeoutError naming it.
  const std::vector<int> missing =
      join_on_store(*options.store, "mpi-group/" + options.group_name + "/", rank(), n, timeout());
  if (!missing.empty()) {
    throw TimeoutError("MpiCommunicator: group '" + options.group_name + "': ranks " +
                       format_ranks(missing) + " of " + std::to_string(n) +
                       " did not join within " + std::to_string(timeout().count()) + " ms");
  }
  MPI_Comm comm = MPI_COMM_NULL, internal = MPI_COMM_NULL;
  {
    MpiLock lock;
    MPI_Group world_group = MPI_GROUP_NULL, group = MPI_GROUP_NULL;
    ACCEL_MPI_CHECK(MPI_Comm_group(MPI_COMM_WORLD, &world_group));
    ACCEL_MPI_CHECK(MPI_Group_incl(world_group, n, members.data(), &group));
    // The tag keeps groups made one after another apart; any value up to 32767 is valid.
    const int tag = int(std::hash<std::string>{}(options.group_name) % 32768);
    const int rc = MPI_Comm_create_group(MPI_COMM_WORLD, group, tag, &comm);
    MPI_Group_free(&group);
    MPI_Group_free(&world_group);
    if (rc != MPI_SUCCESS) detail::throw_mpi_error(rc, "MPI_Comm_create_group", __FILE__, __LINE__);
    ACCEL_MPI_CHECK(MPI_Comm_dup(comm, &internal));
  }
  adopt(&comm, &internal);
}

// Takes a communicator and its internal twin, made by the caller: errors as codes, names,
// the watchdog, inline execution. Frees both if that fails.
void MpiCommunicator::adopt(void* comm_handle, void* internal_handle) {
  MPI_Comm comm = *static_cast<MPI_Comm*>(comm_handle);
  MPI_Comm internal = *static_cast<MPI_Comm*>(internal_handle);
  try {
    MpiLock lock;
    // Errors come back as codes (and so as exceptions) instead of aborting the job.
    ACCEL_MPI_CHECK(MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN));
    ACCEL_MPI_CHECK(MPI_Comm_set_errhandler(internal, MPI_ERRORS_RETURN));
    ACCEL_MPI_CHECK(MPI_Comm_set_name(comm, "accel"));
    ACCEL_MPI_CHECK(MPI_Comm_set_name(internal, "accel-internal"));
    void* value = nullptr;
    int flag = 0;
    ACCEL_MPI_CHECK(MPI_Comm_get_attr(comm, MPI_TAG_UB, &value, &flag));
    if (flag && value) state_->tag_ub = *static_cast<int*>(value);
    state_->watchdog =
        std::make_unique<mpi_detail::Watchdog>(internal, rank(), world_size(), timeout());
  } catch (...) {
    std::lock_guard lock(process().mutex);
    MPI_Comm_free(&comm);
    MPI_Comm_free(&internal);
    throw;
  }
  state_->internal = internal;
  state_->comm = comm;
  set_inline_max_bytes(inline_max_bytes());
}

std::unique_ptr<MpiCommunicator> MpiCommunicator::from_world(Milliseconds timeout) {
  CommOptions options;
  options.rank = -1;
  options.world_size = -1;
  options.timeout = timeout;
  return std::make_unique<MpiCommunicator>(options);
}

MpiCommunicator::~MpiCommunicator() {
  stop_worker();
  if (!state_ || state_->comm == MPI_COMM_NULL) return;
  Process& p = process();
  std::lock_guard lock(p.mutex);
  // Nothing to free once MPI_Finalize has begun (the flag refuse_once_finalizing reads). After
  // an abandoned operation MPI may still be using this communicator; leave it be.
  if (!p.finalizing.load(std::memory_order_acquire) && !p.abandoned) {
    if (state_->watchdog) state_->watchdog->close();
    MPI_Comm_free(&state_->comm);
    MPI_Comm_free(&state_->internal);
  }
}

// Around every blocking collective: refuses once MPI_Finalize has begun, and lets the
// watchdog end the process if the collective outlives the timeout (the operation's label and
// deadline, the base class's). No process lock: under MPI_THREAD_MULTIPLE communicators run
// their collectives at once, so one whose peers are late never holds up another's.
class MpiCommunicator::Collective {
 public:
  Collective(MpiCommunicator& comm, const char* mpi_call)
      : usable_(refuse_once_finalizing()),
        watch_(*comm.state_->watchdog, comm.current_label(), comm.current_deadline(), mpi_call) {}

 private:
  [[maybe_unused]] bool usable_;  // checked before the watch begins
  mpi_detail::Watchdog::Watch watch_;
};

// Every collective is MPI's blocking one, watched (Collective): a rank that never arrives
// makes the others' watchdogs end their processes after the timeout, naming it, and a rank
// dying inside one makes Open MPI abort the job. The nonblocking collectives (MPI_Iallreduce,
// ...) would carry the timeout themselves, but Open MPI runs them through libnbc, far behind
// its blocking algorithms: 3.1 against 7.6 GB/s busbw for a 64 MiB all-reduce, 8-14 against
// 2-5 us for a 4 KiB one (comm_bench's raw_mpi_nb and raw_mpi, world 2). Meeting the other
// ranks over point-to-point messages first, which carried the timeout before the watchdog,
// cost 0.5-1 us per collective at world 2 (bench/journal/2026-12-04, "The MPI watchdog").
// The `timeout` the base class passes is the communicator's, which the watchdog holds.
void MpiCommunicator::run_all_reduce(Buffer data, ReduceOp op, Milliseconds) {
  const MPI_Datatype type = mpi_type(data.dtype);
  const MPI_Op mop = mpi_op(data.dtype, wire_op(op));
  {
    Collective watched(*this, "MPI_Allreduce");
    for_each_chunk(data.count, [&](std::size_t offset, int n) {
      ACCEL_MPI_CHECK(
          MPI_Allreduce(MPI_IN_PLACE, data.slice(offset, n).data, n, type, mop, state_->comm));
    });
  }
  if (op == ReduceOp::avg) finish_average(data);
}

void MpiCommunicator::run_broadcast(Buffer data, int root, Milliseconds) {
  const MPI_Datatype type = mpi_type(data.dtype);
  Collective watched(*this, "MPI_Bcast");
  for_each_chunk(data.count, [&](std::size_t offset, int n) {
    ACCEL_MPI_CHECK(MPI_Bcast(data.slice(offset, n).data, n, type, root, state_->comm));
  });
}

void MpiCommunicator::run_all_gather(Buffer input, Buffer output, const Parts& parts,
                                     Milliseconds) {
  const int world = world_size();
  const Shard mine = parts[std::size_t(rank())];
  const Buffer own = output.slice(mine.offset, mine.count);
  const MPI_Datatype type = mpi_type(output.dtype);
  bool in_place = input.data == own.data || input.count == 0;
  if (!in_place && overlaps(input, output)) {
    // MPI forbids overlapping send and receive buffers. In place, MPI takes this rank's part
    // from its slot in the output, so move it there first (memmove: they overlap).
    std::memmove(own.data, input.data, input.bytes());
    in_place = true;
  }
  if (parts.equal() && output.count <= kMaxCount) {
    // Equal parts: MPI_Allgather, whose algorithms Open MPI tunes more than MPI_Allgatherv's
    // (at world 4, 16 KiB: 38 against 84 us).
    const int n = static_cast<int>(mine.count);
    Collective watched(*this, "MPI_Allgather");
    ACCEL_MPI_CHECK(MPI_Allgather(in_place ? MPI_IN_PLACE : input.data, n, type, output.data, n,
                                  type, state_->comm));
    return;
  }
  if (output.count <= kMaxCount) {
    std::vector<int> counts(static_cast<std::size_t>(world)), displs(counts.size());
    for (int r = 0; r < world; ++r) {
      counts[r] = static_cast<int>(parts[std::size_t(r)].count);
      displs[r] = static_cast<int>(parts[std::size_t(r)].offset);
    }
    Collective watched(*this, "MPI_Allgatherv");
    ACCEL_MPI_CHECK(MPI_Allgatherv(in_place ? MPI_IN_PLACE : input.data,
                                   static_cast<int>(input.count), type, output.data, counts.data(),
                                   displs.data(), type, state_->comm));
    return;
  }
  // Offsets past INT_MAX do not fit MPI_Allgatherv's int displacements: every rank broadcasts
  // its own part instead, in chunks.
  if (!in_place) std::memcpy(own.data, input.data, input.bytes());
  Collective watched(*this, "MPI_Bcast");
  for (int r = 0; r < world; ++r) {
    const Shard part = parts[std::size_t(r)];
    for_each_chunk(part.count, [&](std::size_t offset, int n) {
      if (n > 0)
        ACCEL_MPI_CHECK(
            MPI_Bcast(output.slice(part.offset + offset, n).data, n, type, r, state_->comm));
    });
  }
}

// Open MPI 4.1's MPI_Reduce_scatter_block is a reduce to one rank and a scatter: at world 2 a
// ring (ring_reduce_scatter) is 1.2x faster at 4 KiB and 4-10x from 64 KiB up, and at world
// 4 from 256 KiB up, 4x (below that its own algorithm is as fast or faster). bench/README,
// "MPI's reduce_scatter as a ring".
constexpr std::size_t kRingReduceScatterBytes = std::size_t(256) << 10;

void MpiCommunicator::run_reduce_scatter(Buffer input, Buffer output, ReduceOp op,
                                         const Parts& parts, Milliseconds) {
  const int world = world_size();
  if (parts.largest() <= kMaxCount && (world == 2 || input.bytes() >= kRingReduceScatterBytes)) {
    ring_reduce_scatter(input, output, wire_op(op), parts);
    if (op == ReduceOp::avg) finish_average(output);
    return;
  }
  const int me = rank();
  const MPI_Datatype type = mpi_type(input.dtype);
  const MPI_Op mop = mpi_op(input.dtype, wire_op(op));
  // MPI forbids the result overlapping the input (an in-place reduce-scatter, say): reduce
  // into staging then, and copy this rank's part over afterwards.
  Buffer result = output;
  std::vector<std::byte> staging;
  const bool staged = overlaps(input, output);
  if (staged) {
    staging.resize(output.bytes());
    result.data = staging.data();
  }
  const std::size_t mine = parts[std::size_t(me)].count;
  if (parts.equal() && input.count <= kMaxCount) {
    // Equal parts: MPI_Reduce_scatter_block, as all_gather takes MPI_Allgather, without
    // building the counts.
    Collective watched(*this, "MPI_Reduce_scatter_block");
    ACCEL_MPI_CHECK(MPI_Reduce_scatter_block(input.data, result.data, static_cast<int>(mine), type,
                                             mop, state_->comm));
  } else if (input.count <= kMaxCount) {
    std::vector<int> counts(static_cast<std::size_t>(world));
    for (int r = 0; r < world; ++r) counts[r] = static_cast<int>(parts[std::size_t(r)].count);
    Collective watched(*this, "MPI_Reduce_scatter");
    ACCEL_MPI_CHECK(
        MPI_Reduce_scatter(input.data, result.data, counts.data(), type, mop, state_->comm));
  } else {
    // MPI sums the counts in an int: reduce each rank's part to it instead, in chunks.
    Collective watched(*this, "MPI_Reduce");
    for (int r = 0; r < world; ++r) {
      const Shard part = parts[std::size_t(r)];
      for_each_chunk(part.count, [&](std::size_t offset, int n) {
        if (n == 0) return;
        void* out = r == me ? result.slice(offset, n).data : nullptr;
        ACCEL_MPI_CHECK(MPI_Reduce(input.slice(part.offset + offset, n).data, out, n, type, mop, r,
                                   state_->comm));
      });
    }
  }
  if (staged) std::memcpy(output.data, result.data, output.bytes());
  if (op == ReduceOp::avg) finish_average(output);
}

// N-1 steps over MPI_Sendrecv on `internal`: at step s, rank r sends the partial sum of part
// (r - s - 1) mod N on to rank r + 1 and receives part (r - s - 2) mod N's from rank r - 1,
// adding its own input's piece. The last step's part is its own, summed over every rank, and
// goes straight to the output. The input is only read and the output written last, so they
// may overlap (in place) without staging.
void MpiCommunicator::ring_reduce_scatter(Buffer input, Buffer output, ReduceOp wire,
                                          const Parts& parts) {
  const int world = world_size();
  const int me = rank();
  const MPI_Datatype type = mpi_type(input.dtype);
  const std::size_t part_bytes = parts.largest() * element_size(input.dtype);
  if (state_->ring_scratch.size() < 2 * part_bytes) state_->ring_scratch.resize(2 * part_bytes);
  std::byte* received = state_->ring_scratch.data();
  std::byte* onward = received + part_bytes;
  const int right = (me + 1) % world, left = (me + world - 1) % world;
  Collective watched(*this, "MPI_Sendrecv");
  for (int step = 0; step + 1 < world; ++step) {
    const Shard send = parts[std::size_t((me - step - 1 + 2 * world) % world)];
    const Shard recv = parts[std::size_t((me - step - 2 + 2 * world) % world)];
    const void* from = step == 0 ? input.slice(send.offset, send.count).data : onward;
    ACCEL_MPI_CHECK(MPI_Sendrecv(from, static_cast<int>(send.count), type, right, kRingTag,
                                 received, static_cast<int>(recv.count), type, left, kRingTag,
                                 state_->internal, MPI_STATUS_IGNORE));
    void* sum = step + 2 == world ? output.data : onward;
    reduce_elements(sum, received, input.slice(recv.offset, recv.count).data, recv.count,
                    input.dtype, wire);
  }
}

void MpiCommunicator::run_barrier(Milliseconds) {
  Collective watched(*this, "MPI_Barrier");
  ACCEL_MPI_CHECK(MPI_Barrier(state_->comm));
}

void MpiCommunicator::run_send(Buffer data, int dst, std::uint32_t tag, Milliseconds timeout) {
  check_tag(tag, state_->tag_ub, "send");
  const std::string what =
      "MPI_Isend to rank " + std::to_string(dst) + " (tag " + std::to_string(tag) + ")";
  Pending pending;
  {
    MpiLock lock;
    MessageType message = message_type(data.dtype, data.count);
    ACCEL_MPI_CHECK(MPI_Isend(data.data, message.count, message.type, dst, static_cast<int>(tag),
                              state_->comm, pending.next()));
    // Freeing a datatype in use is allowed: the send completes with it regardless.
    if (message.derived) MPI_Type_free(&message.type);
  }
  pending.wait(what, timeout, /*point_to_point=*/true);
}

void MpiCommunicator::run_recv(Buffer data, int src, std::uint32_t tag, Milliseconds timeout) {
  check_tag(tag, state_->tag_ub, "recv");
  const std::string what =
      "MPI_Irecv from rank " + std::to_string(src) + " (tag " + std::to_string(tag) + ")";
  Pending pending;
  MessageType message;
  {
    MpiLock lock;
    message = message_type(data.dtype, data.count);
    ACCEL_MPI_CHECK(MPI_Irecv(data.data, message.count, message.type, src, static_cast<int>(tag),
                              state_->comm, pending.next()));
  }
  // A longer message fails with MPI_ERR_TRUNCATE; a shorter one completes quietly, so count.
  // (If this throws, a derived type leaks: MPI may still be using it.)
  pending.wait(what, timeout, /*point_to_point=*/true, [&](std::size_t, const MPI_Status& status) {
    MPI_Count got = 0;
    {
      MpiLock lock;
      ACCEL_MPI_CHECK(MPI_Get_elements_x(&status, message.type, &got));
    }
    if (got != static_cast<MPI_Count>(data.count))
      throw CommError(what + ": expected " + std::to_string(data.count) + " elements of " +
                      std::string(dtype_name(data.dtype)) + ", rank " + std::to_string(src) +
                      " sent " + std::to_string(got));
  });
  if (message.derived) {
    MpiLock lock;
    MPI_Type_free(&message.type);
  }
}

std::string mpi_library_version() {
  char text[MPI_MAX_LIBRARY_VERSION_STRING] = {};
  int length = 0;
  if (MPI_Get_library_version(text, &length) != MPI_SUCCESS) return "unknown";
  std::string out(text, std::size_t(std::max(0, length)));
  // Open MPI's string runs over several lines; the first names the library and version.
  out = out.substr(0, out.find('\n'));
  while (!out.empty() && (out.back() == '\0' || out.back() == ' ')) out.pop_back();
  return out;
}

}  // namespace accel
