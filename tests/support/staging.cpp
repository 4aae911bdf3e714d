#include "tests/support/staging.hpp"

#if ACCEL_TEST_HAVE_CUDA
#include <cuda_runtime.h>
#endif

#include "foundation/error.hpp"

namespace accel::test {

#if ACCEL_TEST_HAVE_CUDA
namespace {
void check(cudaError_t rc, const char* what) {
  if (rc != cudaSuccess) throw Error(std::string(what) + ": " + cudaGetErrorString(rc));
}
}  // namespace

int cuda_device_count() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}

Staged::Staged(const Communicator& comm, OwnedBuffer& host)
    : host_(host), device_view_(host.view), on_device_(comm.device() == DeviceKind::cuda) {
  if (!on_device_) return;
  void* ptr = nullptr;
  check(cudaMalloc(&ptr, std::max<std::size_t>(host.view.bytes(), 1)), "cudaMalloc");
  device_view_.data = ptr;
  device_view_.device = DeviceKind::cuda;
}

Staged::~Staged() {
  if (on_device_) cudaFree(device_view_.data);
}

void Staged::upload() {
  if (on_device_)
    check(
        cudaMemcpy(device_view_.data, host_.view.data, host_.view.bytes(), cudaMemcpyHostToDevice),
        "cudaMemcpy to device");
}

void Staged::download() {
  if (on_device_)
    check(
        cudaMemcpy(host_.view.data, device_view_.data, host_.view.bytes(), cudaMemcpyDeviceToHost),
        "cudaMemcpy to host");
}
#else
int cuda_device_count() { return 0; }

Staged::Staged(const Communicator& comm, OwnedBuffer& host) : host_(host), device_view_(host.view) {
  if (comm.device() == DeviceKind::cuda)
    throw Error("this test build has no CUDA support but the communicator wants CUDA buffers");
}
Staged::~Staged() = default;
void Staged::upload() {}
void Staged::download() {}
#endif

}  // namespace accel::test
