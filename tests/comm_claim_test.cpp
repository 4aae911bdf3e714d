// The waiter's claim (communicator.hpp): an operation too big to run inline, queued while the
// worker is idle, runs on the thread that waits for it when that wait comes within the claim
// window, and on the worker otherwise. A test double records which thread ran each operation.

#include <doctest/doctest.h>

#include <cstdlib>
#include <mutex>
#include <thread>
#include <vector>

#include "tests/support/communicator_double.hpp"

using namespace accel;
using namespace std::chrono_literals;

namespace {

constexpr Milliseconds kTimeout = 5000ms;

// A claim window of 1 s, set before main() and so before the first communicator reads it: no
// scheduling delay between issuing and waiting can end the window in these tests.
const bool kLongWindow = setenv("ACCEL_COMM_CLAIM_US", "1000000", 1) == 0;

// Inline up to 64 bytes, so the 4 KiB operations below are queued.
class RecordsThread final : public test::CommunicatorDouble {
 public:
  RecordsThread() : CommunicatorDouble(0, 2, kTimeout) {
    REQUIRE(kLongWindow);
    set_inline_max_bytes(64);
  }
  ~RecordsThread() override { stop_worker(); }

  std::vector<std::thread::id> ran_on() const {
    std::lock_guard lock(mutex_);
    return ran_on_;
  }

 protected:
  void run_all_reduce(Buffer, ReduceOp, Milliseconds) override { record(); }
  void run_broadcast(Buffer, int, Milliseconds) override { record(); }

 private:
  void record() {
    std::lock_guard lock(mutex_);
    ran_on_.push_back(std::this_thread::get_id());
  }
  mutable std::mutex mutex_;
  std::vector<std::thread::id> ran_on_;
};

}  // namespace

TEST_CASE("an operation waited for at once runs on the waiting thread") {
  RecordsThread comm;
  std::vector<float> data(1024);
  for (int i = 0; i < 3; ++i) comm.all_reduce(buffer_of(std::span(data)), ReduceOp::sum)->wait();
  CHECK(comm.ran_on() == std::vector<std::thread::id>(3, std::this_thread::get_id()));
}

TEST_CASE("an operation nobody waits for runs on the worker once the window has passed") {
  RecordsThread comm;
  std::vector<float> data(1024);
  auto work = comm.all_reduce(buffer_of(std::span(data)), ReduceOp::sum);
  CHECK_FALSE(work->is_completed());  // held for its waiter, a whole second
  while (!work->is_completed()) std::this_thread::sleep_for(10ms);
  const auto ran_on = comm.ran_on();
  REQUIRE(ran_on.size() == 1);
  CHECK(ran_on[0] != std::this_thread::get_id());
  work->wait();  // finished: nothing left to claim
  CHECK(comm.ran_on().size() == 1);
}

TEST_CASE("a second operation queued behind the first starts both on the worker") {
  RecordsThread comm;
  std::vector<float> a(1024), b(1024);
  auto first = comm.all_reduce(buffer_of(std::span(a)), ReduceOp::sum);
  auto second = comm.broadcast(buffer_of(std::span(b)), 0);
  first->wait();
  second->wait();
  const auto ran_on = comm.ran_on();
  REQUIRE(ran_on.size() == 2);
  CHECK(ran_on[0] != std::this_thread::get_id());
  CHECK(ran_on[1] != std::this_thread::get_id());
}

TEST_CASE("a wait shorter than the communicator's timeout leaves the operation to the worker") {
  RecordsThread comm;
  std::vector<float> data(1024);
  comm.all_reduce(buffer_of(std::span(data)), ReduceOp::sum)->wait(kTimeout - 1ms);
  const auto ran_on = comm.ran_on();
  REQUIRE(ran_on.size() == 1);
  CHECK(ran_on[0] != std::this_thread::get_id());
}
