#include "accelerate/torch/autocast.hpp"

#include <ATen/autocast_mode.h>

namespace accel {

// What torch.autocast(device) does on entering and leaving. LibTorch keeps one switch and one
// dtype per device kind ("gpu" meaning CUDA).
AutocastGuard::AutocastGuard(bool enabled, c10::DeviceType device, c10::ScalarType dtype)
    : enabled_(enabled), cuda_(device == c10::DeviceType::CUDA) {
  if (!enabled_) return;
  if (cuda_) {
    previous_enabled_ = at::autocast::is_enabled();
    previous_dtype_ = at::autocast::get_autocast_gpu_dtype();
    at::autocast::set_enabled(true);
    at::autocast::set_autocast_gpu_dtype(dtype);
  } else {
    previous_enabled_ = at::autocast::is_cpu_enabled();
    previous_dtype_ = at::autocast::get_autocast_cpu_dtype();
    at::autocast::set_cpu_enabled(true);
    at::autocast::set_autocast_cpu_dtype(dtype);
  }
  at::autocast::increment_nesting();
}

AutocastGuard::~AutocastGuard() {
  if (!enabled_) return;
  // The cast weights are cached while any autocast region is open; the last one frees them.
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  if (cuda_) {
    at::autocast::set_enabled(previous_enabled_);
    at::autocast::set_autocast_gpu_dtype(previous_dtype_);
  } else {
    at::autocast::set_cpu_enabled(previous_enabled_);
    at::autocast::set_autocast_cpu_dtype(previous_dtype_);
  }
}

CpuAutocastAs::CpuAutocastAs(bool enabled, c10::ScalarType dtype)
    : was_(at::autocast::is_cpu_enabled()), was_type_(at::autocast::get_autocast_cpu_dtype()) {
  at::autocast::set_cpu_enabled(enabled);
  at::autocast::set_autocast_cpu_dtype(dtype);
}

CpuAutocastAs::~CpuAutocastAs() {
  at::autocast::set_cpu_enabled(was_);
  at::autocast::set_autocast_cpu_dtype(was_type_);
}

NoCpuAutocast::NoCpuAutocast() : was_(at::autocast::is_cpu_enabled()) {
  at::autocast::set_cpu_enabled(false);
}

NoCpuAutocast::~NoCpuAutocast() { at::autocast::set_cpu_enabled(was_); }

}  // namespace accel
