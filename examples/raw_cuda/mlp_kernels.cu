#include "examples/raw_cuda/mlp_kernels.hpp"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

namespace raw_cuda {
namespace {

constexpr int kThreads = 256;

unsigned blocks_for(std::size_t n) { return unsigned((n + kThreads - 1) / kThreads); }

void check_launch(const char* what) {
  const cudaError_t rc = cudaGetLastError();
  if (rc != cudaSuccess)
    throw std::runtime_error(std::string("raw_cuda: ") + what + ": " + cudaGetErrorString(rc));
}

__device__ float to_f(float v) { return v; }
__device__ float to_f(__half v) { return __half2float(v); }
__device__ float to_f(__nv_bfloat16 v) { return __bfloat162float(v); }
template <typename T>
__device__ T from_f(float v);
template <>
__device__ float from_f<float>(float v) {
  return v;
}
template <>
__device__ __half from_f<__half>(float v) {
  return __float2half_rn(v);
}
template <>
__device__ __nv_bfloat16 from_f<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

// Calls fn(T{}) with the device type of an activation dtype.
template <typename Fn>
void visit(accel::DType dtype, Fn&& fn) {
  switch (dtype) {
    case accel::DType::f32:
      return fn(float{});
    case accel::DType::f16:
      return fn(__half{});
    case accel::DType::bf16:
      return fn(__nv_bfloat16{});
    default:
      throw std::invalid_argument("raw_cuda: activations are f32, f16 or bf16, not " +
                                  std::string(accel::dtype_name(dtype)));
  }
}

template <typename T>
__global__ void cast_kernel(const float* in, T* out, std::size_t n) {
  const std::size_t i = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) out[i] = from_f<T>(in[i]);
}

template <typename T>
__global__ void bias_act_kernel(T* y, const float* bias, int batch, int out, bool relu) {
  const std::size_t i = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= std::size_t(batch) * out) return;
  float v = to_f(y[i]) + bias[i % out];
  if (relu) v = fmaxf(v, 0.0f);
  y[i] = from_f<T>(v);
}

template <typename T>
__global__ void softmax_ce_kernel(const T* logits, const int* labels, int batch, int classes,
                                  float delta_scale, T* delta, float* losses) {
  const int n = blockIdx.x * blockDim.x + threadIdx.x;
  if (n >= batch) return;
  const T* z = logits + std::size_t(n) * classes;
  float zmax = to_f(z[0]);
  for (int c = 1; c < classes; ++c) zmax = fmaxf(zmax, to_f(z[c]));
  double sum = 0;
  for (int c = 0; c < classes; ++c) sum += exp(double(to_f(z[c]) - zmax));
  const int label = labels[n];
  losses[n] = float(-(double(to_f(z[label]) - zmax) - log(sum)));
  for (int c = 0; c < classes; ++c) {
    const float p = float(exp(double(to_f(z[c]) - zmax)) / sum);
    delta[std::size_t(n) * classes + c] = from_f<T>((p - (c == label ? 1.0f : 0.0f)) * delta_scale);
  }
}

template <typename T>
__global__ void bias_grad_kernel(const T* delta, int batch, int out, float* bias_grad) {
  const int o = blockIdx.x * blockDim.x + threadIdx.x;
  if (o >= out) return;
  float s = 0;
  for (int n = 0; n < batch; ++n) s += to_f(delta[std::size_t(n) * out + o]);
  bias_grad[o] += s;
}

template <typename T>
__global__ void relu_backward_kernel(T* grad, const T* act, std::size_t n) {
  const std::size_t i = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n && !(to_f(act[i]) > 0.0f)) grad[i] = from_f<T>(0.0f);
}

template <typename T>
__global__ void argmax_kernel(const T* logits, int batch, int classes, int* out) {
  const int n = blockIdx.x * blockDim.x + threadIdx.x;
  if (n >= batch) return;
  const T* z = logits + std::size_t(n) * classes;
  int best = 0;
  for (int c = 1; c < classes; ++c)
    if (to_f(z[c]) > to_f(z[best])) best = c;
  out[n] = best;
}

}  // namespace

void cast_from_f32(const float* in, void* out, std::size_t n, accel::DType dtype) {
  if (n == 0) return;
  visit(dtype, [&](auto t) {
    using T = decltype(t);
    cast_kernel<T><<<blocks_for(n), kThreads>>>(in, static_cast<T*>(out), n);
  });
  check_launch("cast kernel");
}

void add_bias_activate(void* y, const float* bias, int batch, int out, bool relu,
                       accel::DType dtype) {
  visit(dtype, [&](auto t) {
    using T = decltype(t);
    bias_act_kernel<T><<<blocks_for(std::size_t(batch) * out), kThreads>>>(static_cast<T*>(y), bias,
                                                                           batch, out, relu);
  });
  check_launch("bias + ReLU kernel");
}

void softmax_cross_entropy(const void* logits, const int* labels, int batch, int classes,
                           float delta_scale, void* delta, float* losses, accel::DType dtype) {
  visit(dtype, [&](auto t) {
    using T = decltype(t);
    softmax_ce_kernel<T><<<blocks_for(std::size_t(batch)), kThreads>>>(
        static_cast<const T*>(logits), labels, batch, classes, delta_scale, static_cast<T*>(delta),
        losses);
  });
  check_launch("softmax cross-entropy kernel");
}

void bias_grad_accumulate(const void* delta, int batch, int out, float* bias_grad,
                          accel::DType dtype) {
  visit(dtype, [&](auto t) {
    using T = decltype(t);
    bias_grad_kernel<T><<<blocks_for(std::size_t(out)), kThreads>>>(static_cast<const T*>(delta),
                                                                    batch, out, bias_grad);
  });
  check_launch("bias gradient kernel");
}

void relu_backward(void* grad, const void* act, std::size_t n, accel::DType dtype) {
  if (n == 0) return;
  visit(dtype, [&](auto t) {
    using T = decltype(t);
    relu_backward_kernel<T>
        <<<blocks_for(n), kThreads>>>(static_cast<T*>(grad), static_cast<const T*>(act), n);
  });
  check_launch("ReLU backward kernel");
}

void argmax_rows(const void* logits, int batch, int classes, int* out, accel::DType dtype) {
  visit(dtype, [&](auto t) {
    using T = decltype(t);
    argmax_kernel<T><<<blocks_for(std::size_t(batch)), kThreads>>>(static_cast<const T*>(logits),
                                                                   batch, classes, out);
  });
  check_launch("argmax kernel");
}

}  // namespace raw_cuda
