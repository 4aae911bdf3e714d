#pragma once
// CUDA kernels for the element-wise work of the built-in optimizers, clipping and loss scaling
// (accel_optim_cuda, built with ACCEL_WITH_CUDA). Plain C++ declarations, no CUDA headers:
// backends/optim/elementwise.cpp calls them for DeviceKind::cuda buffers and is what users
// call (accel::Sgd, accel::AdamW, clip_grad_norm, the loss scaler); these are the GPU half.
//
// Every kernel runs on ctx.stream, the loop's compute stream (compute_context(comm): the
// communicator's, so the next collective is ordered after it and the strategies' copies before
// it). Calls that hand a value back to the host (the sum of squares, unscale's found-inf) wait
// for that stream with synchronize_stream, bounded by ctx.timeout; the others only queue work.
// Scratch memory and copies go through backends/comm/device_memory.hpp, the one place device
// memory is handled; this file holds kernels only. Errors throw accel::Error naming the call
// and CUDA's message.

#include <cstddef>
#include <span>

#include "backends/optim/elementwise.hpp"
#include "foundation/device_memory.hpp"
#include "foundation/dtype.hpp"

namespace accel::cuda {

void sgd_update(float* values, const float* grad, float* momentum_buffer, std::size_t count,
                const SgdStepArgs& args, const DeviceContext& ctx);
void adamw_update(float* values, const float* grad, float* exp_avg, float* exp_avg_sq,
                  std::size_t count, const AdamWStepArgs& args, const DeviceContext& ctx);
// The buffer's sum of squares in double (f32, f64, f16, bf16), reduced in a fixed order.
double sum_of_squares(Buffer grad, const DeviceContext& ctx);
void scale_in_place(Buffer grad, double factor, const DeviceContext& ctx);
// elementwise.hpp's weighted_sum (arguments checked there; `plain`: every weight 1, no division).
void weighted_sum(Buffer dst, std::span<const Buffer> sources, std::span<const double> weights,
                  double divide_by, bool plain, const DeviceContext& ctx);
// Unscales every buffer whose elements are all finite; returns whether all were.
bool unscale(std::span<const Buffer> grads, double inverse, const DeviceContext& ctx);

}  // namespace accel::cuda
