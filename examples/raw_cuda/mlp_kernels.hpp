#pragma once
// The small kernels of the CUDA MLP (everything but the matrix products, which are cuBLAS's).
// Each queues work on the legacy default stream, the stream cuBLAS and the NCCL communicator
// order themselves after. `dtype` is the activations' type: f32, or f16 / bf16 under mixed
// precision (the arithmetic inside is float either way).

#include <cstddef>

#include "foundation/dtype.hpp"

namespace raw_cuda {

// out[i] = in[i] rounded to `dtype` (the compute copy of fp32 master weights, or the input).
void cast_from_f32(const float* in, void* out, std::size_t n, accel::DType dtype);
// y[n][o] += bias[o], then ReLU when `relu` (y: batch x out, row-major).
void add_bias_activate(void* y, const float* bias, int batch, int out, bool relu,
                       accel::DType dtype);
// Softmax cross-entropy per row of logits (batch x classes): losses[n] (float), and
// delta[n][c] = (softmax - onehot) * delta_scale, delta_scale being loss_scale / batch.
void softmax_cross_entropy(const void* logits, const int* labels, int batch, int classes,
                           float delta_scale, void* delta, float* losses, accel::DType dtype);
// bias_grad[o] += sum over n of delta[n][o], in a fixed order.
void bias_grad_accumulate(const void* delta, int batch, int out, float* bias_grad,
                          accel::DType dtype);
// grad[i] = 0 where the ReLU's output act[i] was 0.
void relu_backward(void* grad, const void* act, std::size_t n, accel::DType dtype);
// out[n] = the index of row n's largest logit.
void argmax_rows(const void* logits, int batch, int classes, int* out, accel::DType dtype);

}  // namespace raw_cuda
