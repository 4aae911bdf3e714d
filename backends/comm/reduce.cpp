#include "backends/comm/reduce.hpp"

#include <algorithm>
#include <cstdint>
#include <string>

#include "backends/comm/error.hpp"

namespace accel {

std::string_view reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return "sum";
    case ReduceOp::avg: return "avg";
    case ReduceOp::min: return "min";
    case ReduceOp::max: return "max";
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
  static T apply(T a, T b) { return a + b; }
};
struct Min {
  template <typename T>
  static T apply(T a, T b) { return std::min(a, b); }
};
struct Max {
  template <typename T>
  static T apply(T a, T b) { return std::max(a, b); }
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
    if constexpr (std::is_same_v<T, Half>) o[i] = to_half(r);
    else o[i] = to_bf16(r);
  }
}

template <typename Op>
ReduceKernel kernel_for(DType dtype) {
  switch (dtype) {
    case DType::f32: return &kernel<float, Op>;
    case DType::f64: return &kernel<double, Op>;
    case DType::f16: return &kernel16<Half, Op>;
    case DType::bf16: return &kernel16<BFloat16, Op>;
    case DType::i32: return &kernel<std::int32_t, Op>;
    case DType::i64: return &kernel<std::int64_t, Op>;
  }
  return nullptr;
}

}  // namespace

ReduceKernel reduce_kernel(DType dtype, ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return kernel_for<Sum>(dtype);
    case ReduceOp::min: return kernel_for<Min>(dtype);
    case ReduceOp::max: return kernel_for<Max>(dtype);
    case ReduceOp::avg: break;
  }
  throw InvalidArgument("reduce_kernel: avg has no element kernel; reduce with sum and divide");
}

void reduce_elements(void* out, const void* a, const void* b, std::size_t count, DType dtype,
                     ReduceOp op) {
  reduce_kernel(dtype, op)(out, a, b, count);
}

void divide_elements(void* data, std::size_t count, DType dtype, int divisor) {
  switch (dtype) {
    case DType::f32: {
      auto* p = static_cast<float*>(data);
      for (std::size_t i = 0; i < count; ++i) p[i] /= float(divisor);
      return;
    }
    case DType::f64: {
      auto* p = static_cast<double*>(data);
      for (std::size_t i = 0; i < count; ++i) p[i] /= double(divisor);
      return;
    }
    case DType::f16: {
      auto* p = static_cast<Half*>(data);
      for (std::size_t i = 0; i < count; ++i) p[i] = to_half(to_float(p[i]) / float(divisor));
      return;
    }
    case DType::bf16: {
      auto* p = static_cast<BFloat16*>(data);
      for (std::size_t i = 0; i < count; ++i) p[i] = to_bf16(to_float(p[i]) / float(divisor));
      return;
    }
    case DType::i32: {
      auto* p = static_cast<std::int32_t*>(data);
      for (std::size_t i = 0; i < count; ++i) p[i] /= divisor;
      return;
    }
    case DType::i64: {
      auto* p = static_cast<std::int64_t*>(data);
      for (std::size_t i = 0; i < count; ++i) p[i] /= divisor;
      return;
    }
  }
}

Shard shard_of(std::size_t total, int world, int rank) {
  ACCEL_CHECK_ARG(world > 0 && rank >= 0 && rank < world,
                  "shard_of: rank " + std::to_string(rank) + " outside world " +
                      std::to_string(world));
  const std::size_t w = std::size_t(world), r = std::size_t(rank);
  const std::size_t base = total / w, extra = total % w;
  return Shard{r * base + std::min(r, extra), base + (r < extra ? 1 : 0)};
}

}  // namespace accel
