#pragma once
// The element-wise work of the built-in optimizers, clipping and fp16 loss scaling on a buffer
// wherever it lives: CPU loops here, CUDA kernels (backends/optim/cuda, accel_optim_cuda) for
// DeviceKind::cuda. This file is the one place that chooses between them, so Sgd, AdamW,
// clip_grad_norm and the loss scaler's unscale do the same on CPU and GPU segments and a raw
// loop on CUDA buffers does not change. Both sides take the same float scalars computed once
// by the caller, so they do the same arithmetic element by element (the kernels are compiled
// without fused multiply-add for that reason).
//
// GPU work goes to ctx.stream (DeviceContext, device_memory.hpp): the loop's compute stream,
// compute_context(comm) for the communicator the strategy uses, so kernels are ordered after
// the strategy's copies and before its next collective without a host wait. Calls that return
// a host value (add_sum_of_squares, unscale_gradients, StateArray::read) wait for that stream,
// bounded by ctx.timeout. The default context is the legacy default stream. CPU buffers ignore
// the context.

#include <cstddef>
#include <span>

#include "foundation/device_memory.hpp"
#include "foundation/dtype.hpp"

namespace accel {

// torch.optim.SGD's per-element update with the scalars already in float.
struct SgdStepArgs {
  float lr = 0, weight_decay = 0, momentum = 0;
  float dampening_complement = 1;  // 1 - dampening
  bool nesterov = false;
  bool first_step = false;  // the momentum buffer starts as the gradient
};
// values -= lr * d (d: the gradient plus weight decay, through the momentum buffer when
// `momentum_buffer` is not null; it lives on values.device). f32 values and gradient.
void sgd_update(Buffer values, Buffer grad, float* momentum_buffer, const SgdStepArgs& args,
                const DeviceContext& ctx = {});

// torch.optim.AdamW's (or Adam's, decoupled = false) per-element update.
struct AdamWStepArgs {
  float step_size = 0;  // lr / (1 - beta1^step)
  float beta1 = 0, beta2 = 0, one_minus_beta1 = 0, one_minus_beta2 = 0;
  float eps = 0;
  float decay = 1;         // 1 - lr * weight_decay (decoupled)
  float weight_decay = 0;  // added to the gradient (not decoupled)
  float bias2_sqrt = 1;    // sqrt(1 - beta2^step)
  bool decoupled = true;
};
void adamw_update(Buffer values, Buffer grad, float* exp_avg, float* exp_avg_sq,
                  const AdamWStepArgs& args, const DeviceContext& ctx = {});

// sum += g[i]^2 over the buffer, in double. On the CPU one running sum in element order
// (so summing several buffers one after the other equals summing them end to end); on a GPU
// the buffer's own sum, reduced in a fixed order (the same bits every run), then added.
void add_sum_of_squares(Buffer grad, double& sum, const DeviceContext& ctx = {});

// g[i] = g[i] * factor, through double (clip_grad_norm's multiply).
void scale_in_place(Buffer grad, double factor, const DeviceContext& ctx = {});

// fp16 loss scaling: divides every buffer by `scale` (multiplying by 1 / scale in double) and
// returns whether all were finite; a buffer holding an inf or NaN is left as it is (its step
// is skipped). Floating dtypes only. CUDA buffers are checked together: one flag read per call.
bool unscale_gradients(std::span<const Buffer> grads, double scale, const DeviceContext& ctx = {});

// DataParallel's gradient reduction into replica 0:
//   dst = (weights[0] dst + sum_k weights[k + 1] sources[k]) / divide_by
// element by element in double (f32 and f64 only), or, when every weight is 1 and divide_by is
// 1, the plain sums dst += sources[0], dst += sources[1], ... in the buffers' dtype (as one
// replica accumulating all rows would round). The sources have dst's dtype and count and live
// where dst does (the same CUDA device). At most kMaxSummedSources sources on a GPU.
inline constexpr std::size_t kMaxSummedSources = 15;
void weighted_sum(Buffer dst, std::span<const Buffer> sources, std::span<const double> weights,
                  double divide_by, const DeviceContext& ctx = {});

// Zeroes the buffer (a skipped step's gradients): zero_buffer on ctx.stream.
void fill_zero(Buffer buffer, const DeviceContext& ctx = {});

// Optimizer state: `count` zeroed floats where the parameters live (a DeviceBuffer: host
// memory, or CUDA memory on ctx's device, zeroed on ctx.stream), owned. Move-only.
class StateArray {
 public:
  StateArray(std::size_t count, DeviceKind device, const DeviceContext& ctx = {});

  float* data() const { return static_cast<float*>(buffer_.view().data); }
  std::size_t count() const { return buffer_.view().count; }
  DeviceKind device() const { return buffer_.view().device; }
  Buffer view() const { return buffer_.view(); }
  // Host copies in and out (a checkpoint's bytes), on ctx.stream; read waits for it.
  void read(float* host_out, const DeviceContext& ctx = {}) const;
  void write(const float* host_in, const DeviceContext& ctx = {});
  // The same values on another device (the state of a checkpoint loaded before the first step
  // moves to the parameters' device there).
  StateArray to(DeviceKind device, const DeviceContext& ctx = {}) const;

 private:
  DeviceBuffer buffer_;
};

// Whether this build has the CUDA kernels (ACCEL_WITH_CUDA).
bool cuda_kernels_built();

}  // namespace accel
