// Nothing waits forever: a rank that never joins, and a rank that never enters a collective,
// make the others fail with a TimeoutError that names them, the operation and its sequence
// number. Ranks are threads here, joined through an in-memory store.

#include <doctest/doctest.h>
#include <sched.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <future>
#include <thread>
#include <vector>

#include "backends/comm/registry.hpp"
#include "foundation/error.hpp"
#include "foundation/store/memory_store.hpp"
#include "tests/support/communicator_double.hpp"
#include "tests/support/skip.hpp"

using namespace accel;
using namespace std::chrono_literals;

namespace {

CommOptions options_for(int rank, int world, StorePtr store, Milliseconds timeout) {
  CommOptions o;
  o.rank = rank;
  o.world_size = world;
  o.store = std::move(store);
  o.timeout = timeout;
  return o;
}

// The ids of this process's threads named `name` (/proc/self/task/<id>/comm).
std::vector<int> threads_named(const std::string& name) {
  std::vector<int> ids;
  for (const auto& task : std::filesystem::directory_iterator("/proc/self/task")) {
    std::ifstream comm(task.path() / "comm");
    std::string line;
    std::getline(comm, line);
    if (line == name) ids.push_back(std::stoi(task.path().filename().string()));
  }
  return ids;
}

// A host communicator whose peer (rank 1) stops answering at the second operation: #1 takes
// 200 ms, #2 waits out the timeout and fails as a backend does, naming rank 1.
class PeerStopsAnswering final : public test::CommunicatorDouble {
 public:
  explicit PeerStopsAnswering(Milliseconds timeout) : CommunicatorDouble(0, 2, timeout) {}
  ~PeerStopsAnswering() override { stop_worker(); }

 protected:
  void run_barrier(Milliseconds) override { std::this_thread::sleep_for(200ms); }
  void run_all_reduce(Buffer, ReduceOp, Milliseconds timeout) override {
    std::this_thread::sleep_for(timeout);
    throw TimeoutError("peer silent");
  }
  std::vector<int> ranks_not_heard_from(std::uint64_t) override { return {1}; }
};

}  // namespace

TEST_CASE("a wait with the communicator's timeout reports the backend's verdict naming the peer") {
  // DDP waits for its last bucket with the communicator's timeout right after issuing it: the
  // operation starts a moment later, so the caller's timeout ends first. Its error must still
  // be the backend's, which names the rank not heard from, not a bare "not launched".
  PeerStopsAnswering comm(500ms);
  float x = 1;
  comm.barrier();
  WorkPtr stuck = comm.all_reduce(buffer_of(std::span(&x, 1)), ReduceOp::sum);
  std::string message;
  try {
    stuck->wait_stream(nullptr, comm.timeout());
  } catch (const TimeoutError& e) {
    message = e.what();
  }
  INFO(message);
  CHECK(message.find("rank 0: all_reduce(sum, 1 x f32) #2 timed out after 500 ms") !=
        std::string::npos);
  CHECK(message.find("ranks not heard from: [1]") != std::string::npos);
  // Operations behind it fail at once and repeat who was not heard from.
  CHECK_THROWS_WITH_AS(comm.barrier()->wait(1s), doctest::Contains("ranks not heard from: [1]"),
                       CommError);
  // A wait shorter than the communicator's timeout still ends when it said.
  PeerStopsAnswering slow(5000ms);
  WorkPtr pending = slow.all_reduce(buffer_of(std::span(&x, 1)), ReduceOp::sum);
  CHECK_THROWS_WITH_AS(pending->wait(100ms), doctest::Contains("did not complete within 100 ms"),
                       TimeoutError);
}

// Both contracts hold for Gloo and for shared memory.
std::vector<std::string> joinable_backends() {
  std::vector<std::string> out;
  for (const char* b : {"gloo", "shm"})
    if (communicator_available(b)) out.emplace_back(b);
  return out;
}

TEST_CASE("a rank that never joins gives a timeout naming it") {
  if (test::skip_unless(!joinable_backends().empty(), "neither gloo nor shm built")) return;
  for (const std::string& backend : joinable_backends()) {
    CAPTURE(backend);
    auto store = std::make_shared<MemoryStore>();
    // Ranks 0 and 2 of 3 come; rank 1 never does.
    auto join = [&](int rank) {
      return std::async(std::launch::async, [&, rank] {
        try {
          create_communicator(backend, options_for(rank, 3, store, 1500ms));
          return std::string("joined");
        } catch (const TimeoutError& e) {
          return std::string(e.what());
        }
      });
    };
    auto r0 = join(0), r2 = join(2);
    const std::string m0 = r0.get(), m2 = r2.get();
    INFO(m0);
    INFO(m2);
    CHECK(m0.find("rank 0") != std::string::npos);
    CHECK(m0.find("ranks [1] of 3") != std::string::npos);
    CHECK(m0.find("to join") != std::string::npos);
    CHECK(m2.find("ranks [1] of 3") != std::string::npos);
  }
}

TEST_CASE("a collective one rank never enters times out naming the op, its number and the rank") {
  if (test::skip_unless(!joinable_backends().empty(), "neither gloo nor shm built")) return;
  for (const std::string& backend : joinable_backends()) {
    CAPTURE(backend);
    auto store = std::make_shared<MemoryStore>();
    std::promise<void> rank0_done;
    auto rank1 = std::async(std::launch::async, [&] {
      auto comm = create_communicator(backend, options_for(1, 2, store, 1000ms));
      std::vector<float> v(16, 1.0f);
      comm->all_reduce(buffer_of(std::span(v)), ReduceOp::sum)->wait();  // #1 together
      // ... then stays busy elsewhere and never enters #2, but stays alive.
      rank0_done.get_future().wait();
    });
    auto comm = create_communicator(backend, options_for(0, 2, store, 1000ms));
    std::vector<float> v(16, 1.0f);
    comm->all_reduce(buffer_of(std::span(v)), ReduceOp::sum)->wait();
    CHECK(v[0] == 2.0f);
    std::string message;
    try {
      comm->all_reduce(buffer_of(std::span(v)), ReduceOp::sum)->wait();
    } catch (const TimeoutError& e) {
      message = e.what();
    }
    rank0_done.set_value();
    rank1.get();
    INFO(message);
    CHECK(message.find("rank 0: all_reduce(sum, 16 x f32) #2 timed out") != std::string::npos);
    CHECK(message.find("ranks not heard from: [1]") != std::string::npos);

    // The communicator refuses later collectives instead of pairing them with the wrong ones.
    std::string after;
    try {
      comm->barrier()->wait();
    } catch (const CommError& e) {
      after = e.what();
    }
    CHECK(after.find("unusable since rank 0: all_reduce") != std::string::npos);
  }
}

// An operation above the inline limit (GlooCommunicator::kInlineBytes, 256 KiB) runs on the
// worker thread, so the call returns at once and the caller's own short wait ends first; a
// smaller one would run inline and return only when the peer arrived (communicator.hpp).
TEST_CASE("Work::wait with a short timeout names the operation") {
  if (test::skip_unless(communicator_available("gloo"), "gloo communicator not built")) return;
  auto store = std::make_shared<MemoryStore>();
  std::promise<void> release;
  constexpr std::size_t kCount = 1 << 18;  // 1 MiB of floats
  auto rank1 = std::async(std::launch::async, [&] {
    auto comm = create_communicator("gloo", options_for(1, 2, store, 5000ms));
    std::vector<float> data(kCount, 1.0f);
    release.get_future().wait();
    comm->all_reduce(buffer_of(std::span(data)), ReduceOp::sum)->wait();
  });
  auto comm = create_communicator("gloo", options_for(0, 2, store, 5000ms));
  std::vector<float> data(kCount, 1.0f);
  auto work = comm->all_reduce(buffer_of(std::span(data)), ReduceOp::sum);
  std::string message;
  try {
    work->wait(200ms);
  } catch (const TimeoutError& e) {
    message = e.what();
  }
  CHECK(message.find("rank 0: all_reduce(sum, 262144 x f32) #1 did not complete within 200 ms") !=
        std::string::npos);
  release.set_value();
  work->wait();  // completes once rank 1 arrives
  CHECK(data[0] == 2.0f);
  rank1.get();
}

TEST_CASE("the world of one completes every operation through the same interface") {
  auto comm = create_communicator("local", CommOptions{});
  std::vector<float> in = {1, 2, 3}, out(3);
  comm->all_reduce(buffer_of(std::span(in)), ReduceOp::avg)->wait();
  CHECK(in == std::vector<float>{1, 2, 3});
  comm->all_gather(buffer_of(std::span(in)), buffer_of(std::span(out)))->wait();
  CHECK(out == in);
  comm->reduce_scatter(buffer_of(std::span(in)), buffer_of(std::span(out)), ReduceOp::max)->wait();
  CHECK(out == in);
  comm->barrier()->wait();
  CHECK(comm->next_sequence() == 5);
  CHECK_THROWS_AS(comm->send(buffer_of(std::span(in)), 0), InvalidArgument);
}

namespace {
// Runs operations of up to 1 KiB inline; records the order operations ran in, and whether two
// ever ran at once.
class RecordsOrder final : public test::CommunicatorDouble {
 public:
  RecordsOrder() : CommunicatorDouble(0, 2, 10s) { set_inline_max_bytes(1024); }
  ~RecordsOrder() override { stop_worker(); }
  std::vector<std::uint64_t> ran;  // sequence numbers, as they ran
  std::atomic<bool> overlapped{false};
  // While `hold` is set, an operation of one element signals `held` and waits for `release`.
  std::atomic<bool> hold{false}, held{false}, release{false};

 protected:
  void run_all_reduce(Buffer data, ReduceOp, Milliseconds) override {
    if (running_.exchange(true)) overlapped = true;
    ran.push_back(current_sequence());
    if (data.count == 1 && hold) {
      held = true;
      while (!release) std::this_thread::yield();
    }
    if (data.count > 256) std::this_thread::yield();  // a queued one: let issuers race it
    running_ = false;
  }

 private:
  std::atomic<bool> running_{false};
};
}  // namespace

// The inline path ends without the lock: an operation another thread queued meanwhile must
// still be run (a missed wake-up would leave its wait to time out).
TEST_CASE("inline and queued operations from several threads run one at a time, in issue order") {
  RecordsOrder comm;
  {
    // One operation queued while an inline one runs, and nothing issued after it.
    std::vector<float> one(1), large(1024);
    comm.hold = true;
    std::thread inline_caller(
        [&] { comm.all_reduce(buffer_of(std::span(one)), ReduceOp::sum)->wait(); });
    while (!comm.held) std::this_thread::yield();
    WorkPtr queued = comm.all_reduce(buffer_of(std::span(large)), ReduceOp::sum);
    comm.release = true;
    inline_caller.join();
    CHECK_NOTHROW(queued->wait(5s));
    comm.hold = false;
  }
  constexpr int kThreads = 4, kOps = 3000;
  std::vector<std::thread> issuers;
  std::atomic<int> failed{0};
  for (int t = 0; t < kThreads; ++t)
    issuers.emplace_back([&, t] {
      std::vector<float> small(4), large(1024);  // 16 B runs inline when it can, 4 KiB queues
      for (int i = 0; i < kOps; ++i) {
        const bool queue = (i + t) % 3 == 0;
        auto work = queue ? comm.all_reduce(buffer_of(std::span(large)), ReduceOp::sum)
                          : comm.all_reduce(buffer_of(std::span(small)), ReduceOp::sum);
        try {
          work->wait(5s);
        } catch (const std::exception&) {
          ++failed;
        }
      }
    });
  for (auto& t : issuers) t.join();
  CHECK(failed == 0);
  CHECK_FALSE(comm.overlapped);
  REQUIRE(comm.ran.size() == std::size_t(kThreads * kOps + 2));
  CHECK(std::is_sorted(comm.ran.begin(), comm.ran.end()));
  CHECK(comm.ran.back() == std::uint64_t(kThreads * kOps + 2));
}

// So top -H, perf sched and gdb tell the communicator's thread from the application's.
TEST_CASE("a communicator's worker thread is named accel-comm") {
  // A worker joined by an earlier test case may leave /proc/self/task a moment after the join.
  std::this_thread::sleep_for(50ms);
  const std::size_t before = threads_named("accel-comm").size();
  auto comm = create_communicator("local", CommOptions{});
  CHECK(threads_named("accel-comm").size() == before + 1);
}

// Gloo's event-loop thread must not preempt a caller that holds a pair's lock: it would spin
// until the next tick (backends/comm/gloo/tcp_device.hpp).
TEST_CASE("gloo's event-loop thread is named accel-gloo-io and runs SCHED_BATCH") {
  if (test::skip_unless(communicator_available("gloo"), "gloo communicator not built")) return;
  // The scheduling policies of the loop threads that making two ranks' communicators started.
  const auto policies_of_new_loop_threads = [] {
    const std::vector<int> before = threads_named("accel-gloo-io");
    auto store = std::make_shared<MemoryStore>();
    auto rank1 = std::async(std::launch::async, [&] {
      return create_communicator("gloo", options_for(1, 2, store, 5000ms));
    });
    auto rank0 = create_communicator("gloo", options_for(0, 2, store, 5000ms));
    auto peer = rank1.get();
    std::vector<int> policies;
    for (int id : threads_named("accel-gloo-io"))
      if (std::find(before.begin(), before.end(), id) == before.end())
        policies.push_back(sched_getscheduler(id));
    return policies;
  };
  unsetenv("ACCEL_GLOO_LOOP_BATCH");  // the default
  CHECK(policies_of_new_loop_threads() == std::vector<int>{SCHED_BATCH, SCHED_BATCH});
  setenv("ACCEL_GLOO_LOOP_BATCH", "0", 1);
  const std::vector<int> policies = policies_of_new_loop_threads();
  unsetenv("ACCEL_GLOO_LOOP_BATCH");
  CHECK(policies == std::vector<int>{SCHED_OTHER, SCHED_OTHER});
}

TEST_CASE("mismatched shapes are rejected at the call, naming what was wrong") {
  auto comm = create_communicator("local", CommOptions{});
  std::vector<float> in(3), out(4);
  CHECK_THROWS_WITH_AS(comm->all_gather(buffer_of(std::span(in)), buffer_of(std::span(out))),
                       doctest::Contains("must contribute 4 of 4 elements, got 3"),
                       InvalidArgument);
  CHECK_THROWS_WITH_AS(create_communicator("nope", CommOptions{}),
                       doctest::Contains("unknown communicator 'nope'"), InvalidArgument);
}

namespace {
// Runs operations of up to 1 KiB inline; an all_reduce of two elements fails.
class FailsOnTwo final : public test::CommunicatorDouble {
 public:
  FailsOnTwo() : CommunicatorDouble(0, 2, 10s) { set_inline_max_bytes(1024); }
  ~FailsOnTwo() override { stop_worker(); }

 protected:
  void run_all_reduce(Buffer data, ReduceOp, Milliseconds) override {
    if (data.count == 2) throw CommError("the double refuses two elements");
  }
};
}  // namespace

TEST_CASE("an operation done before its call returns hands out the shared finished Work") {
  FailsOnTwo comm;
  std::vector<float> small(4), two(2), large(1024);
  const WorkPtr first = comm.all_reduce(buffer_of(std::span(small)), ReduceOp::sum);
  const WorkPtr second = comm.all_reduce(buffer_of(std::span(small)), ReduceOp::sum);
  // Inline and done: the one finished Work, held without a reference count.
  CHECK(first->is_completed());
  CHECK(first.get() == Work::completed().get());
  CHECK(second.get() == first.get());
  CHECK(first.use_count() == 0);
  CHECK_NOTHROW(first->wait(1s));
  CHECK(first->description() == "an operation that completed before its call returned");
  // Queued (4 KiB is above the inline limit): a Work of its own, naming the operation.
  const WorkPtr queued = comm.all_reduce(buffer_of(std::span(large)), ReduceOp::sum);
  CHECK(queued.get() != Work::completed().get());
  CHECK(queued->description() == "rank 0: all_reduce(sum, 1024 x f32) #3");
  queued->wait(5s);
  // Bus bytes of both paths: 2(n-1)/n x bytes at world 2.
  CHECK(comm.bus_bytes() == 16 + 16 + 4096);
  // Failed inline: its own Work, carrying the error.
  const WorkPtr failed = comm.all_reduce(buffer_of(std::span(two)), ReduceOp::sum);
  CHECK(failed.get() != Work::completed().get());
  CHECK(failed->is_completed());
  CHECK_THROWS_WITH_AS(failed->wait(1s),
                       doctest::Contains("rank 0: all_reduce(sum, 2 x f32) #4 failed: the double "
                                         "refuses two elements"),
                       CommError);
  // Later operations fail fast, on either path, and still take their numbers.
  CHECK_THROWS_WITH_AS(comm.all_reduce(buffer_of(std::span(small)), ReduceOp::sum)->wait(1s),
                       doctest::Contains("#5 not started: the communicator is unusable since"),
                       CommError);
  CHECK_THROWS_WITH_AS(comm.all_reduce(buffer_of(std::span(large)), ReduceOp::sum)->wait(5s),
                       doctest::Contains("#6 not started"), CommError);
  CHECK(comm.next_sequence() == 7);
}
