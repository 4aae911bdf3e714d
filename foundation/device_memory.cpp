#include "foundation/device_memory.hpp"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <thread>
#include <utility>

#include "foundation/error.hpp"

#if ACCEL_HAVE_CUDA_RUNTIME
#include "foundation/cuda_check.hpp"
#endif

namespace accel {
namespace {

std::string describe(std::size_t bytes, MemoryKind kind, int device) {
  std::string out =
      std::to_string(bytes) + " bytes of " + std::string(memory_kind_name(kind)) + " memory";
  if (kind == MemoryKind::cuda) out += " on CUDA device " + std::to_string(device);
  return out;
}

void check_same_shape(const Buffer& dst, const Buffer& src, const char* what) {
  ACCEL_CHECK_ARG(dst.dtype == src.dtype && dst.count == src.count,
                  std::string(what) + ": the destination holds " + std::to_string(dst.count) +
                      " x " + std::string(dtype_name(dst.dtype)) + ", the source " +
                      std::to_string(src.count) + " x " + std::string(dtype_name(src.dtype)));
}

#if ACCEL_HAVE_CUDA_RUNTIME
cudaStream_t as_cuda(DeviceStream stream) { return static_cast<cudaStream_t>(stream); }
#else
[[noreturn]] void no_cuda(const std::string& what) {
  throw InvalidArgument(what +
                        ": this build of accelerate-cpp has no CUDA runtime (configure with "
                        "ACCEL_WITH_NCCL=ON or ACCEL_WITH_CUDA=ON where the CUDA toolkit is "
                        "installed)");
}
#endif

}  // namespace

std::string_view memory_kind_name(MemoryKind kind) {
  switch (kind) {
    case MemoryKind::host:
      return "host";
    case MemoryKind::pinned_host:
      return "pinned host";
    case MemoryKind::cuda:
      return "cuda";
  }
  return "?";
}

bool cuda_runtime_built() { return ACCEL_HAVE_CUDA_RUNTIME != 0; }

int current_cuda_device() {
#if ACCEL_HAVE_CUDA_RUNTIME
  int device = -1;
  ACCEL_CUDA_CHECK(cudaGetDevice(&device));
  return device;
#else
  return -1;
#endif
}

int cuda_device_of(const void* pointer) {
#if ACCEL_HAVE_CUDA_RUNTIME
  cudaPointerAttributes attributes{};
  if (pointer == nullptr || cudaPointerGetAttributes(&attributes, pointer) != cudaSuccess) {
    cudaGetLastError();  // not a pointer CUDA knows: host memory
    return -1;
  }
  return attributes.type == cudaMemoryTypeDevice || attributes.type == cudaMemoryTypeManaged
             ? attributes.device
             : -1;
#else
  (void)pointer;
  return -1;
#endif
}

CudaDeviceGuard::CudaDeviceGuard(int device) {
  if (device < 0) return;
#if ACCEL_HAVE_CUDA_RUNTIME
  int previous = -1;
  ACCEL_CUDA_CHECK(cudaGetDevice(&previous));
  if (previous == device) return;
  ACCEL_CUDA_CHECK(cudaSetDevice(device));
  previous_ = previous;
#else
  no_cuda("switching to CUDA device " + std::to_string(device));
#endif
}

CudaDeviceGuard::~CudaDeviceGuard() {
#if ACCEL_HAVE_CUDA_RUNTIME
  if (previous_ >= 0) cudaSetDevice(previous_);
#endif
}

DeviceBuffer::DeviceBuffer(std::size_t count, DType dtype, MemoryKind kind, int cuda_device)
    : kind_(kind), device_(kind == MemoryKind::cuda ? cuda_device : -1) {
  // One extra 8-byte word: never a zero-byte allocation, and every dtype stays aligned.
  const std::size_t bytes = (count * element_size(dtype) + 7) / 8 * 8 + 8;
  void* data = nullptr;
  if (kind == MemoryKind::host) {
    data = new std::uint64_t[bytes / 8]();  // value-initialised: allocated and touched here
  } else {
#if ACCEL_HAVE_CUDA_RUNTIME
    try {
      if (kind == MemoryKind::cuda) {
        ACCEL_CHECK_ARG(cuda_device >= 0,
                        "a CUDA buffer needs a device index, got " + std::to_string(cuda_device));
        CudaDeviceGuard guard(cuda_device);
        ACCEL_CUDA_CHECK(cudaMalloc(&data, bytes));
        const cudaError_t rc = cudaMemset(data, 0, bytes);
        if (rc != cudaSuccess) {
          cudaFree(data);
          detail::throw_cuda_error(rc, "cudaMemset", __FILE__, __LINE__);
        }
      } else {
        ACCEL_CUDA_CHECK(cudaHostAlloc(&data, bytes, cudaHostAllocDefault));
        std::memset(data, 0, bytes);
      }
    } catch (const CommError& e) {
      throw CommError("allocating " + describe(bytes, kind, cuda_device) + ": " + e.what());
    }
#else
    no_cuda("allocating " + describe(bytes, kind, cuda_device));
#endif
  }
  view_ = Buffer{data, count, dtype, kind == MemoryKind::cuda ? DeviceKind::cuda : DeviceKind::cpu};
}

DeviceBuffer::DeviceBuffer(Buffer view, std::shared_ptr<void> owner)
    : view_(view), owner_(std::move(owner)) {
  ACCEL_CHECK_ARG(view_.device == DeviceKind::cpu && owner_ != nullptr,
                  "a DeviceBuffer over memory made elsewhere needs host memory and its owner");
}

DeviceBuffer::~DeviceBuffer() { release(); }

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : view_(std::exchange(other.view_, Buffer{})),
      kind_(other.kind_),
      device_(other.device_),
      owner_(std::move(other.owner_)) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    release();
    view_ = std::exchange(other.view_, Buffer{});
    kind_ = other.kind_;
    device_ = other.device_;
    owner_ = std::move(other.owner_);
  }
  return *this;
}

void DeviceBuffer::release() noexcept {
  if (owner_) {
    owner_.reset();
  } else if (!view_.data) {
    return;
  } else if (kind_ == MemoryKind::host) {
    delete[] static_cast<std::uint64_t*>(view_.data);
  } else {
#if ACCEL_HAVE_CUDA_RUNTIME
    if (kind_ == MemoryKind::cuda) {
      // cudaFree waits for the device work using it; the device must be the current one.
      int previous = -1;
      cudaGetDevice(&previous);
      if (previous != device_) cudaSetDevice(device_);
      cudaFree(view_.data);
      if (previous >= 0 && previous != device_) cudaSetDevice(previous);
    } else {
      cudaFreeHost(view_.data);
    }
#endif
  }
  view_ = Buffer{};
}

void copy_buffer(Buffer dst, Buffer src, DeviceStream stream) {
  check_same_shape(dst, src, "copy_buffer");
  if (dst.count == 0 || dst.data == src.data) return;
  if (dst.device == DeviceKind::cpu && src.device == DeviceKind::cpu) {
    std::memcpy(dst.data, src.data, dst.bytes());
    return;
  }
#if ACCEL_HAVE_CUDA_RUNTIME
  // Unified addressing: CUDA tells host from device pointers itself.
  ACCEL_CUDA_CHECK(
      cudaMemcpyAsync(dst.data, src.data, dst.bytes(), cudaMemcpyDefault, as_cuda(stream)));
#else
  (void)stream;
  no_cuda("copy_buffer between CPU and CUDA memory");
#endif
}

void zero_buffer(Buffer dst, DeviceStream stream) {
  if (dst.count == 0) return;
  if (dst.device == DeviceKind::cpu) {
    std::memset(dst.data, 0, dst.bytes());
    return;
  }
#if ACCEL_HAVE_CUDA_RUNTIME
  ACCEL_CUDA_CHECK(cudaMemsetAsync(dst.data, 0, dst.bytes(), as_cuda(stream)));
#else
  (void)stream;
  no_cuda("zero_buffer on CUDA memory");
#endif
}

void synchronize_stream(DeviceStream stream, int cuda_device, Milliseconds timeout,
                        const std::string& who) {
#if ACCEL_HAVE_CUDA_RUNTIME
  using Clock = std::chrono::steady_clock;
  CudaDeviceGuard guard(cuda_device);
  cudaEvent_t event = nullptr;
  ACCEL_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
  struct Destroy {
    cudaEvent_t e;
    ~Destroy() { cudaEventDestroy(e); }
  } destroy{event};
  ACCEL_CUDA_CHECK(cudaEventRecord(event, as_cuda(stream)));
  // Spin briefly, then sleep with growing pauses: the host has nothing else to do here, but
  // other threads (the communicator's worker) need the core.
  const auto start = Clock::now();
  const auto deadline = start + timeout;
  auto pause = std::chrono::microseconds(20);
  for (;;) {
    const cudaError_t rc = cudaEventQuery(event);
    if (rc == cudaSuccess) return;
    if (rc != cudaErrorNotReady) detail::throw_cuda_error(rc, "cudaEventQuery", __FILE__, __LINE__);
    const auto now = Clock::now();
    if (now >= deadline)
      throw TimeoutError(who + ": the CUDA stream's work did not finish within " +
                         std::to_string(timeout.count()) + " ms");
    if (now - start > std::chrono::microseconds(100)) {
      std::this_thread::sleep_for(pause);
      pause = std::min(pause * 2, std::chrono::microseconds(500));
    }
  }
#else
  (void)stream, (void)cuda_device, (void)timeout, (void)who;
#endif
}

void stream_wait(const DeviceContext& waiter, const DeviceContext& signaller) {
#if ACCEL_HAVE_CUDA_RUNTIME
  if (waiter.stream == signaller.stream && waiter.cuda_device == signaller.cuda_device) return;
  cudaEvent_t event = nullptr;
  {
    CudaDeviceGuard guard(signaller.cuda_device);  // an event belongs to its stream's device
    ACCEL_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
    const cudaError_t rc = cudaEventRecord(event, as_cuda(signaller.stream));
    if (rc != cudaSuccess) {
      cudaEventDestroy(event);
      detail::throw_cuda_error(rc, "cudaEventRecord", __FILE__, __LINE__);
    }
  }
  // Destroying it while the wait is pending is allowed: CUDA releases it once the wait is done.
  struct Destroy {
    cudaEvent_t e;
    ~Destroy() { cudaEventDestroy(e); }
  } destroy{event};
  CudaDeviceGuard guard(waiter.cuda_device);
  ACCEL_CUDA_CHECK(cudaStreamWaitEvent(as_cuda(waiter.stream), event, 0));
#else
  (void)waiter, (void)signaller;
#endif
}

}  // namespace accel
