/* Preloaded (LD_PRELOAD) under runs that must not touch a GPU: every CUDA runtime and NCCL
 * entry point accel-cpp imports is replaced by one that appends its name to the file named by
 * ACCEL_CUDA_TRIPWIRE_LOG and fails as a machine without a driver would. cpu_only_test checks
 * with nm that this list covers every cuda and nccl symbol the built binaries import. The
 * arguments are ignored: on x86-64 a callee may ignore what the caller passed in registers. */
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void record(const char* name) {
  const char* path = getenv("ACCEL_CUDA_TRIPWIRE_LOG");
  if (path == NULL) return;
  const int fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) return;
  (void)!write(fd, name, strlen(name));
  (void)!write(fd, "\n", 1);
  close(fd);
}

enum { kCudaErrorInsufficientDriver = 35, kNcclUnhandledCudaError = 1 };

#define CUDA_TRIP(name)                  \
  int name(void) {                       \
    record(#name);                       \
    return kCudaErrorInsufficientDriver; \
  }
#define NCCL_TRIP(name)             \
  int name(void) {                  \
    record(#name);                  \
    return kNcclUnhandledCudaError; \
  }

const char* cudaGetErrorString(int error) {
  (void)error;
  record("cudaGetErrorString");
  return "CUDA runtime call on a CPU-only path (accel cuda tripwire)";
}
const char* cudaGetErrorName(int error) {
  (void)error;
  record("cudaGetErrorName");
  return "accelCudaTripwire";
}
const char* ncclGetErrorString(int result) {
  (void)result;
  record("ncclGetErrorString");
  return "NCCL call on a CPU-only path (accel cuda tripwire)";
}
const char* ncclGetLastError(void* comm) {
  (void)comm;
  record("ncclGetLastError");
  return "NCCL call on a CPU-only path (accel cuda tripwire)";
}

/* A kernel launch (<<<...>>>) goes through these. */
CUDA_TRIP(__cudaGetKernel)
CUDA_TRIP(__cudaLaunchKernel)
CUDA_TRIP(__cudaPopCallConfiguration)
CUDA_TRIP(__cudaPushCallConfiguration)
CUDA_TRIP(cudaDriverGetVersion)
CUDA_TRIP(cudaEventCreateWithFlags)
CUDA_TRIP(cudaEventDestroy)
CUDA_TRIP(cudaEventQuery)
CUDA_TRIP(cudaEventRecord)
CUDA_TRIP(cudaFree)
CUDA_TRIP(cudaFreeHost)
CUDA_TRIP(cudaGetDevice)
CUDA_TRIP(cudaGetDeviceCount)
CUDA_TRIP(cudaGetDeviceProperties)
CUDA_TRIP(cudaGetLastError)
CUDA_TRIP(cudaHostAlloc)
CUDA_TRIP(cudaLaunchKernel)
CUDA_TRIP(cudaMalloc)
CUDA_TRIP(cudaMemcpy)
CUDA_TRIP(cudaMemcpyAsync)
CUDA_TRIP(cudaMemset)
CUDA_TRIP(cudaMemsetAsync)
CUDA_TRIP(cudaPeekAtLastError)
CUDA_TRIP(cudaPointerGetAttributes)
CUDA_TRIP(cudaRuntimeGetVersion)
CUDA_TRIP(cudaSetDevice)
CUDA_TRIP(cudaStreamCreateWithFlags)
CUDA_TRIP(cudaStreamDestroy)
CUDA_TRIP(cudaStreamSynchronize)
CUDA_TRIP(cudaStreamWaitEvent)
NCCL_TRIP(ncclAllGather)
NCCL_TRIP(ncclAllReduce)
NCCL_TRIP(ncclBroadcast)
NCCL_TRIP(ncclCommAbort)
NCCL_TRIP(ncclCommDestroy)
NCCL_TRIP(ncclCommFinalize)
NCCL_TRIP(ncclCommGetAsyncError)
NCCL_TRIP(ncclCommInitRankConfig)
NCCL_TRIP(ncclGetUniqueId)
NCCL_TRIP(ncclGetVersion)
NCCL_TRIP(ncclGroupEnd)
NCCL_TRIP(ncclGroupStart)
NCCL_TRIP(ncclRecv)
NCCL_TRIP(ncclReduce)
NCCL_TRIP(ncclReduceScatter)
NCCL_TRIP(ncclSend)
