#include "examples/raw_cuda/cuda_mlp.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <stdexcept>
#include <utility>

#include "examples/raw_cuda/mlp_kernels.hpp"

namespace raw_cuda {
namespace {

void check(cudaError_t rc, const char* what) {
  if (rc != cudaSuccess)
    throw std::runtime_error(std::string("raw_cuda: ") + what + ": " + cudaGetErrorString(rc));
}

void check(cublasStatus_t rc, const char* what) {
  if (rc != CUBLAS_STATUS_SUCCESS)
    throw std::runtime_error(std::string("raw_cuda: ") + what + ": " + cublasGetStatusString(rc));
}

template <typename T = void>
T* device_alloc(std::size_t bytes) {
  void* ptr = nullptr;
  check(cudaMalloc(&ptr, std::max<std::size_t>(bytes, 1)), "cudaMalloc");
  check(cudaMemset(ptr, 0, bytes), "cudaMemset");
  return static_cast<T*>(ptr);
}

cudaDataType cuda_type(accel::DType dtype) {
  switch (dtype) {
    case accel::DType::f16:
      return CUDA_R_16F;
    case accel::DType::bf16:
      return CUDA_R_16BF;
    default:
      return CUDA_R_32F;
  }
}

}  // namespace

CudaMlp::CudaMlp(std::vector<int> sizes, std::uint64_t seed, accel::DType dtype, int max_batch)
    : dtype_(dtype), max_batch_(max_batch), sizes_(std::move(sizes)) {
  if (dtype != accel::DType::f32 && dtype != accel::DType::f16 && dtype != accel::DType::bf16)
    throw std::invalid_argument("raw_cuda: compute precision f32, f16 or bf16");
  allocate(sizes_);
  // raw_mlp's initialisation, drawn on the host in the same order.
  std::mt19937_64 rng(seed);
  for (CudaLayer& L : layers_) {
    const float bound = 1.0f / std::sqrt(float(L.in));
    std::uniform_real_distribution<float> u(-bound, bound);
    std::vector<float> w(std::size_t(L.out) * L.in), b(L.out);
    for (float& v : w) v = u(rng);
    for (float& v : b) v = u(rng);
    check(cudaMemcpy(L.weight, w.data(), w.size() * sizeof(float), cudaMemcpyHostToDevice),
          "cudaMemcpy weights");
    check(cudaMemcpy(L.bias, b.data(), b.size() * sizeof(float), cudaMemcpyHostToDevice),
          "cudaMemcpy bias");
  }
}

CudaMlp::CudaMlp(const CudaMlp& other)
    : dtype_(other.dtype_), max_batch_(other.max_batch_), sizes_(other.sizes_) {
  allocate(sizes_);
  for (std::size_t l = 0; l < layers_.size(); ++l) {
    const CudaLayer& from = other.layers_[l];
    CudaLayer& to = layers_[l];
    // cudaMemcpyDefault: unified addressing finds both devices (a peer copy between GPUs).
    check(cudaMemcpy(to.weight, from.weight, std::size_t(to.out) * to.in * sizeof(float),
                     cudaMemcpyDefault),
          "cudaMemcpy weights (copying the model)");
    check(cudaMemcpy(to.bias, from.bias, std::size_t(to.out) * sizeof(float), cudaMemcpyDefault),
          "cudaMemcpy bias (copying the model)");
  }
}

void CudaMlp::allocate(const std::vector<int>& sizes) {
  check(cublasCreate(&cublas_), "cublasCreate");
  int widest = 0;
  for (std::size_t l = 0; l + 1 < sizes.size(); ++l) {
    CudaLayer L;
    L.in = sizes[l];
    L.out = sizes[l + 1];
    const std::size_t nw = std::size_t(L.out) * L.in;
    L.weight = device_alloc<float>(nw * sizeof(float));
    L.bias = device_alloc<float>(std::size_t(L.out) * sizeof(float));
    L.weight_grad = device_alloc<float>(nw * sizeof(float));
    L.bias_grad = device_alloc<float>(std::size_t(L.out) * sizeof(float));
    if (dtype_ != accel::DType::f32)
      L.weight_compute = device_alloc(nw * accel::element_size(dtype_));
    widest = std::max({widest, L.in, L.out});
    layers_.push_back(L);
  }
  const std::size_t e = accel::element_size(dtype_);
  input_f32_ = device_alloc<float>(std::size_t(max_batch_) * sizes.front() * sizeof(float));
  for (int width : sizes) acts_.push_back(device_alloc(std::size_t(max_batch_) * width * e));
  for (void*& d : delta_) d = device_alloc(std::size_t(max_batch_) * widest * e);
  labels_ = device_alloc<int>(std::size_t(max_batch_) * sizeof(int));
  losses_ = device_alloc<float>(std::size_t(max_batch_) * sizeof(float));
  predicted_ = device_alloc<int>(std::size_t(max_batch_) * sizeof(int));
}

CudaMlp::~CudaMlp() {
  for (CudaLayer& L : layers_)
    for (void* p :
         {static_cast<void*>(L.weight), static_cast<void*>(L.bias),
          static_cast<void*>(L.weight_grad), static_cast<void*>(L.bias_grad), L.weight_compute})
      cudaFree(p);
  for (void* p : acts_) cudaFree(p);
  for (void* p : delta_) cudaFree(p);
  cudaFree(input_f32_);
  cudaFree(labels_);
  cudaFree(losses_);
  cudaFree(predicted_);
  if (cublas_) cublasDestroy(cublas_);
}

std::vector<accel::ParamRef> CudaMlp::param_refs(std::size_t bias_group) {
  using accel::Buffer, accel::DType, accel::DeviceKind;
  std::vector<accel::ParamRef> params;
  for (std::size_t l = 0; l < layers_.size(); ++l) {
    CudaLayer& L = layers_[l];
    const std::size_t nw = std::size_t(L.out) * L.in, nb = std::size_t(L.out);
    const std::string name = "layer" + std::to_string(l);
    params.push_back({name + ".weight",
                      Buffer{L.weight, nw, DType::f32, DeviceKind::cuda},
                      Buffer{L.weight_grad, nw, DType::f32, DeviceKind::cuda},
                      0,
                      {L.out, L.in}});
    params.push_back({name + ".bias", Buffer{L.bias, nb, DType::f32, DeviceKind::cuda},
                      Buffer{L.bias_grad, nb, DType::f32, DeviceKind::cuda}, bias_group});
  }
  return params;
}

void CudaMlp::refresh_compute_weights() {
  if (dtype_ == accel::DType::f32) return;
  for (CudaLayer& L : layers_)
    cast_from_f32(L.weight, L.weight_compute, std::size_t(L.out) * L.in, dtype_);
}

void CudaMlp::zero_grad() {
  for (CudaLayer& L : layers_) {
    check(cudaMemset(L.weight_grad, 0, std::size_t(L.out) * L.in * sizeof(float)), "cudaMemset");
    check(cudaMemset(L.bias_grad, 0, std::size_t(L.out) * sizeof(float)), "cudaMemset");
  }
}

// Row-major Y (batch x out) = X (batch x in) W^T, as column-major Y^T = W^T' X^T: cuBLAS sees
// W (out x in row-major) as an in x out column-major matrix and transposes it.
void CudaMlp::forward(std::span<const float> x, int batch) {
  if (batch > max_batch_) throw std::invalid_argument("raw_cuda: batch larger than max_batch");
  refresh_compute_weights();
  const cudaDataType type = cuda_type(dtype_);
  check(cudaMemcpy(input_f32_, x.data(), x.size() * sizeof(float), cudaMemcpyHostToDevice),
        "cudaMemcpy batch");
  if (dtype_ == accel::DType::f32)
    check(cudaMemcpy(acts_[0], input_f32_, x.size() * sizeof(float), cudaMemcpyDeviceToDevice),
          "cudaMemcpy batch");
  else
    cast_from_f32(input_f32_, acts_[0], x.size(), dtype_);
  const float one = 1.0f, zero = 0.0f;
  for (std::size_t l = 0; l < layers_.size(); ++l) {
    const CudaLayer& L = layers_[l];
    const void* w = dtype_ == accel::DType::f32 ? L.weight : L.weight_compute;
    check(cublasGemmEx(cublas_, CUBLAS_OP_T, CUBLAS_OP_N, L.out, batch, L.in, &one, w, type, L.in,
                       acts_[l], type, L.in, &zero, acts_[l + 1], type, L.out, CUBLAS_COMPUTE_32F,
                       CUBLAS_GEMM_DEFAULT),
          "cublasGemmEx forward");
    add_bias_activate(acts_[l + 1], L.bias, batch, L.out, l + 1 < layers_.size(), dtype_);
  }
}

float CudaMlp::forward_backward(std::span<const float> x, std::span<const int> labels,
                                float loss_scale,
                                const std::function<void(std::size_t)>& on_layer_grads) {
  const int batch = int(labels.size());
  forward(x, batch);
  check(cudaMemcpy(labels_, labels.data(), labels.size() * sizeof(int), cudaMemcpyHostToDevice),
        "cudaMemcpy labels");
  const cudaDataType type = cuda_type(dtype_);
  const int classes = layers_.back().out;
  softmax_cross_entropy(acts_.back(), labels_, batch, classes, loss_scale / float(batch), delta_[0],
                        losses_, dtype_);
  const float one = 1.0f, zero = 0.0f;
  int cur = 0;
  for (std::size_t l = layers_.size(); l-- > 0;) {
    CudaLayer& L = layers_[l];
    // dW (out x in, row-major) += delta^T A: column-major dW^T (in x out) = A^T' delta^T'.
    // A and delta in the compute type, dW in fp32: the gradients stay fp32 whatever the
    // compute precision.
    check(cublasGemmEx(cublas_, CUBLAS_OP_N, CUBLAS_OP_T, L.in, L.out, batch, &one, acts_[l], type,
                       L.in, delta_[cur], type, L.out, &one, L.weight_grad, CUDA_R_32F, L.in,
                       CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
          "cublasGemmEx weight gradient");
    bias_grad_accumulate(delta_[cur], batch, L.out, L.bias_grad, dtype_);
    on_layer_grads(l);
    if (l == 0) break;
    // The previous layer's delta (batch x in) = delta W, then through its ReLU.
    const void* w = dtype_ == accel::DType::f32 ? L.weight : L.weight_compute;
    check(cublasGemmEx(cublas_, CUBLAS_OP_N, CUBLAS_OP_N, L.in, batch, L.out, &one, w, type, L.in,
                       delta_[cur], type, L.out, &zero, delta_[1 - cur], type, L.in,
                       CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
          "cublasGemmEx input gradient");
    relu_backward(delta_[1 - cur], acts_[l], std::size_t(batch) * L.in, dtype_);
    cur = 1 - cur;
  }
  // The loss, summed on the host in sample order (the same bits every run).
  std::vector<float> losses(batch);
  check(cudaMemcpy(losses.data(), losses_, losses.size() * sizeof(float), cudaMemcpyDeviceToHost),
        "cudaMemcpy losses");
  double sum = 0;
  for (float v : losses) sum += v;
  return float(sum / batch);
}

std::vector<int> CudaMlp::predict(std::span<const float> x, int batch) {
  forward(x, batch);
  argmax_rows(acts_.back(), batch, layers_.back().out, predicted_, dtype_);
  std::vector<int> out(batch);
  check(cudaMemcpy(out.data(), predicted_, out.size() * sizeof(int), cudaMemcpyDeviceToHost),
        "cudaMemcpy predictions");
  return out;
}

std::vector<float> CudaMlp::download_parameters() const {
  std::vector<float> out;
  for (const CudaLayer& L : layers_) {
    for (auto [ptr, n] :
         {std::pair{L.weight, std::size_t(L.out) * L.in}, std::pair{L.bias, std::size_t(L.out)}}) {
      const std::size_t at = out.size();
      out.resize(at + n);
      check(cudaMemcpy(out.data() + at, ptr, n * sizeof(float), cudaMemcpyDeviceToHost),
            "cudaMemcpy parameters");
    }
  }
  return out;
}

}  // namespace raw_cuda
