#include "backends/optim/elementwise.hpp"

#include <cmath>
#include <cstring>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "foundation/error.hpp"
#include "foundation/reduce.hpp"

#if ACCEL_HAVE_CUDA_KERNELS
#include "backends/optim/cuda/optim_kernels.hpp"
#endif

namespace accel {
namespace {

bool on_cuda(const Buffer& b, const char* what) {
  if (b.device == DeviceKind::cpu) return false;
#if !ACCEL_HAVE_CUDA_KERNELS
  throw InvalidArgument(std::string(what) +
                        ": the buffer is in CUDA memory, and this build of accelerate-cpp has no "
                        "CUDA kernels (configured with ACCEL_WITH_CUDA=OFF or without nvcc)");
#else
  (void)what;
  return true;
#endif
}

void check_update(const Buffer& values, const Buffer& grad, const char* what) {
  ACCEL_CHECK_ARG(values.dtype == DType::f32 && grad.dtype == DType::f32,
                  std::string(what) + ": f32 values and gradients only, got " +
                      std::string(dtype_name(values.dtype)) + " and " +
                      std::string(dtype_name(grad.dtype)));
  ACCEL_CHECK_ARG(values.count == grad.count,
                  std::string(what) + ": " + std::to_string(values.count) + " values and " +
                      std::to_string(grad.count) + " gradient elements");
  ACCEL_CHECK_ARG(values.device == grad.device,
                  std::string(what) + ": values and gradient on different devices");
}

void check_floating(const Buffer& b, const char* what) {
  ACCEL_CHECK_ARG(is_floating(b.dtype), std::string(what) + ": a gradient of dtype " +
                                            std::string(dtype_name(b.dtype)) +
                                            " (gradients are floating point)");
}

}  // namespace

bool cuda_kernels_built() {
#if ACCEL_HAVE_CUDA_KERNELS
  return true;
#else
  return false;
#endif
}

void sgd_update(Buffer values, Buffer grad, float* momentum_buffer, const SgdStepArgs& a,
                const DeviceContext& ctx) {
  check_update(values, grad, "SGD");
  float* p = static_cast<float*>(values.data);
  const float* g = static_cast<const float*>(grad.data);
  const std::size_t n = values.count;
  if (on_cuda(values, "SGD")) {
#if ACCEL_HAVE_CUDA_KERNELS
    cuda::sgd_update(p, g, momentum_buffer, n, a, ctx);
#else
    (void)ctx;
#endif
    return;
  }
  // Locals, not args' fields: a float store through p could alias them, which would keep the
  // compiler from hoisting and vectorising.
  const float lr = a.lr, wd = a.weight_decay, mu = a.momentum, damp = a.dampening_complement;
  const bool nesterov = a.nesterov, first = a.first_step;
  float* buf = momentum_buffer;
  for (std::size_t i = 0; i < n; ++i) {
    float d = g[i];
    if (wd != 0) d += wd * p[i];
    if (buf) {
      buf[i] = first ? d : mu * buf[i] + damp * d;
      d = nesterov ? d + mu * buf[i] : buf[i];
    }
    p[i] -= lr * d;
  }
}

void adamw_update(Buffer values, Buffer grad, float* m, float* v, const AdamWStepArgs& a,
                  const DeviceContext& ctx) {
  check_update(values, grad, "AdamW");
  float* p = static_cast<float*>(values.data);
  const float* g = static_cast<const float*>(grad.data);
  const std::size_t n = values.count;
  if (on_cuda(values, "AdamW")) {
#if ACCEL_HAVE_CUDA_KERNELS
    cuda::adamw_update(p, g, m, v, n, a, ctx);
#else
    (void)ctx;
#endif
    return;
  }
  const float step_size = a.step_size, b1 = a.beta1, b2 = a.beta2, c1 = a.one_minus_beta1,
              c2 = a.one_minus_beta2, eps = a.eps, decay = a.decay, wd = a.weight_decay,
              bias2_sqrt = a.bias2_sqrt;
  const bool decoupled = a.decoupled;
  for (std::size_t i = 0; i < n; ++i) {
    float grad_i = g[i];
    if (decoupled)
      p[i] *= decay;
    else if (wd != 0)
      grad_i += wd * p[i];
    m[i] = m[i] * b1 + grad_i * c1;
    v[i] = v[i] * b2 + grad_i * grad_i * c2;
    const float denom = std::sqrt(v[i]) / bias2_sqrt + eps;
    p[i] -= step_size * (m[i] / denom);
  }
}

void add_sum_of_squares(Buffer grad, double& sum, const DeviceContext& ctx) {
  if (on_cuda(grad, "clip_grad_norm")) {
#if ACCEL_HAVE_CUDA_KERNELS
    sum += cuda::sum_of_squares(grad, ctx);
#else
    (void)ctx;
#endif
    return;
  }
  visit_dtype(grad.dtype, [&](auto element) {
    using T = decltype(element);
    const T* g = static_cast<const T*>(grad.data);
    double s = sum;  // a local: `sum` could alias an f64 gradient, which stops vectorising
    for (std::size_t i = 0; i < grad.count; ++i) {
      const double v = element_to_double(g[i]);
      s += v * v;
    }
    sum = s;
  });
}

void scale_in_place(Buffer grad, double factor, const DeviceContext& ctx) {
  if (on_cuda(grad, "clip_grad_norm")) {
#if ACCEL_HAVE_CUDA_KERNELS
    cuda::scale_in_place(grad, factor, ctx);
#else
    (void)ctx;
#endif
    return;
  }
  visit_dtype(grad.dtype, [&](auto element) {
    using T = decltype(element);
    T* g = static_cast<T*>(grad.data);
    for (std::size_t i = 0; i < grad.count; ++i)
      g[i] = element_from_double<T>(element_to_double(g[i]) * factor);
  });
}

bool unscale_gradients(std::span<const Buffer> grads, double scale, const DeviceContext& ctx) {
  const double inverse = 1.0 / scale;
  bool finite = true;
  std::vector<Buffer> on_gpu;
  for (const Buffer& g : grads) {
    check_floating(g, "fp16 loss scaling");
    if (on_cuda(g, "fp16 loss scaling")) {
      on_gpu.push_back(g);
      continue;
    }
    visit_dtype(g.dtype, [&](auto element) {
      using T = decltype(element);
      T* v = static_cast<T*>(g.data);
      bool buffer_finite = true;
      for (std::size_t i = 0; i < g.count && buffer_finite; ++i)
        buffer_finite = std::isfinite(element_to_double(v[i]));
      finite = finite && buffer_finite;
      if (!buffer_finite) return;
      for (std::size_t i = 0; i < g.count; ++i)
        v[i] = element_from_double<T>(element_to_double(v[i]) * inverse);
    });
  }
#if ACCEL_HAVE_CUDA_KERNELS
  if (!on_gpu.empty()) finite = cuda::unscale(on_gpu, inverse, ctx) && finite;
#else
  (void)ctx;
#endif
  return finite;
}

void weighted_sum(Buffer dst, std::span<const Buffer> sources, std::span<const double> weights,
                  double divide_by, const DeviceContext& ctx) {
  ACCEL_CHECK_ARG(weights.size() == sources.size() + 1,
                  "weighted_sum: " + std::to_string(weights.size()) + " weights for " +
                      std::to_string(sources.size() + 1) + " buffers");
  bool plain = divide_by == 1.0;
  for (double w : weights) plain = plain && w == 1.0;
  ACCEL_CHECK_ARG(plain || dst.dtype == DType::f32 || dst.dtype == DType::f64,
                  "weighted_sum: weighted gradient sums need f32 or f64, got " +
                      std::string(dtype_name(dst.dtype)));
  for (const Buffer& s : sources)
    ACCEL_CHECK_ARG(s.dtype == dst.dtype && s.count == dst.count && s.device == dst.device,
                    "weighted_sum: a source differs from the destination in dtype, size or "
                    "device");
  if (dst.count == 0) return;
  if (on_cuda(dst, "DataParallel's gradient sum")) {
#if ACCEL_HAVE_CUDA_KERNELS
    cuda::weighted_sum(dst, sources, weights, divide_by, plain, ctx);
#endif
    return;
  }
  if (plain) {  // the communicators' reduction kernels: dst[i] = dst[i] + src[i]
    for (const Buffer& s : sources)
      reduce_elements(dst.data, dst.data, s.data, dst.count, dst.dtype, ReduceOp::sum);
    return;
  }
  auto run = [&](auto* d) {
    using T = std::remove_pointer_t<decltype(d)>;
    for (std::size_t j = 0; j < dst.count; ++j) {
      double sum = weights[0] * double(d[j]);
      for (std::size_t k = 0; k < sources.size(); ++k)
        sum += weights[k + 1] * double(static_cast<const T*>(sources[k].data)[j]);
      d[j] = T(sum / divide_by);
    }
  };
  if (dst.dtype == DType::f32)
    run(static_cast<float*>(dst.data));
  else
    run(static_cast<double*>(dst.data));
}

void fill_zero(Buffer buffer, const DeviceContext& ctx) {
  if (buffer.data == nullptr || buffer.count == 0) return;
  zero_buffer(buffer, ctx.stream);  // memset, or cudaMemsetAsync on the stream
}

namespace {

MemoryKind memory_for(DeviceKind device) {
  return device == DeviceKind::cuda ? MemoryKind::cuda : MemoryKind::host;
}

int device_for(DeviceKind device, const DeviceContext& ctx) {
  if (device != DeviceKind::cuda) return -1;
  return ctx.cuda_device >= 0 ? ctx.cuda_device : current_cuda_device();
}

}  // namespace

StateArray::StateArray(std::size_t count, DeviceKind device, const DeviceContext& ctx)
    : buffer_(count, DType::f32, memory_for(device), device_for(device, ctx)) {
  // Zeroed again on the stream the kernels use: the allocation's memset runs on the legacy
  // default stream, which a non-blocking compute stream is not ordered after.
  if (device == DeviceKind::cuda) zero_buffer(buffer_.view(), ctx.stream);
}

void StateArray::read(float* host_out, const DeviceContext& ctx) const {
  const Buffer host{host_out, count(), DType::f32, DeviceKind::cpu};
  if (device() == DeviceKind::cuda)  // the bounded wait first: the copy then finds it idle
    synchronize_stream(ctx, "optimizer state: reading it from the GPU");
  copy_buffer(host, view(), ctx.stream);
}

void StateArray::write(const float* host_in, const DeviceContext& ctx) {
  copy_buffer(view(), Buffer{const_cast<float*>(host_in), count(), DType::f32, DeviceKind::cpu},
              ctx.stream);
}

StateArray StateArray::to(DeviceKind device, const DeviceContext& ctx) const {
  StateArray out(count(), device, ctx);
  if (device == DeviceKind::cpu && this->device() == DeviceKind::cuda)
    read(out.data(), ctx);
  else
    copy_buffer(out.view(), view(), ctx.stream);
  return out;
}

}  // namespace accel
