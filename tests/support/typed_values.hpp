#pragma once
// Reading and writing one element of a Buffer as a double, for tests that check every dtype
// against a reference computed locally.

#include <cstdint>
#include <vector>

#include "backends/comm/dtype.hpp"

namespace accel::test {

inline void set_value(const Buffer& b, std::size_t i, double v) {
  switch (b.dtype) {
    case DType::f32: static_cast<float*>(b.data)[i] = float(v); return;
    case DType::f64: static_cast<double*>(b.data)[i] = v; return;
    case DType::f16: static_cast<Half*>(b.data)[i] = to_half(float(v)); return;
    case DType::bf16: static_cast<BFloat16*>(b.data)[i] = to_bf16(float(v)); return;
    case DType::i32: static_cast<std::int32_t*>(b.data)[i] = std::int32_t(v); return;
    case DType::i64: static_cast<std::int64_t*>(b.data)[i] = std::int64_t(v); return;
  }
}

inline double get_value(const Buffer& b, std::size_t i) {
  switch (b.dtype) {
    case DType::f32: return static_cast<const float*>(b.data)[i];
    case DType::f64: return static_cast<const double*>(b.data)[i];
    case DType::f16: return to_float(static_cast<const Half*>(b.data)[i]);
    case DType::bf16: return to_float(static_cast<const BFloat16*>(b.data)[i]);
    case DType::i32: return double(static_cast<const std::int32_t*>(b.data)[i]);
    case DType::i64: return double(static_cast<const std::int64_t*>(b.data)[i]);
  }
  return 0;
}

// Owns storage for `count` elements of `dtype` and views it as a Buffer.
struct OwnedBuffer {
  OwnedBuffer(DType dtype, std::size_t count)
      : storage((count * element_size(dtype) + 7) / 8 + 1), view{storage.data(), count, dtype} {}
  std::vector<std::uint64_t> storage;  // 8-byte aligned for every dtype
  Buffer view;
};

}  // namespace accel::test
