#include "backends/optim/elementwise.hpp"

#include <cmath>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "backends/comm/error.hpp"

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

void sgd_update(Buffer values, Buffer grad, float* momentum_buffer, const SgdStepArgs& a) {
  check_update(values, grad, "SGD");
  float* p = static_cast<float*>(values.data);
  const float* g = static_cast<const float*>(grad.data);
  const std::size_t n = values.count;
  if (on_cuda(values, "SGD")) {
#if ACCEL_HAVE_CUDA_KERNELS
    cuda::sgd_update(p, g, momentum_buffer, n, a);
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

void adamw_update(Buffer values, Buffer grad, float* m, float* v, const AdamWStepArgs& a) {
  check_update(values, grad, "AdamW");
  float* p = static_cast<float*>(values.data);
  const float* g = static_cast<const float*>(grad.data);
  const std::size_t n = values.count;
  if (on_cuda(values, "AdamW")) {
#if ACCEL_HAVE_CUDA_KERNELS
    cuda::adamw_update(p, g, m, v, n, a);
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

void add_sum_of_squares(Buffer grad, double& sum) {
  if (on_cuda(grad, "clip_grad_norm")) {
#if ACCEL_HAVE_CUDA_KERNELS
    sum += cuda::sum_of_squares(grad);
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

void scale_in_place(Buffer grad, double factor) {
  if (on_cuda(grad, "clip_grad_norm")) {
#if ACCEL_HAVE_CUDA_KERNELS
    cuda::scale_in_place(grad, factor);
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

bool unscale_gradients(std::span<const Buffer> grads, double scale) {
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
  if (!on_gpu.empty()) finite = cuda::unscale(on_gpu, inverse) && finite;
#endif
  return finite;
}

void fill_zero(Buffer buffer) {
  if (buffer.data == nullptr || buffer.count == 0) return;
  if (on_cuda(buffer, "zeroing gradients")) {
#if ACCEL_HAVE_CUDA_KERNELS
    cuda::fill_zero(buffer.data, buffer.bytes());
#endif
    return;
  }
  std::memset(buffer.data, 0, buffer.bytes());
}

StateArray::StateArray(std::size_t count, DeviceKind device) : count_(count), device_(device) {
  if (on_cuda(Buffer{nullptr, count, DType::f32, device}, "optimizer state")) {
#if ACCEL_HAVE_CUDA_KERNELS
    data_ = static_cast<float*>(cuda::allocate_zeroed(count * sizeof(float)));
#endif
  } else {
    data_ = new float[count]();
  }
}

StateArray::~StateArray() { release(); }

void StateArray::release() {
  if (data_ == nullptr) return;
#if ACCEL_HAVE_CUDA_KERNELS
  if (device_ == DeviceKind::cuda) {
    cuda::free_device(data_);
    data_ = nullptr;
    return;
  }
#endif
  delete[] data_;
  data_ = nullptr;
}

StateArray::StateArray(StateArray&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      count_(std::exchange(other.count_, 0)),
      device_(other.device_) {}

StateArray& StateArray::operator=(StateArray&& other) noexcept {
  if (this != &other) {
    release();
    data_ = std::exchange(other.data_, nullptr);
    count_ = std::exchange(other.count_, 0);
    device_ = other.device_;
  }
  return *this;
}

void StateArray::read(float* host_out) const {
  const std::size_t bytes = count_ * sizeof(float);
  if (bytes == 0) return;
#if ACCEL_HAVE_CUDA_KERNELS
  if (device_ == DeviceKind::cuda) return cuda::copy_to_host(host_out, data_, bytes);
#endif
  std::memcpy(host_out, data_, bytes);
}

void StateArray::write(const float* host_in) {
  const std::size_t bytes = count_ * sizeof(float);
  if (bytes == 0) return;
#if ACCEL_HAVE_CUDA_KERNELS
  if (device_ == DeviceKind::cuda) return cuda::copy_to_device(data_, host_in, bytes);
#endif
  std::memcpy(data_, host_in, bytes);
}

StateArray StateArray::to(DeviceKind device) const {
  StateArray out(count_, device);
  if (device_ == DeviceKind::cpu) {
    out.write(data_);
  } else if (device == DeviceKind::cpu) {
    read(out.data_);
  } else {
#if ACCEL_HAVE_CUDA_KERNELS
    if (count_ > 0) cuda::copy_device_to_device(out.data_, data_, count_ * sizeof(float));
#endif
  }
  return out;
}

}  // namespace accel
