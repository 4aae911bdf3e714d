#include "backends/comm/mpi/mpi_watchdog.hpp"

#include <pthread.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "backends/comm/communicator.hpp"

namespace accel::mpi_detail {

namespace {

using Clock = std::chrono::steady_clock;

constexpr int kQuestionTag = 1;  // payload: the collective the asker is stuck in
constexpr int kAnswerTag = 2;    // payload: Answer

// Held around the watchdogs' own MPI calls, which are made without the process's MPI lock
// (a blocked collective holds that one); quiesce() takes it before MPI_Finalize.
std::mutex& calls_mutex() {
  static std::mutex* const m = new std::mutex;  // never destroyed: used from atexit
  return *m;
}
bool quiesced = false;  // under calls_mutex()

bool mpi_usable() {
  if (quiesced) return false;
  int finalized = 1;
  MPI_Finalized(&finalized);
  return !finalized;
}

std::int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
      .count();
}

// How long an asker waits for the other watchdogs' answers, and a reporting one keeps
// answering before it ends the process (so peers stuck with it learn it was there too).
constexpr Milliseconds kAnswerWait{1000};

// How often the thread looks: a twentieth of the timeout, within 5-100 ms, so a stuck
// collective is reported at most that long after its deadline.
Milliseconds tick_for(Milliseconds timeout) {
  return std::clamp(timeout / 20, Milliseconds(5), Milliseconds(100));
}

}  // namespace

Watchdog::Watchdog(MPI_Comm comm, int rank, int world, Milliseconds timeout)
    : comm_(comm), rank_(rank), world_(world), timeout_(timeout) {
  ACCEL_MPI_CHECK(MPI_Recv_init(&question_in_, 1, MPI_UINT64_T, MPI_ANY_SOURCE, kQuestionTag, comm_,
                                &question_));
  ACCEL_MPI_CHECK(MPI_Start(&question_));
  thread_ = std::thread([this] { loop(); });
  pthread_setname_np(thread_.native_handle(), "accel-mpi-watch");
}

Watchdog::~Watchdog() { close(); }

void Watchdog::close() noexcept {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
  std::lock_guard calls(calls_mutex());
  if (!mpi_usable()) return;
  if (question_ != MPI_REQUEST_NULL) {
    MPI_Cancel(&question_);
    MPI_Wait(&question_, MPI_STATUS_IGNORE);
    MPI_Request_free(&question_);
  }
  // An answer still on its way is MPI's to finish.
  for (Reply& reply : replies_)
    if (reply.request != MPI_REQUEST_NULL) MPI_Request_free(&reply.request);
  replies_.clear();
}

void Watchdog::quiesce() {
  std::lock_guard calls(calls_mutex());
  quiesced = true;
}

void Watchdog::loop() {
  const Milliseconds tick = tick_for(timeout_);
  std::unique_lock lock(mutex_);
  while (!wake_.wait_for(lock, tick, [this] { return stopping_; })) {
    lock.unlock();
    (void)answer_questions();
    if (inside_.load(std::memory_order_acquire) &&
        now_ns() > deadline_ns_.load(std::memory_order_relaxed)) {
      const std::uint64_t index = entered_.load(std::memory_order_acquire);
      const OperationLabel label = *label_;
      const char* call = call_;
      // Still the same collective, so the copies above are its own (a seqlock: the thread
      // running collectives writes them only before entering the next one).
      if (inside_.load(std::memory_order_acquire) &&
          entered_.load(std::memory_order_acquire) == index)
        fire(index, label, call);
    }
    lock.lock();
  }
}

bool Watchdog::answer_questions() {
  std::lock_guard calls(calls_mutex());
  if (!mpi_usable()) return false;
  for (;;) {
    int done = 0;
    MPI_Status status;
    if (MPI_Test(&question_, &done, &status) != MPI_SUCCESS || !done) break;
    Reply& reply = replies_.emplace_back();
    reply.answer.entered = entered_.load(std::memory_order_acquire);
    reply.answer.inside = inside_.load(std::memory_order_acquire) ? 1 : 0;
    MPI_Isend(&reply.answer, 2, MPI_UINT64_T, status.MPI_SOURCE, kAnswerTag, comm_, &reply.request);
    MPI_Start(&question_);
  }
  std::erase_if(replies_, [](Reply& reply) {
    int done = 0;
    MPI_Test(&reply.request, &done, MPI_STATUS_IGNORE);
    return done != 0;
  });
  return true;
}

std::vector<int> Watchdog::ranks_not_in(std::uint64_t index, std::string& why) {
  std::vector<Answer> answers(static_cast<std::size_t>(world_));
  std::vector<MPI_Request> requests;
  requests.reserve(2 * std::size_t(world_));  // a send and a receive per other rank
  {
    std::lock_guard calls(calls_mutex());
    if (!mpi_usable()) return {};
    for (int r = 0; r < world_; ++r) {
      if (r == rank_) continue;
      MPI_Request& send = requests.emplace_back(MPI_REQUEST_NULL);
      MPI_Isend(&index, 1, MPI_UINT64_T, r, kQuestionTag, comm_, &send);
      MPI_Request& recv = requests.emplace_back(MPI_REQUEST_NULL);
      MPI_Irecv(&answers[std::size_t(r)], 2, MPI_UINT64_T, r, kAnswerTag, comm_, &recv);
    }
  }
  const auto until = Clock::now() + kAnswerWait;
  std::vector<bool> answered(std::size_t(world_), false);
  answered[std::size_t(rank_)] = true;
  int pending = world_ - 1;
  while (pending > 0 && Clock::now() < until) {
    if (!answer_questions()) return {};  // other stuck ranks ask this one meanwhile
    std::lock_guard calls(calls_mutex());
    for (int r = 0, i = 0; r < world_; ++r) {
      if (r == rank_) continue;
      MPI_Request& recv = requests[std::size_t(2 * i + 1)];
      ++i;
      int done = 0;
      if (answered[std::size_t(r)] || MPI_Test(&recv, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS ||
          !done)
        continue;
      answered[std::size_t(r)] = true;
      --pending;
    }
    if (pending > 0) std::this_thread::sleep_for(Milliseconds(1));
  }
  std::vector<int> missing;
  for (int r = 0; r < world_; ++r) {
    if (r == rank_) continue;
    const Answer& a = answers[std::size_t(r)];
    std::string state;
    if (!answered[std::size_t(r)])
      state = "did not answer within " + std::to_string(kAnswerWait.count()) + " ms";
    else if (a.inside && a.entered == index)
      continue;  // blocked in it too
    else if (a.inside)
      state = "is in collective " + std::to_string(a.entered) + " on this communicator";
    else
      state = "is outside any collective, after " + std::to_string(a.entered) + " of them";
    missing.push_back(r);
    why += (why.empty() ? "" : "; ") + std::string("rank ") + std::to_string(r) + " " + state;
  }
  return missing;
}

void Watchdog::fire(std::uint64_t index, const OperationLabel& label, const char* mpi_call) {
  std::string why;
  std::string missing_text;
  const std::vector<int> missing = ranks_not_in(index, why);
  if (!missing.empty()) missing_text = "; ranks not heard from: " + format_ranks(missing);
  std::fflush(nullptr);
  std::fprintf(stderr,
               "TimeoutError: %s timed out after %lld ms%s (in %s, collective %llu on this "
               "communicator%s%s). An MPI collective cannot be abandoned once entered: this "
               "process ends with exit code %d.\n",
               label.text().c_str(), static_cast<long long>(timeout_.count()), missing_text.c_str(),
               mpi_call, static_cast<unsigned long long>(index), why.empty() ? "" : ": ",
               why.c_str(), kExitCode);
  std::fflush(stderr);
  // Peers stuck in the same collective ask too, a tick or so later: answer them first.
  const auto until = Clock::now() + kAnswerWait;
  while (Clock::now() < until && answer_questions()) std::this_thread::sleep_for(Milliseconds(5));
  std::_Exit(kExitCode);
}

}  // namespace accel::mpi_detail
