#include "backends/comm/shm/wait.hpp"

#include <linux/futex.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <climits>
#include <ctime>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

#include "foundation/error.hpp"

namespace accel::shm {
namespace {

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// Not FUTEX_PRIVATE: the word lives in memory shared between processes.
void futex_wait(std::atomic<std::uint32_t>* word, std::uint32_t expected,
                std::chrono::nanoseconds timeout) {
  timespec ts{};
  ts.tv_sec = time_t(timeout.count() / 1000000000);
  ts.tv_nsec = long(timeout.count() % 1000000000);
  syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(word), FUTEX_WAIT, expected, &ts, nullptr, 0);
}

void futex_wake_all(std::atomic<std::uint32_t>* word) {
  syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(word), FUTEX_WAKE, INT_MAX, nullptr, nullptr,
          0);
}

}  // namespace

void post(Header& header) {
  // seq_cst throughout: a waiter registers in `sleepers` before its last look at the counters,
  // so either it sees the new value or this sees it registered (and wake_word has moved, so its
  // FUTEX_WAIT returns at once).
  header.wake_word.fetch_add(1);
  if (header.sleepers.load() != 0) futex_wake_all(&header.wake_word);
}

void wait_until(Header& header, const std::function<bool()>& ready, Clock::time_point deadline,
                const WaitPolicy& policy, const std::function<std::string()>& dead_peer,
                const std::function<std::string()>& what) {
  if (ready()) return;
  const auto spin_end = Clock::now() + policy.spin;
  for (unsigned i = 1;; ++i) {
    cpu_relax();
    if (ready()) return;
    if ((i & 63) == 0) {
      if (Clock::now() >= spin_end) break;
      if (policy.yield) sched_yield();
    }
  }
  auto next_check = Clock::now();
  for (;;) {
    header.sleepers.fetch_add(1);
    const std::uint32_t seen = header.wake_word.load();
    if (ready()) {
      header.sleepers.fetch_sub(1);
      return;
    }
    const auto now = Clock::now();
    if (now >= deadline) {
      header.sleepers.fetch_sub(1);
      if (ready()) return;  // completed after the look above
      throw TimeoutError("shm: " + what());
    }
    if (now >= next_check) {
      const std::string dead = dead_peer();
      if (!dead.empty()) {
        header.sleepers.fetch_sub(1);
        // A peer may complete the operation and exit between the look above and this check
        // (the last barrier before exit): what it finished counts.
        if (ready()) return;
        throw CommError("shm: " + dead + " while this rank waited: " + what());
      }
      next_check = now + policy.check_interval;
    }
    const auto slice = std::min<Clock::duration>(deadline - now, policy.check_interval);
    futex_wait(&header.wake_word, seen, slice);
    header.sleepers.fetch_sub(1);
    if (ready()) return;
  }
}

}  // namespace accel::shm
