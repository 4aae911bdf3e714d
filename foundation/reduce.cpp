#include "foundation/reduce.hpp"

#include <algorithm>
#include <bit>
#include <cstdint>
#include <string>

#include "foundation/error.hpp"

namespace accel {

std::string_view reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
      return "sum";
    case ReduceOp::avg:
      return "avg";
    case ReduceOp::min:
      return "min";
    case ReduceOp::max:
      return "max";
  }
  return "?";
}

ReduceOp parse_reduce_op(std::string_view name) {
  for (ReduceOp op : kAllReduceOps)
    if (reduce_op_name(op) == name) return op;
  throw InvalidArgument("unknown reduce op '" + std::string(name) +
                        "' (expected sum, avg, min or max)");
}

namespace {

struct Sum {
  template <typename T>
  static T apply(T a, T b) {
    return a + b;
  }
};
struct Min {
  template <typename T>
  static T apply(T a, T b) {
    return std::min(a, b);
  }
};
struct Max {
  template <typename T>
  static T apply(T a, T b) {
    return std::max(a, b);
  }
};

// Native types: a plain loop the compiler vectorises.
template <typename T, typename Op>
void kernel(void* out, const void* a, const void* b, std::size_t n) {
  T* o = static_cast<T*>(out);
  const T* x = static_cast<const T*>(a);
  const T* y = static_cast<const T*>(b);
  for (std::size_t i = 0; i < n; ++i) o[i] = Op::apply(x[i], y[i]);
}

// 16-bit floats: widen to float, reduce, round back.
template <typename T, typename Op>
void kernel16(void* out, const void* a, const void* b, std::size_t n) {
  T* o = static_cast<T*>(out);
  const T* x = static_cast<const T*>(a);
  const T* y = static_cast<const T*>(b);
  for (std::size_t i = 0; i < n; ++i) {
    const float r = Op::apply(to_float(x[i]), to_float(y[i]));
    if constexpr (std::is_same_v<T, Half>)
      o[i] = to_half(r);
    else
      o[i] = to_bf16(r);
  }
}

template <typename Op>
ReduceKernel kernel_for(DType dtype) {
  return visit_dtype(dtype, [](auto element) -> ReduceKernel {
    using T = decltype(element);
    if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>)
      return &kernel16<T, Op>;
    else
      return &kernel<T, Op>;
  });
}

}  // namespace

ReduceKernel reduce_kernel(DType dtype, ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
      return kernel_for<Sum>(dtype);
    case ReduceOp::min:
      return kernel_for<Min>(dtype);
    case ReduceOp::max:
      return kernel_for<Max>(dtype);
    case ReduceOp::avg:
      break;
  }
  throw InvalidArgument("reduce_kernel: avg has no element kernel; reduce with sum and divide");
}

void reduce_elements(void* out, const void* a, const void* b, std::size_t count, DType dtype,
                     ReduceOp op) {
  reduce_kernel(dtype, op)(out, a, b, count);
}

void divide_elements(void* data, std::size_t count, DType dtype, int divisor) {
  // Dividing a float by a power of two and multiplying it by the (exact) reciprocal round the
  // same real number, so they give the same bits, and a vector multiply issues several times
  // as fast as a vector divide. Worlds of 2, 4, 8 ... average this way (dtype_test checks the
  // bits against division).
  const bool power_of_two = divisor > 0 && std::has_single_bit(unsigned(divisor));
  visit_dtype(dtype, [&](auto element) {
    using T = decltype(element);
    T* p = static_cast<T*>(data);
    if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>) {
      const float d = float(divisor), inverse = 1.0f / d;
      if (power_of_two)
        for (std::size_t i = 0; i < count; ++i)
          p[i] = element_from_double<T>(to_float(p[i]) * inverse);
      else
        for (std::size_t i = 0; i < count; ++i) p[i] = element_from_double<T>(to_float(p[i]) / d);
    } else if constexpr (std::is_floating_point_v<T>) {
      const T d = static_cast<T>(divisor), inverse = T(1) / d;
      if (power_of_two)
        for (std::size_t i = 0; i < count; ++i) p[i] *= inverse;
      else
        for (std::size_t i = 0; i < count; ++i) p[i] /= d;
    } else {
      // Integer dtypes divide in integers (truncating toward zero).
      for (std::size_t i = 0; i < count; ++i) p[i] /= static_cast<T>(divisor);
    }
  });
}

void throw_shard_outside(int world, int rank) {
  throw InvalidArgument(with_location(
      "shard_of: rank " + std::to_string(rank) + " outside world " + std::to_string(world),
      __FILE__, __LINE__));
}

}  // namespace accel
