#pragma once
// Reading and writing one element of a Buffer as a double, for tests that check every dtype
// against a reference computed locally.

#include <cstdint>
#include <vector>

#include "foundation/dtype.hpp"

namespace accel::test {

inline void set_value(const Buffer& b, std::size_t i, double v) {
  visit_dtype(b.dtype, [&](auto element) {
    using T = decltype(element);
    static_cast<T*>(b.data)[i] = element_from_double<T>(v);
  });
}

inline double get_value(const Buffer& b, std::size_t i) {
  return visit_dtype(b.dtype, [&](auto element) {
    using T = decltype(element);
    return element_to_double(static_cast<const T*>(b.data)[i]);
  });
}

// Owns storage for `count` elements of `dtype` and views it as a Buffer.
struct OwnedBuffer {
  OwnedBuffer(DType dtype, std::size_t count)
      : storage((count * element_size(dtype) + 7) / 8 + 1), view{storage.data(), count, dtype} {}
  std::vector<std::uint64_t> storage;  // 8-byte aligned for every dtype
  Buffer view;
};

}  // namespace accel::test
