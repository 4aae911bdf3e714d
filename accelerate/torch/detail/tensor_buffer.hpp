#pragma once
// LibTorch tensors seen as the core's typed buffer views (no copies).

#include <optional>
#include <string>

#include <ATen/Tensor.h>

#include "foundation/dtype.hpp"
#include "foundation/error.hpp"

namespace accel {

// The DType of a scalar type the communicators can move, or nothing (bool, uint8, ...).
inline std::optional<DType> to_dtype(c10::ScalarType type) {
  switch (type) {
    case c10::ScalarType::Float:
      return DType::f32;
    case c10::ScalarType::Double:
      return DType::f64;
    case c10::ScalarType::Half:
      return DType::f16;
    case c10::ScalarType::BFloat16:
      return DType::bf16;
    case c10::ScalarType::Int:
      return DType::i32;
    case c10::ScalarType::Long:
      return DType::i64;
    default:
      return std::nullopt;
  }
}

// A view of a contiguous tensor's elements; `what` names it in errors.
inline Buffer tensor_buffer(const at::Tensor& t, const std::string& what) {
  const std::optional<DType> dtype = to_dtype(t.scalar_type());
  ACCEL_CHECK_ARG(dtype.has_value(), what + ": element type " +
                                         std::string(c10::toString(t.scalar_type())) +
                                         " cannot be communicated (use float, double, half, "
                                         "bfloat16, int or long)");
  ACCEL_CHECK_ARG(t.is_contiguous(), what + ": the tensor must be contiguous");
  return Buffer{t.data_ptr(), std::size_t(t.numel()), *dtype,
                t.is_cuda() ? DeviceKind::cuda : DeviceKind::cpu};
}

}  // namespace accel
