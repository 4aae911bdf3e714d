#pragma once
// The hand-written MLP of examples/raw_mlp on a GPU: Linear -> ReLU -> ... -> Linear with
// softmax cross-entropy, every buffer cudaMalloc'd, the matrix products cuBLAS's
// (cublasGemmEx, fp32 accumulation), the rest small kernels (mlp_kernels.hpp). The same seed
// gives raw_mlp's initial weights.
//
// Mixed precision (dtype f16 or bf16): the parameters the Accelerator and the optimizer see
// are fp32 master weights with fp32 gradients; the forward and backward passes run on a
// compute copy of the weights (cast from the masters at the start of every forward, so it
// follows whatever changed them: the optimizer, a checkpoint, DataParallel's copies) and on
// activations in f16/bf16, and cuBLAS writes the weight gradients straight into the fp32
// gradient buffers. With f32 nothing is copied.
//
// Every buffer is on the GPU that was current when the model was made; a copy (the
// Accelerator's DataParallel replicas) goes on the GPU current when it is made, with the
// original's parameters and zero gradients, and must be used with that GPU current.

#include <cublas_v2.h>

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "backends/backend.hpp"

namespace raw_cuda {

struct CudaLayer {
  int in = 0, out = 0;
  float* weight = nullptr;  // out x in, row-major (torch::nn::Linear's layout), fp32 master
  float* bias = nullptr;    // out
  float* weight_grad = nullptr;
  float* bias_grad = nullptr;
  void* weight_compute = nullptr;  // the f16/bf16 copy of weight (null for f32)
};

class CudaMlp {
 public:
  // sizes = {784, 64, 10}; `dtype` is the compute precision (f32, f16, bf16); batches of at
  // most max_batch samples.
  CudaMlp(std::vector<int> sizes, std::uint64_t seed, accel::DType dtype, int max_batch);
  // On the current GPU: the same parameters (copied from wherever the original is), zero
  // gradients.
  CudaMlp(const CudaMlp& other);
  ~CudaMlp();
  CudaMlp& operator=(const CudaMlp&) = delete;

  // One ParamRef per weight and bias (raw_mlp's names and shapes) over the fp32 master
  // buffers in GPU memory (DeviceKind::cuda); biases in param group `bias_group`.
  std::vector<accel::ParamRef> param_refs(std::size_t bias_group = 0);

  void zero_grad();

  // Forward and backward over a batch from host memory. Gradients of (mean loss) * loss_scale
  // are ADDED to the fp32 gradient buffers; on_layer_grads(l) is called once layer l's are
  // queued, last layer first (the strategy starts communicating there). Returns the mean loss.
  float forward_backward(std::span<const float> x, std::span<const int> labels, float loss_scale,
                         const std::function<void(std::size_t)>& on_layer_grads);
  std::vector<int> predict(std::span<const float> x, int batch);

  // Every master parameter, weights then bias per layer, copied to the host.
  std::vector<float> download_parameters() const;

 private:
  // Every buffer on the current GPU, for layers_' shapes (gradients and scratch zeroed).
  void allocate(const std::vector<int>& sizes);
  // The f16/bf16 compute copies from the master weights.
  void refresh_compute_weights();
  void forward(std::span<const float> x, int batch);

  std::vector<CudaLayer> layers_;
  accel::DType dtype_;
  int max_batch_;
  std::vector<int> sizes_;  // {inputs, hidden..., classes}
  cublasHandle_t cublas_ = nullptr;
  float* input_f32_ = nullptr;           // max_batch x in (the batch as uploaded)
  std::vector<void*> acts_;              // per layer boundary: max_batch x width, dtype_
  void* delta_[2] = {nullptr, nullptr};  // max_batch x widest, dtype_
  int* labels_ = nullptr;
  float* losses_ = nullptr;
  int* predicted_ = nullptr;
};

}  // namespace raw_cuda
