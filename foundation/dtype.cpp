#include "foundation/dtype.hpp"

#include <bit>
#include <cmath>
#include <cstring>

#include "foundation/error.hpp"

namespace accel {

std::string_view dtype_name(DType dtype) {
  switch (dtype) {
    case DType::f32:
      return "f32";
    case DType::f64:
      return "f64";
    case DType::f16:
      return "f16";
    case DType::bf16:
      return "bf16";
    case DType::i32:
      return "i32";
    case DType::i64:
      return "i64";
  }
  return "?";
}

DType parse_dtype(std::string_view name) {
  for (DType d : kAllDTypes)
    if (dtype_name(d) == name) return d;
  throw InvalidArgument("unknown dtype '" + std::string(name) +
                        "' (expected f32, f64, f16, bf16, i32 or i64)");
}

bool is_floating(DType dtype) { return dtype != DType::i32 && dtype != DType::i64; }

void Buffer::throw_slice_outside(std::size_t offset, std::size_t n) const {
  throw InvalidArgument(with_location("slice [" + std::to_string(offset) + ", " +
                                          std::to_string(offset + n) + ") outside a buffer of " +
                                          std::to_string(count) + " elements",
                                      __FILE__, __LINE__));
}

float to_float(BFloat16 b) { return std::bit_cast<float>(std::uint32_t(b.bits) << 16); }

BFloat16 to_bf16(float f) {
  std::uint32_t u = std::bit_cast<std::uint32_t>(f);
  if ((u & 0x7fffffffu) > 0x7f800000u)
    return BFloat16{std::uint16_t((u >> 16) | 0x40)};  // NaN stays NaN
  u += 0x7fffu + ((u >> 16) & 1u);                     // round to nearest even
  return BFloat16{std::uint16_t(u >> 16)};
}

float to_float(Half h) {
  const std::uint32_t sign = std::uint32_t(h.bits & 0x8000u) << 16;
  std::uint32_t exp = (h.bits >> 10) & 0x1fu;
  std::uint32_t man = h.bits & 0x3ffu;
  std::uint32_t out;
  if (exp == 0x1f) {
    out = sign | 0x7f800000u | (man << 13);  // inf / NaN
  } else if (exp != 0) {
    out = sign | ((exp + 112) << 23) | (man << 13);
  } else if (man == 0) {
    out = sign;  // signed zero
  } else {
    // Subnormal half: normalise into a float.
    exp = 113;
    while ((man & 0x400u) == 0) {
      man <<= 1;
      --exp;
    }
    out = sign | (exp << 23) | ((man & 0x3ffu) << 13);
  }
  return std::bit_cast<float>(out);
}

Half to_half(float f) {
  const std::uint32_t u = std::bit_cast<std::uint32_t>(f);
  const std::uint16_t sign = std::uint16_t((u >> 16) & 0x8000u);
  const std::uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return Half{std::uint16_t(sign | 0x7e00u)};   // NaN
  if (abs >= 0x477ff000u) return Half{std::uint16_t(sign | 0x7c00u)};  // overflow -> inf
  if (abs < 0x38800000u) {
    // Result is subnormal (or zero): scale so the integer part holds the mantissa.
    const float scaled = std::bit_cast<float>(abs) * 16777216.0f;  // 2^24
    // Round to nearest even through the FPU's default rounding.
    const float r = std::nearbyint(scaled);
    return Half{std::uint16_t(sign | std::uint16_t(r))};
  }
  std::uint32_t rounded = abs + 0xfffu + ((abs >> 13) & 1u);
  return Half{std::uint16_t(sign | ((rounded - 0x38000000u) >> 13))};
}

}  // namespace accel
