#pragma once
// Memory for the strategies' own buffers (DDP buckets, ZeRO's flat buffers, offloaded
// optimizer slices) wherever the parameters live, and the copies between them.
//
//   host         plain CPU memory, allocated and touched once (zeros): fresh pages cost more
//                than a collective over them
//   pinned_host  page-locked CPU memory (cudaHostAlloc), so copies to and from the GPU run
//                asynchronously on a stream (ZeRO's optimizer offload)
//   cuda         device memory (cudaMalloc) on a given CUDA device
//
// The CUDA kinds exist in builds with the CUDA runtime (ACCEL_WITH_NCCL or ACCEL_WITH_CUDA);
// elsewhere asking for them throws InvalidArgument saying so. No CUDA header is included here:
// streams are opaque (DeviceStream, device_stream.hpp). This is the one place device memory is
// allocated, copied and waited for: the strategies' buffers, the built-in optimizers' state
// (StateArray), the staging of host values (host_collectives) and checkpoints all use it.

#include <cstddef>
#include <memory>
#include <string>

#include "foundation/device_stream.hpp"
#include "foundation/dtype.hpp"
#include "foundation/store/store.hpp"
#include "foundation/timeout.hpp"

namespace accel {

enum class MemoryKind { host, pinned_host, cuda };

std::string_view memory_kind_name(MemoryKind kind);  // "host", "pinned host", "cuda"

// Whether this library was built with the CUDA runtime (the cuda and pinned_host kinds).
bool cuda_runtime_built();

// The calling thread's current CUDA device (cudaGetDevice), or -1 without the CUDA runtime.
int current_cuda_device();

// The CUDA device holding `pointer` (cudaPointerGetAttributes), or -1 for host memory (and
// always -1 without the CUDA runtime). For checks that name a buffer on the wrong GPU.
int cuda_device_of(const void* pointer);

// Makes `device` the calling thread's current CUDA device until the guard ends, then restores
// the previous one. -1 leaves the device as it is (so CPU code passes -1 and needs no CUDA);
// a device index in a build without the CUDA runtime throws InvalidArgument.
class CudaDeviceGuard {
 public:
  explicit CudaDeviceGuard(int device);
  ~CudaDeviceGuard();
  CudaDeviceGuard(const CudaDeviceGuard&) = delete;
  CudaDeviceGuard& operator=(const CudaDeviceGuard&) = delete;

 private:
  int previous_ = -1;  // -1: nothing to restore
};

// Where a call's GPU work goes: the stream the loop computes on, its device and how long a
// call that hands a value back to the host may wait for that stream. Everything that queues
// GPU work for the loop (the strategies' copies, the optimizer kernels, clipping, unscaling,
// checkpoint copies) takes the communicator's: compute_context(comm), communicator.hpp. The default
// is the legacy default stream on the current device.
struct DeviceContext {
  DeviceStream stream = nullptr;  // nullptr: the legacy default stream
  int cuda_device = -1;           // -1: the calling thread's current device
  Milliseconds timeout = kDefaultCommTimeout;
};

// An owned, zero-filled buffer of `count` elements of `dtype`. Move-only.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  // cuda_device: the device for MemoryKind::cuda (ignored otherwise). Throws InvalidArgument
  // for a CUDA kind in a build without the CUDA runtime, CommError when CUDA refuses (no
  // device, out of memory), naming the kind, the size and the device.
  DeviceBuffer(std::size_t count, DType dtype, MemoryKind kind, int cuda_device = -1);
  // Host memory something else made (a shared-memory mapping): `view` stays valid while
  // `owner` lives, and this buffer keeps it alive.
  DeviceBuffer(Buffer view, std::shared_ptr<void> owner);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  // The whole buffer as a view (device: cuda for MemoryKind::cuda, else cpu).
  Buffer view() const { return view_; }
  MemoryKind kind() const { return kind_; }
  int cuda_device() const { return device_; }

 private:
  void release() noexcept;
  Buffer view_;
  MemoryKind kind_ = MemoryKind::host;
  int device_ = -1;
  std::shared_ptr<void> owner_;  // set: the memory is owner_'s, not ours to free
};

// Copies src into dst (same dtype and count; the views may be on any device). Between host
// buffers: memcpy, done on return. When either is on a GPU: cudaMemcpyAsync on `stream`
// (ordered with the work queued there; a pageable host source or destination makes CUDA
// stage it synchronously). An empty copy does nothing.
void copy_buffer(Buffer dst, Buffer src, DeviceStream stream);
// Zeros dst: memset, or cudaMemsetAsync on `stream` for device memory.
void zero_buffer(Buffer dst, DeviceStream stream);
// Blocks the host until everything queued on `stream` of CUDA device `cuda_device` so far
// has finished, polling up to `timeout`; TimeoutError says `who` was waiting and for what.
// Nothing to wait for without the CUDA runtime.
void synchronize_stream(DeviceStream stream, int cuda_device, Milliseconds timeout,
                        const std::string& who);
inline void synchronize_stream(const DeviceContext& ctx, const std::string& who) {
  synchronize_stream(ctx.stream, ctx.cuda_device, ctx.timeout, who);
}
// Makes `waiter`'s stream wait, on the GPU (no host wait), for everything queued on
// `signaller`'s stream so far: an event recorded there, cudaStreamWaitEvent here. The two may
// be on different devices (DataParallel's replicas). Does nothing when they are the same
// stream on the same device, or without the CUDA runtime (no device work to order).
void stream_wait(const DeviceContext& waiter, const DeviceContext& signaller);

}  // namespace accel
