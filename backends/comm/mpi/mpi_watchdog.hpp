#pragma once
// Ends a process whose MPI collective does not complete within the communicator's timeout,
// as PyTorch's NCCL watchdog does. MPI's blocking collectives cannot be abandoned once
// entered, and its nonblocking ones run through Open MPI's slow libnbc engine (bench/README),
// so a collective that waits for a rank that never comes cannot end in an exception: after
// the timeout this thread asks the other ranks' watchdogs where they are, prints one line
// naming the operation and the ranks that have not entered it, and ends the process with
// kExitCode. Before the watchdog, every collective first met the other ranks over
// point-to-point messages to carry the timeout; that meeting was a third of a 4 KiB
// collective's time at world 2 (bench/journal/2026-12-04, "The MPI watchdog").
//
// Asking needs MPI_THREAD_MULTIPLE (the question is sent while another thread is blocked in
// MPI), which MpiCommunicator requires. Internal to the mpi backend: it includes <mpi.h>.

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <list>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "backends/comm/mpi/mpi_check.hpp"  // <mpi.h>
#include "backends/comm/work.hpp"
#include "foundation/timeout.hpp"

namespace accel::mpi_detail {

class Watchdog {
 public:
  // What `timeout` is to `timeout(1)`: the exit code of a process ended by a watchdog.
  static constexpr int kExitCode = 124;

  // `comm` carries the watchdogs' questions and answers only. Call with the process's MPI
  // lock held (it posts a receive); the thread starts at once.
  Watchdog(MPI_Comm comm, int rank, int world, Milliseconds timeout);
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;
  // Stops the thread. Call close() first, with the MPI lock held, unless MPI is finalised.
  ~Watchdog();

  // Stops the thread and cancels the receive for questions. With the MPI lock held.
  void close() noexcept;

  // Brackets one blocking collective (`mpi_call` names it, a string literal) on the thread
  // that runs it, which must be done by `deadline` (the base Communicator's, so no clock read
  // here). `label` must stay put until the collective returns (the communicator's
  // current_label()): the watchdog keeps its address, not a copy. A few stores; nothing else
  // on that path.
  class Watch {
   public:
    Watch(Watchdog& dog, const OperationLabel& label,
          std::chrono::steady_clock::time_point deadline, const char* mpi_call)
        : dog_(dog) {
      dog_.enter(label, deadline, mpi_call);
    }
    ~Watch() { dog_.leave(); }
    Watch(const Watch&) = delete;
    Watch& operator=(const Watch&) = delete;

   private:
    Watchdog& dog_;
  };

  // From the atexit handler, before MPI_Finalize: no watchdog calls MPI after this returns.
  static void quiesce();

 private:
  struct Answer {
    std::uint64_t entered = 0;  // collectives this rank has entered on this communicator
    std::uint64_t inside = 0;   // 1 while it is in the last of them
  };
  struct Reply {
    Answer answer;
    MPI_Request request = MPI_REQUEST_NULL;
  };

  void enter(const OperationLabel& label, std::chrono::steady_clock::time_point deadline,
             const char* mpi_call);
  void leave();
  void loop();
  // Answers the questions that came in; returns false once MPI must no longer be called.
  bool answer_questions();
  // The collective `index` is past its deadline: ask, report and end the process.
  [[noreturn]] void fire(std::uint64_t index, const OperationLabel& label, const char* mpi_call);
  // The ranks not in collective `index` and why, asking each rank's watchdog.
  std::vector<int> ranks_not_in(std::uint64_t index, std::string& why);

  const MPI_Comm comm_;
  const int rank_;
  const int world_;
  const Milliseconds timeout_;

  // Written by the thread running collectives; read by the watchdog thread, which checks
  // entered_ again after copying label_ and call_ (they change only between collectives).
  std::atomic<std::uint64_t> entered_{0};
  std::atomic<bool> inside_{false};
  std::atomic<std::int64_t> deadline_ns_{0};  // steady_clock, of the collective inside
  // The running collective's label where it lives: a copy per collective stalled the caller.
  const OperationLabel* label_ = nullptr;
  const char* call_ = "";

  // The watchdog thread's own.
  MPI_Request question_ = MPI_REQUEST_NULL;
  std::uint64_t question_in_ = 0;
  std::list<Reply> replies_;  // answers being sent (their buffers must stay put)

  std::mutex mutex_;
  std::condition_variable wake_;
  bool stopping_ = false;
  std::thread thread_;
};

// Inline: the path every small collective pays (bench/journal/2026-12-06, "The issuing path's
// instruction cache").
inline void Watchdog::enter(const OperationLabel& label,
                            std::chrono::steady_clock::time_point deadline, const char* mpi_call) {
  label_ = &label;
  call_ = mpi_call;
  deadline_ns_.store(
      std::chrono::duration_cast<std::chrono::nanoseconds>(deadline.time_since_epoch()).count(),
      std::memory_order_relaxed);
  // One writer (operations never run concurrently on a communicator): no locked add.
  entered_.store(entered_.load(std::memory_order_relaxed) + 1, std::memory_order_release);
  inside_.store(true, std::memory_order_release);
}

inline void Watchdog::leave() { inside_.store(false, std::memory_order_release); }

}  // namespace accel::mpi_detail
