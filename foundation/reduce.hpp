#pragma once
// Reduction operators and the element-wise kernels the CPU communicators share, plus the
// one rule for splitting a flat buffer across ranks (used by all_gather, reduce_scatter
// and, later, ZeRO's parameter shards).

#include <cstddef>
#include <string_view>

#include "foundation/dtype.hpp"

namespace accel {

// AVG is SUM followed by division by the world size (integer division for integer
// dtypes, truncating toward zero).
enum class ReduceOp : std::uint8_t { sum, avg, min, max };

inline constexpr ReduceOp kAllReduceOps[] = {ReduceOp::sum, ReduceOp::avg, ReduceOp::min,
                                             ReduceOp::max};

std::string_view reduce_op_name(ReduceOp op);
ReduceOp parse_reduce_op(std::string_view name);

// The op to run on the wire: AVG travels as SUM and is divided afterwards.
inline ReduceOp wire_op(ReduceOp op) { return op == ReduceOp::avg ? ReduceOp::sum : op; }

// out[i] = a[i] (op) b[i] for i < count; out may alias a or b. f16/bf16 go through float.
// op must not be avg (use wire_op).
void reduce_elements(void* out, const void* a, const void* b, std::size_t count, DType dtype,
                     ReduceOp op);

// A raw kernel of the shape Gloo and MPI user ops want.
using ReduceKernel = void (*)(void* out, const void* a, const void* b, std::size_t count);
ReduceKernel reduce_kernel(DType dtype, ReduceOp op);

// data[i] /= divisor, in the dtype's own arithmetic.
void divide_elements(void* data, std::size_t count, DType dtype, int divisor);

// How a flat buffer of `total` elements is split over `world` ranks: every rank gets
// total / world elements and the first total % world ranks one more, in rank order.
struct Shard {
  std::size_t offset = 0;
  std::size_t count = 0;
};
// Inline, its error out of line: an all_gather or reduce_scatter in even parts asks it on every
// call (bench/journal/2026-12-06, "The issuing path's instruction cache").
[[noreturn]] void throw_shard_outside(int world, int rank);
inline Shard shard_of(std::size_t total, int world, int rank) {
  if (world <= 0 || rank < 0 || rank >= world) [[unlikely]]
    throw_shard_outside(world, rank);
  const std::size_t w = std::size_t(world), r = std::size_t(rank);
  const std::size_t base = total / w, extra = total % w;
  return Shard{r * base + (r < extra ? r : extra), base + (r < extra ? 1 : 0)};
}

}  // namespace accel
