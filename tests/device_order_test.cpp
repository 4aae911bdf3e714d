// The device side of the Communicator, without a GPU: how a backend that only launches its
// operations (NCCL) is driven. A test double below stands in for the device: its completions
// finish when the test says so. Checked: the issue hook runs on the caller's thread in issue
// order, launches are not held back by earlier operations still running, wait_stream orders
// the stream without waiting for completion, wait() waits for it, and an operation that never
// completes times out naming itself, is abandoned and leaves the communicator unusable.
// Also device_memory's host paths and its errors where CUDA is absent.

#include <doctest/doctest.h>

#include <atomic>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#include "backends/comm/communicator.hpp"
#include "foundation/device_memory.hpp"
#include "foundation/error.hpp"
#include "tests/support/communicator_double.hpp"
#include "tests/support/staging.hpp"

using namespace accel;
using namespace std::chrono_literals;

namespace {

struct FakeDevice {
  std::mutex mutex;
  std::vector<std::thread::id> issued_on;   // on_issue's threads, in order
  std::vector<DeviceStream> issue_streams;  // the compute stream on_issue was given
  std::vector<DeviceStream> ordered;        // streams order_before was asked to order
  std::atomic<int> launched{0};
  std::atomic<int> completed_upto{0};  // operations 1..n have completed on the "device"
  std::atomic<bool> abandoned{false};
};

class FakeCompletion final : public DeviceCompletion {
 public:
  FakeCompletion(FakeDevice& device, int number) : device_(device), number_(number) {}
  bool poll() override { return device_.completed_upto.load() >= number_; }
  void order_before(DeviceStream stream) override {
    std::lock_guard lock(device_.mutex);
    device_.ordered.push_back(stream);
  }
  void abandon() noexcept override { device_.abandoned = true; }

 private:
  FakeDevice& device_;
  int number_;
};

// A world of one whose all_reduce launches and defers its completion, as NCCL does.
class LaunchingCommunicator final : public test::CommunicatorDouble {
 public:
  LaunchingCommunicator(FakeDevice& device, Milliseconds timeout)
      : CommunicatorDouble(0, 1, timeout), device_(device) {}
  ~LaunchingCommunicator() override { stop_worker(); }

 protected:
  std::shared_ptr<void> on_issue(DeviceStream compute_stream) override {
    std::lock_guard lock(device_.mutex);
    device_.issued_on.push_back(std::this_thread::get_id());
    device_.issue_streams.push_back(compute_stream);
    return std::make_shared<int>(int(device_.issued_on.size()));
  }
  void run_all_reduce(Buffer, ReduceOp, Milliseconds) override {
    const int number = *static_cast<const int*>(issued_inputs().get());
    ++device_.launched;
    defer_completion(std::make_shared<FakeCompletion>(device_, number));
  }

 private:
  FakeDevice& device_;
};

template <typename Pred>
bool eventually(Pred pred) {
  for (int i = 0; i < 2000 && !pred(); ++i) std::this_thread::sleep_for(1ms);
  return pred();
}

}  // namespace

TEST_CASE("launched device operations: issue order, no held-back launches, stream ordering") {
  FakeDevice device;
  LaunchingCommunicator comm(device, 30s);
  float x = 1;
  const Buffer b{&x, 1, DType::f32, DeviceKind::cuda};  // never dereferenced by the double
  auto* const stream = reinterpret_cast<DeviceStream>(std::uintptr_t(0x5eed));
  comm.set_compute_stream(stream);
  CHECK(comm.compute_stream() == stream);

  WorkPtr first = comm.all_reduce(b, ReduceOp::avg);
  WorkPtr second = comm.all_reduce(b, ReduceOp::avg);
  // Both issued on this thread, in order.
  REQUIRE(device.issued_on.size() == 2);
  CHECK(device.issued_on[0] == std::this_thread::get_id());
  CHECK(device.issued_on[1] == std::this_thread::get_id());
  CHECK(device.issue_streams == std::vector<DeviceStream>{stream, stream});
  // The second is launched while the first has not completed.
  CHECK(eventually([&] { return device.launched.load() == 2; }));
  CHECK_FALSE(first->is_completed());

  // wait_stream returns at once for a launched operation, having ordered the stream.
  second->wait_stream(stream, 5s);
  {
    std::lock_guard lock(device.mutex);
    REQUIRE(device.ordered.size() == 1);
    CHECK(device.ordered[0] == stream);
  }
  CHECK_FALSE(second->is_completed());
  // wait() waits for the completion itself.
  CHECK_THROWS_AS(first->wait(50ms), TimeoutError);
  device.completed_upto = 2;
  first->wait(5s);
  second->wait(5s);
  CHECK(first->is_completed());
  // Completed: nothing left to order.
  second->wait_stream(stream, 5s);
  std::lock_guard lock(device.mutex);
  CHECK(device.ordered.size() == 1);
}

TEST_CASE("a launched operation that never completes times out, naming it, and is abandoned") {
  FakeDevice device;
  LaunchingCommunicator comm(device, 300ms);
  float x = 1;
  const Buffer b{&x, 1, DType::f32, DeviceKind::cuda};
  WorkPtr stuck = comm.all_reduce(b, ReduceOp::sum);
  WorkPtr behind = comm.all_reduce(b, ReduceOp::sum);
  try {
    stuck->wait(10s);
    FAIL("the stuck operation completed");
  } catch (const TimeoutError& e) {
    const std::string what = e.what();
    INFO(what);
    CHECK(what.find("rank 0: all_reduce(sum, 1 x f32) #1") != std::string::npos);
    CHECK(what.find("timed out after 300 ms") != std::string::npos);
  }
  CHECK(device.abandoned);
  CHECK_THROWS_WITH_AS(behind->wait(10s), doctest::Contains("unusable since"), CommError);
  CHECK_THROWS_WITH_AS(comm.all_reduce(b, ReduceOp::sum)->wait(10s),
                       doctest::Contains("unusable since rank 0: all_reduce(sum, 1 x f32) #1"),
                       CommError);
}

TEST_CASE("a host operation's wait_stream is wait()") {
  FakeDevice device;
  LaunchingCommunicator comm(device, 30s);
  WorkPtr barrier = comm.barrier();  // run_barrier does not defer: a host operation
  barrier->wait_stream(nullptr, 5s);
  CHECK(barrier->is_completed());
  std::lock_guard lock(device.mutex);
  CHECK(device.ordered.empty());
}

TEST_CASE("device memory: host buffers are zeroed, copied and cleared") {
  DeviceBuffer a(5, DType::f64, MemoryKind::host), b(5, DType::f64, MemoryKind::host);
  CHECK(a.view().count == 5);
  CHECK(a.view().device == DeviceKind::cpu);
  auto* pa = static_cast<double*>(a.view().data);
  auto* pb = static_cast<double*>(b.view().data);
  for (int i = 0; i < 5; ++i) CHECK(pa[i] == 0.0);
  for (int i = 0; i < 5; ++i) pa[i] = i + 0.5;
  copy_buffer(b.view(), a.view(), nullptr);
  for (int i = 0; i < 5; ++i) CHECK(pb[i] == i + 0.5);
  zero_buffer(b.view().slice(1, 3), nullptr);
  CHECK(pb[0] == 0.5);
  CHECK(pb[1] == 0.0);
  CHECK(pb[3] == 0.0);
  CHECK(pb[4] == 4.5);
  DeviceBuffer moved = std::move(a);
  CHECK(moved.view().data == pa);
  CHECK(a.view().data == nullptr);
  DeviceBuffer empty(0, DType::f32, MemoryKind::host);
  CHECK(empty.view().data != nullptr);
  CHECK_THROWS_WITH_AS(
      copy_buffer(b.view(), DeviceBuffer(4, DType::f64, MemoryKind::host).view(), nullptr),
      doctest::Contains("the destination holds 5 x f64, the source 4 x f64"), InvalidArgument);
}

TEST_CASE("device memory: a CUDA buffer where CUDA cannot give one is a clear error") {
  if (test::cuda_device_count() > 0) {
    // With a GPU: a round trip host -> device -> host keeps the values.
    DeviceBuffer host(3, DType::i32, MemoryKind::host), dev(3, DType::i32, MemoryKind::cuda, 0),
        back(3, DType::i32, MemoryKind::pinned_host);
    CHECK(dev.view().device == DeviceKind::cuda);
    auto* h = static_cast<std::int32_t*>(host.view().data);
    h[0] = 7, h[1] = -3, h[2] = 11;
    copy_buffer(dev.view(), host.view(), nullptr);
    copy_buffer(back.view(), dev.view(), nullptr);
    synchronize_stream(nullptr, 0, 60s, "device_order_test");
    CHECK(std::memcmp(back.view().data, host.view().data, 12) == 0);
    return;
  }
  if (!cuda_runtime_built()) {
    CHECK_THROWS_WITH_AS(DeviceBuffer(4, DType::f32, MemoryKind::cuda, 0),
                         doctest::Contains("has no CUDA runtime"), InvalidArgument);
    CHECK_THROWS_WITH_AS(DeviceBuffer(4, DType::f32, MemoryKind::pinned_host),
                         doctest::Contains("has no CUDA runtime"), InvalidArgument);
    return;
  }
  // Built with CUDA, no device visible: CUDA's refusal, naming what was asked for.
  CHECK_THROWS_WITH_AS(DeviceBuffer(4, DType::f32, MemoryKind::cuda, 0),
                       doctest::Contains("allocating 24 bytes of cuda memory on CUDA device 0"),
                       CommError);
  CHECK_THROWS_WITH_AS(DeviceBuffer(4, DType::f32, MemoryKind::pinned_host),
                       doctest::Contains("allocating 24 bytes of pinned host memory"), CommError);
}
