#pragma once
// Mixed precision for LibTorch forward passes: while an AutocastGuard lives, eligible ops
// (matmul, conv, linear ...) run in the reduced dtype, the way `with torch.autocast(...)` does:
// bf16 on the CPU, fp16 or bf16 on CUDA. Parameters, gradients and the optimizer stay in fp32.

#include <type_traits>

#include <ATen/Tensor.h>
#include <c10/core/DeviceType.h>
#include <c10/core/ScalarType.h>

namespace accel {

// The autocast a prepared model's forward runs under (the accelerator's mixed_precision).
struct AutocastSettings {
  bool enabled = false;
  c10::DeviceType device = c10::DeviceType::CPU;
  c10::ScalarType dtype = c10::ScalarType::BFloat16;
};

class AutocastGuard {
 public:
  explicit AutocastGuard(const AutocastSettings& s) : AutocastGuard(s.enabled, s.device, s.dtype) {}
  // Enables autocast for `device` (kCPU or kCUDA) with `dtype` when `enabled`; otherwise does
  // nothing. The previous state is restored on destruction, so guards nest.
  AutocastGuard(bool enabled, c10::DeviceType device, c10::ScalarType dtype);
  ~AutocastGuard();
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

  bool enabled() const { return enabled_; }

 private:
  bool enabled_;
  bool cuda_ = false;
  bool previous_enabled_ = false;
  c10::ScalarType previous_dtype_ = c10::ScalarType::BFloat16;
};

// Sets the CPU autocast state for a scope and restores the previous one after it: a replica's
// worker thread takes its caller's (autocast is per thread), activation checkpointing's
// recompute the forward's (backward runs with it off).
class CpuAutocastAs {
 public:
  CpuAutocastAs(bool enabled, c10::ScalarType dtype);
  ~CpuAutocastAs();
  CpuAutocastAs(const CpuAutocastAs&) = delete;
  CpuAutocastAs& operator=(const CpuAutocastAs&) = delete;

 private:
  bool was_;
  c10::ScalarType was_type_;
};

// Turns CPU autocast off for the rest of a scope: backward ops already run in the types their
// forward ops chose, and autocasting inside backward would only cast again.
class NoCpuAutocast {
 public:
  NoCpuAutocast();
  ~NoCpuAutocast();
  NoCpuAutocast(const NoCpuAutocast&) = delete;
  NoCpuAutocast& operator=(const NoCpuAutocast&) = delete;

 private:
  bool was_;
};

namespace detail {
// Accelerate's convert_outputs_to_fp32: a forward under autocast hands the loop fp32 outputs,
// so the loss and everything after it run as in the fp32 loop.
template <typename Out>
Out outputs_to_fp32(Out out) {
  if constexpr (std::is_same_v<std::remove_cvref_t<Out>, at::Tensor>)
    if (out.defined() && (out.scalar_type() == at::kBFloat16 || out.scalar_type() == at::kHalf))
      return out.to(at::kFloat);
  return out;
}
}  // namespace detail

}  // namespace accel
