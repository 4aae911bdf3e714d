// The GPU half of backends/optim/elementwise.hpp. Compiled with --fmad=false (CMakeLists.txt):
// a fused multiply-add rounds once where the CPU loop rounds twice, and the point of these
// kernels is the CPU loop's arithmetic, element by element, on the GPU.

#include "backends/optim/cuda/optim_kernels.hpp"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "foundation/error.hpp"

namespace accel::cuda {
namespace {

constexpr int kThreads = 256;
constexpr std::size_t kMaxBlocks = 4096;    // grid-stride loops cover the rest
constexpr std::size_t kReduceBlocks = 512;  // fixed, so a sum's order depends on the count only

void check(cudaError_t rc, const char* what) {
  if (rc != cudaSuccess)
    throw Error(std::string("CUDA kernels: ") + what + ": " + cudaGetErrorString(rc));
}

unsigned blocks_for(std::size_t count, std::size_t cap = kMaxBlocks) {
  return unsigned(std::max<std::size_t>(1, std::min(cap, (count + kThreads - 1) / kThreads)));
}

// The element types as the device sees them; conversions as the CPU's element_to_double /
// element_from_double (f16 and bf16 through float, rounding to nearest even).
__device__ double load_double(const float* p, std::size_t i) { return double(p[i]); }
__device__ double load_double(const double* p, std::size_t i) { return p[i]; }
__device__ double load_double(const __half* p, std::size_t i) { return double(__half2float(p[i])); }
__device__ double load_double(const __nv_bfloat16* p, std::size_t i) {
  return double(__bfloat162float(p[i]));
}
__device__ void store_double(float* p, std::size_t i, double v) { p[i] = float(v); }
__device__ void store_double(double* p, std::size_t i, double v) { p[i] = v; }
__device__ void store_double(__half* p, std::size_t i, double v) {
  p[i] = __float2half_rn(float(v));
}
__device__ void store_double(__nv_bfloat16* p, std::size_t i, double v) {
  p[i] = __float2bfloat16_rn(float(v));
}

// Calls fn(T*) with the device element type of a floating buffer.
template <typename Fn>
void visit_floating(const Buffer& b, const char* what, Fn&& fn) {
  switch (b.dtype) {
    case DType::f32:
      return fn(static_cast<float*>(b.data));
    case DType::f64:
      return fn(static_cast<double*>(b.data));
    case DType::f16:
      return fn(static_cast<__half*>(b.data));
    case DType::bf16:
      return fn(static_cast<__nv_bfloat16*>(b.data));
    default:
      throw InvalidArgument(std::string(what) + ": a CUDA buffer of dtype " +
                            std::string(dtype_name(b.dtype)) + " (floating dtypes only)");
  }
}

__global__ void sgd_kernel(float* p, const float* g, float* buf, std::size_t n, SgdStepArgs a) {
  const std::size_t stride = std::size_t(gridDim.x) * blockDim.x;
  for (std::size_t i = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    float d = g[i];
    if (a.weight_decay != 0) d += a.weight_decay * p[i];
    if (buf) {
      buf[i] = a.first_step ? d : a.momentum * buf[i] + a.dampening_complement * d;
      d = a.nesterov ? d + a.momentum * buf[i] : buf[i];
    }
    p[i] -= a.lr * d;
  }
}

__global__ void adamw_kernel(float* p, const float* g, float* m, float* v, std::size_t n,
                             AdamWStepArgs a) {
  const std::size_t stride = std::size_t(gridDim.x) * blockDim.x;
  for (std::size_t i = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    float grad = g[i];
    if (a.decoupled)
      p[i] *= a.decay;
    else if (a.weight_decay != 0)
      grad += a.weight_decay * p[i];
    m[i] = m[i] * a.beta1 + grad * a.one_minus_beta1;
    v[i] = v[i] * a.beta2 + grad * grad * a.one_minus_beta2;
    const float denom = sqrtf(v[i]) / a.bias2_sqrt + a.eps;
    p[i] -= a.step_size * (m[i] / denom);
  }
}

// One partial sum per block: grid-stride partials per thread, then a shared-memory tree, in an
// order fixed by the element count.
template <typename T>
__global__ void sum_squares_kernel(const T* g, std::size_t n, double* partials) {
  __shared__ double sums[kThreads];
  double s = 0;
  const std::size_t stride = std::size_t(gridDim.x) * blockDim.x;
  for (std::size_t i = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const double v = load_double(g, i);
    s += v * v;
  }
  sums[threadIdx.x] = s;
  __syncthreads();
  for (int half = kThreads / 2; half > 0; half /= 2) {
    if (int(threadIdx.x) < half) sums[threadIdx.x] += sums[threadIdx.x + half];
    __syncthreads();
  }
  if (threadIdx.x == 0) partials[blockIdx.x] = sums[0];
}

template <typename T>
__global__ void scale_kernel(T* g, std::size_t n, double factor, const int* skip_flag) {
  if (skip_flag && *skip_flag) return;  // unscale: a non-finite buffer is left as it is
  const std::size_t stride = std::size_t(gridDim.x) * blockDim.x;
  for (std::size_t i = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    store_double(g, i, load_double(g, i) * factor);
}

template <typename T>
__global__ void find_non_finite_kernel(const T* g, std::size_t n, int* flag) {
  const std::size_t stride = std::size_t(gridDim.x) * blockDim.x;
  for (std::size_t i = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    if (!isfinite(load_double(g, i))) *flag = 1;  // every writer writes 1: no race to lose
}

// DataParallel's reduction: the sources by value (a kernel argument), at most kMaxSummedSources.
template <typename T>
struct SummedSources {
  const T* source[kMaxSummedSources];
  double weight[kMaxSummedSources + 1];  // weight[0] is the destination's
  int count;
};

// As elementwise.cpp's CPU loop: plain sums add one source at a time in the dtype (f16/bf16
// through float, as reduce_elements does); weighted sums accumulate in double and round once.
template <typename T>
__global__ void weighted_sum_kernel(T* dst, SummedSources<T> s, double divide_by, bool plain,
                                    std::size_t n) {
  const std::size_t stride = std::size_t(gridDim.x) * blockDim.x;
  for (std::size_t i = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    if (plain) {
      for (int k = 0; k < s.count; ++k) {
        if constexpr (std::is_same_v<T, double>)
          dst[i] += s.source[k][i];
        else  // f32 adds in float; f16/bf16 widen to float, add, round back
          store_double(dst, i,
                       double(float(load_double(dst, i)) + float(load_double(s.source[k], i))));
      }
    } else {
      double sum = s.weight[0] * load_double(dst, i);
      for (int k = 0; k < s.count; ++k) sum += s.weight[k + 1] * load_double(s.source[k], i);
      store_double(dst, i, sum / divide_by);
    }
  }
}

cudaStream_t stream_of(const DeviceContext& ctx) { return static_cast<cudaStream_t>(ctx.stream); }

int device_of(const DeviceContext& ctx) {
  return ctx.cuda_device >= 0 ? ctx.cuda_device : current_cuda_device();
}

}  // namespace

void sgd_update(float* values, const float* grad, float* momentum_buffer, std::size_t count,
                const SgdStepArgs& args, const DeviceContext& ctx) {
  if (count == 0) return;
  sgd_kernel<<<blocks_for(count), kThreads, 0, stream_of(ctx)>>>(values, grad, momentum_buffer,
                                                                 count, args);
  check(cudaGetLastError(), "SGD kernel launch");
}

void adamw_update(float* values, const float* grad, float* exp_avg, float* exp_avg_sq,
                  std::size_t count, const AdamWStepArgs& args, const DeviceContext& ctx) {
  if (count == 0) return;
  adamw_kernel<<<blocks_for(count), kThreads, 0, stream_of(ctx)>>>(values, grad, exp_avg,
                                                                   exp_avg_sq, count, args);
  check(cudaGetLastError(), "AdamW kernel launch");
}

double sum_of_squares(Buffer grad, const DeviceContext& ctx) {
  if (grad.count == 0) return 0;
  const unsigned blocks = blocks_for(grad.count, kReduceBlocks);
  const DeviceBuffer partials(blocks, DType::f64, MemoryKind::cuda, device_of(ctx));
  visit_floating(grad, "sum of squares", [&](auto* g) {
    sum_squares_kernel<<<blocks, kThreads, 0, stream_of(ctx)>>>(
        g, grad.count, static_cast<double*>(partials.view().data));
  });
  check(cudaGetLastError(), "sum of squares kernel launch");
  // The bounded wait first, so the copy into pageable memory finds the stream idle.
  synchronize_stream(ctx, "clip_grad_norm: the sum of squares of a gradient on the GPU");
  std::vector<double> host(blocks);
  copy_buffer(buffer_of(std::span(host)), partials.view(), ctx.stream);
  double sum = 0;
  for (double p : host) sum += p;  // block order
  return sum;
}

void scale_in_place(Buffer grad, double factor, const DeviceContext& ctx) {
  if (grad.count == 0) return;
  visit_floating(grad, "scale", [&](auto* g) {
    scale_kernel<<<blocks_for(grad.count), kThreads, 0, stream_of(ctx)>>>(g, grad.count, factor,
                                                                          nullptr);
  });
  check(cudaGetLastError(), "scale kernel launch");
}

void weighted_sum(Buffer dst, std::span<const Buffer> sources, std::span<const double> weights,
                  double divide_by, bool plain, const DeviceContext& ctx) {
  if (dst.count == 0) return;
  if (sources.size() > kMaxSummedSources)
    throw InvalidArgument(
        "DataParallel's gradient sum on a GPU: " + std::to_string(sources.size() + 1) +
        " replicas, at most " + std::to_string(kMaxSummedSources + 1));
  visit_floating(dst, "DataParallel's gradient sum", [&](auto* d) {
    using T = std::remove_pointer_t<decltype(d)>;
    SummedSources<T> s{};
    s.count = int(sources.size());
    s.weight[0] = weights[0];
    for (std::size_t k = 0; k < sources.size(); ++k) {
      s.source[k] = static_cast<const T*>(sources[k].data);
      s.weight[k + 1] = weights[k + 1];
    }
    weighted_sum_kernel<<<blocks_for(dst.count), kThreads, 0, stream_of(ctx)>>>(d, s, divide_by,
                                                                                plain, dst.count);
  });
  check(cudaGetLastError(), "DataParallel gradient sum kernel launch");
}

bool unscale(std::span<const Buffer> grads, double inverse, const DeviceContext& ctx) {
  if (grads.empty()) return true;
  // One flag per buffer: each buffer's scale kernel reads its own, so a
  // non-finite buffer is left as it is without a round trip to the host in between.
  const DeviceBuffer flags(grads.size(), DType::i32, MemoryKind::cuda, device_of(ctx));
  // Zeroed again on the stream: the allocation's memset runs on the legacy default stream, which
  // a non-blocking compute stream is not ordered after.
  zero_buffer(flags.view(), ctx.stream);
  int* flag = static_cast<int*>(flags.view().data);
  for (std::size_t k = 0; k < grads.size(); ++k) {
    const Buffer& b = grads[k];
    if (b.count == 0) continue;
    visit_floating(b, "unscale", [&](auto* g) {
      find_non_finite_kernel<<<blocks_for(b.count), kThreads, 0, stream_of(ctx)>>>(g, b.count,
                                                                                   flag + k);
      scale_kernel<<<blocks_for(b.count), kThreads, 0, stream_of(ctx)>>>(g, b.count, inverse,
                                                                         flag + k);
    });
    check(cudaGetLastError(), "unscale kernel launch");
  }
  synchronize_stream(ctx, "fp16 loss scaling: unscaling the gradients on the GPU");
  std::vector<std::int32_t> host(grads.size());
  copy_buffer(buffer_of(std::span(host)), flags.view(), ctx.stream);
  return std::all_of(host.begin(), host.end(), [](std::int32_t f) { return f == 0; });
}

}  // namespace accel::cuda
