#pragma once
// Mixed precision for LibTorch forward passes: while an AutocastGuard lives, eligible ops
// (matmul, conv, linear ...) run in the reduced dtype, the way `with torch.autocast(...)` does.
// Parameters, gradients and the optimizer stay in fp32.

#include <c10/core/ScalarType.h>

namespace accel {

class AutocastGuard {
 public:
  // Enables CPU autocast with `dtype` (bf16) when `enabled`; otherwise does nothing. The
  // previous state is restored on destruction, so guards nest.
  AutocastGuard(bool enabled, c10::ScalarType dtype);
  ~AutocastGuard();
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

  bool enabled() const { return enabled_; }

 private:
  bool enabled_;
  bool previous_enabled_ = false;
  c10::ScalarType previous_dtype_ = c10::ScalarType::BFloat16;
};

}  // namespace accel
