#pragma once
// Element types the communicators move and reduce, and the typed buffer view every
// strategy and communicator passes around (pointer + element count + dtype + device),
// so no interface ever takes a bare byte count.

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>

namespace accel {

enum class DType : std::uint8_t { f32, f64, f16, bf16, i32, i64 };

inline constexpr DType kAllDTypes[] = {DType::f32,  DType::f64, DType::f16,
                                       DType::bf16, DType::i32, DType::i64};

// Inline: every Buffer::bytes() asks, several times per collective.
constexpr std::size_t element_size(DType dtype) {
  switch (dtype) {
    case DType::f32:
    case DType::i32:
      return 4;
    case DType::f64:
    case DType::i64:
      return 8;
    case DType::f16:
    case DType::bf16:
      return 2;
  }
  return 0;
}
std::string_view dtype_name(DType dtype);  // "f32", "bf16", ...
DType parse_dtype(std::string_view name);  // throws InvalidArgument naming the value
bool is_floating(DType dtype);

// IEEE binary16 and bfloat16 stored as their bit patterns; arithmetic goes through float.
struct Half {
  std::uint16_t bits = 0;
};
struct BFloat16 {
  std::uint16_t bits = 0;
};
float to_float(Half h);
float to_float(BFloat16 b);
Half to_half(float f);      // round to nearest even
BFloat16 to_bf16(float f);  // round to nearest even

template <typename T>
constexpr DType dtype_of() {
  if constexpr (std::is_same_v<T, float>)
    return DType::f32;
  else if constexpr (std::is_same_v<T, double>)
    return DType::f64;
  else if constexpr (std::is_same_v<T, Half>)
    return DType::f16;
  else if constexpr (std::is_same_v<T, BFloat16>)
    return DType::bf16;
  else if constexpr (std::is_same_v<T, std::int32_t>)
    return DType::i32;
  else if constexpr (std::is_same_v<T, std::int64_t>)
    return DType::i64;
  else
    static_assert(sizeof(T) == 0, "unsupported element type");
}

// Calls fn(T{}) with the C++ element type of dtype (float, double, Half, BFloat16,
// std::int32_t, std::int64_t): the one switch over dtypes that typed code builds on.
template <typename Fn>
decltype(auto) visit_dtype(DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::f32:
      return fn(float{});
    case DType::f64:
      return fn(double{});
    case DType::f16:
      return fn(Half{});
    case DType::bf16:
      return fn(BFloat16{});
    case DType::i32:
      return fn(std::int32_t{});
    case DType::i64:
      return fn(std::int64_t{});
  }
  return fn(float{});  // unreachable: every enumerator is handled above
}

// Element conversions through double (rounding to nearest even for f16/bf16), for code that
// fills or checks buffers of any dtype: tests, benchmarks.
template <typename T>
T element_from_double(double v) {
  if constexpr (std::is_same_v<T, Half>)
    return to_half(float(v));
  else if constexpr (std::is_same_v<T, BFloat16>)
    return to_bf16(float(v));
  else
    return static_cast<T>(v);
}
template <typename T>
double element_to_double(T v) {
  if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>)
    return double(to_float(v));
  else
    return static_cast<double>(v);
}

enum class DeviceKind : std::uint8_t { cpu, cuda };

// A non-owning view of `count` elements of `dtype` at `data` on a device.
struct Buffer {
  void* data = nullptr;
  std::size_t count = 0;
  DType dtype = DType::f32;
  DeviceKind device = DeviceKind::cpu;

  std::size_t bytes() const { return count * element_size(dtype); }
  // Elements [offset, offset + n) of this buffer. Inline, its error out of line: every
  // collective takes slices on the path a small operation pays per call (bench/README, "The
  // issuing path's instruction cache").
  Buffer slice(std::size_t offset, std::size_t n) const {
    if (offset + n > count) [[unlikely]]
      throw_slice_outside(offset, n);
    return Buffer{static_cast<char*>(data) + offset * element_size(dtype), n, dtype, device};
  }

 private:
  [[noreturn]] void throw_slice_outside(std::size_t offset, std::size_t n) const;
};

// Whether two buffers share a byte (an empty buffer shares none).
inline bool overlaps(const Buffer& a, const Buffer& b) {
  if (a.count == 0 || b.count == 0) return false;
  const auto a0 = reinterpret_cast<std::uintptr_t>(a.data);
  const auto b0 = reinterpret_cast<std::uintptr_t>(b.data);
  return a0 < b0 + b.bytes() && b0 < a0 + a.bytes();
}

template <typename T>
Buffer buffer_of(std::span<T> s, DeviceKind device = DeviceKind::cpu) {
  return Buffer{const_cast<std::remove_const_t<T>*>(s.data()), s.size(),
                dtype_of<std::remove_const_t<T>>(), device};
}

}  // namespace accel
