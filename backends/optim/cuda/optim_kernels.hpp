#pragma once
// CUDA kernels for the element-wise work of the built-in optimizers, clipping and loss scaling
// (accel_optim_cuda, built with ACCEL_WITH_CUDA). Plain C++ declarations, no CUDA headers:
// backends/optim/elementwise.cpp calls them for DeviceKind::cuda buffers and is what users
// call (accel::Sgd, accel::AdamW, clip_grad_norm, the loss scaler); these are the GPU half.
//
// Every kernel runs on the legacy default stream, after whatever the loop queued there (its
// backward kernels) and before the next collective (the NCCL communicator waits on that
// stream before each operation). Calls that return a value wait for their result; the others
// only queue work. Errors throw accel::Error naming the call and CUDA's message.

#include <cstddef>
#include <span>

#include "backends/comm/dtype.hpp"
#include "backends/optim/elementwise.hpp"

namespace accel::cuda {

void sgd_update(float* values, const float* grad, float* momentum_buffer, std::size_t count,
                const SgdStepArgs& args);
void adamw_update(float* values, const float* grad, float* exp_avg, float* exp_avg_sq,
                  std::size_t count, const AdamWStepArgs& args);
// The buffer's sum of squares in double (f32, f64, f16, bf16), reduced in a fixed order.
double sum_of_squares(Buffer grad);
void scale_in_place(Buffer grad, double factor);
// Unscales every buffer whose elements are all finite; returns whether all were.
bool unscale(std::span<const Buffer> grads, double inverse);

void* allocate_zeroed(std::size_t bytes);
void free_device(void* ptr) noexcept;
void fill_zero(void* ptr, std::size_t bytes);
void copy_to_host(void* host, const void* device, std::size_t bytes);
void copy_to_device(void* device, const void* host, std::size_t bytes);
void copy_device_to_device(void* dst, const void* src, std::size_t bytes);

}  // namespace accel::cuda
