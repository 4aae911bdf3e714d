// dtypes and the element kernels: 16-bit float conversions (exhaustively over every bit
// pattern, plus the rounding and range edges), the shard split (shard_of, and the
// communicators' Parts built on it), reduce_elements for every dtype and op, and the name
// parsers' errors.

#include <doctest/doctest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "backends/comm/parts.hpp"
#include "foundation/dtype.hpp"
#include "foundation/error.hpp"
#include "foundation/reduce.hpp"

namespace accel {
namespace {

float bits_to_float(std::uint32_t u) { return std::bit_cast<float>(u); }

TEST_CASE("half: every bit pattern survives half -> float -> half") {
  for (std::uint32_t b = 0; b <= 0xffff; ++b) {
    const Half h{std::uint16_t(b)};
    const float f = to_float(h);
    const bool is_nan = ((b >> 10) & 0x1f) == 0x1f && (b & 0x3ff) != 0;
    if (is_nan) {
      REQUIRE(std::isnan(f));
      REQUIRE(std::isnan(to_float(to_half(f))));
    } else {
      REQUIRE(to_half(f).bits == b);
    }
  }
}

TEST_CASE("half: known values, range edges and round-to-nearest-even") {
  CHECK(to_half(1.0f).bits == 0x3c00);
  CHECK(to_half(-2.0f).bits == 0xc000);
  CHECK(to_half(0.0f).bits == 0x0000);
  CHECK(to_half(-0.0f).bits == 0x8000);
  CHECK(to_half(65504.0f).bits == 0x7bff);  // largest finite
  CHECK(to_float(Half{0x7bff}) == 65504.0f);
  // 65520 is exactly halfway between 65504 and 65536 (= inf): ties go to even, i.e. inf.
  CHECK(to_half(65520.0f).bits == 0x7c00);
  CHECK(to_half(65519.0f).bits == 0x7bff);
  CHECK(to_half(1e9f).bits == 0x7c00);
  CHECK(to_half(-1e9f).bits == 0xfc00);
  CHECK(to_half(std::numeric_limits<float>::infinity()).bits == 0x7c00);
  CHECK(to_half(-std::numeric_limits<float>::infinity()).bits == 0xfc00);
  CHECK(std::isinf(to_float(Half{0x7c00})));
  CHECK(std::isnan(to_float(to_half(std::numeric_limits<float>::quiet_NaN()))));

  // Subnormals: the smallest is 2^-24, the largest 1023 * 2^-24; 2^-14 is the smallest normal.
  CHECK(to_half(std::ldexp(1.0f, -24)).bits == 0x0001);
  CHECK(to_float(Half{0x0001}) == std::ldexp(1.0f, -24));
  CHECK(to_float(Half{0x03ff}) == std::ldexp(1023.0f, -24));
  CHECK(to_half(std::ldexp(1.0f, -14)).bits == 0x0400);
  CHECK(to_half(-std::ldexp(1.0f, -24)).bits == 0x8001);
  // Half of the smallest subnormal ties to even (0); 1.5 and 2.5 units round to 2.
  CHECK(to_half(std::ldexp(1.0f, -25)).bits == 0x0000);
  CHECK(to_half(std::ldexp(3.0f, -25)).bits == 0x0002);
  CHECK(to_half(std::ldexp(5.0f, -25)).bits == 0x0002);
  CHECK(to_half(std::ldexp(1.0f, -30)).bits == 0x0000);  // underflow to zero

  // Normal range: 1 + 2^-11 is halfway between 1 and the next half (1 + 2^-10).
  CHECK(to_half(1.0f + std::ldexp(1.0f, -11)).bits == 0x3c00);  // tie -> even
  CHECK(to_half(1.0f + std::ldexp(3.0f, -11)).bits == 0x3c02);  // tie -> even (up)
  CHECK(to_half(1.0f + std::ldexp(1.0f, -11) + std::ldexp(1.0f, -20)).bits == 0x3c01);
  // Rounding that carries into the exponent: just below 2 rounds up to 2.
  CHECK(to_half(2.0f - std::ldexp(1.0f, -12)).bits == 0x4000);
}

TEST_CASE("bf16: every bit pattern survives bf16 -> float -> bf16") {
  for (std::uint32_t b = 0; b <= 0xffff; ++b) {
    const BFloat16 v{std::uint16_t(b)};
    const float f = to_float(v);
    REQUIRE(std::bit_cast<std::uint32_t>(f) == b << 16);
    if (std::isnan(f)) {
      REQUIRE(std::isnan(to_float(to_bf16(f))));
    } else {
      REQUIRE(to_bf16(f).bits == b);  // includes the float subnormals bf16 can hold
    }
  }
}

TEST_CASE("bf16: known values, range edges and round-to-nearest-even") {
  CHECK(to_bf16(1.0f).bits == 0x3f80);
  CHECK(to_bf16(-0.0f).bits == 0x8000);
  CHECK(to_bf16(1.0f + std::ldexp(1.0f, -8)).bits == 0x3f80);  // tie -> even (down)
  CHECK(to_bf16(1.0f + std::ldexp(3.0f, -8)).bits == 0x3f82);  // tie -> even (up)
  CHECK(to_bf16(1.0f + std::ldexp(1.0f, -8) + std::ldexp(1.0f, -20)).bits == 0x3f81);
  CHECK(to_bf16(std::numeric_limits<float>::max()).bits == 0x7f80);  // rounds past the top: inf
  CHECK(to_bf16(std::numeric_limits<float>::infinity()).bits == 0x7f80);
  CHECK(to_bf16(-std::numeric_limits<float>::infinity()).bits == 0xff80);
  // A NaN whose payload sits only in the low bits must not truncate to infinity.
  const float low_payload_nan = bits_to_float(0x7f800001u);
  REQUIRE(std::isnan(low_payload_nan));
  CHECK(std::isnan(to_float(to_bf16(low_payload_nan))));
  // Float subnormals: the smallest bf16 subnormal and a tie below it.
  CHECK(to_bf16(bits_to_float(0x00010000u)).bits == 0x0001);
  CHECK(to_bf16(bits_to_float(0x00008000u)).bits == 0x0000);  // tie -> even (zero)
  CHECK(to_bf16(bits_to_float(0x00018000u)).bits == 0x0002);  // tie -> even (up)
}

TEST_CASE("dtype names, sizes and parse errors") {
  for (DType d : kAllDTypes) CHECK(parse_dtype(dtype_name(d)) == d);
  CHECK(element_size(DType::f16) == 2);
  CHECK(element_size(DType::bf16) == 2);
  CHECK(element_size(DType::f64) == 8);
  CHECK(element_size(DType::i32) == 4);
  CHECK(is_floating(DType::bf16));
  CHECK_FALSE(is_floating(DType::i64));
  try {
    parse_dtype("float");
    FAIL("parse_dtype accepted 'float'");
  } catch (const InvalidArgument& e) {
    CHECK(std::string(e.what()).find("'float'") != std::string::npos);
  }
  CHECK_THROWS_AS(parse_dtype(""), InvalidArgument);
  for (ReduceOp op : kAllReduceOps) CHECK(parse_reduce_op(reduce_op_name(op)) == op);
  CHECK_THROWS_AS(parse_reduce_op("prod"), InvalidArgument);
}

TEST_CASE("overlaps: buffers sharing a byte, by their byte extents; empty ones share none") {
  std::vector<double> storage(16);
  const Buffer whole{storage.data(), storage.size(), DType::f64};
  CHECK(overlaps(whole, whole));
  CHECK(overlaps(whole.slice(0, 4), whole.slice(3, 4)));
  CHECK(overlaps(whole.slice(3, 4), whole.slice(0, 4)));
  CHECK_FALSE(overlaps(whole.slice(0, 4), whole.slice(4, 4)));  // adjacent
  CHECK_FALSE(overlaps(whole.slice(4, 4), whole.slice(0, 4)));
  CHECK_FALSE(overlaps(whole.slice(2, 0), whole));  // empty
  // The extents are in bytes: 4 f64 from element 0 reach into the float view's 8th element.
  const Buffer as_float{storage.data(), 32, DType::f32};
  CHECK(overlaps(whole.slice(0, 4), as_float.slice(7, 1)));
  CHECK_FALSE(overlaps(whole.slice(0, 4), as_float.slice(8, 1)));
  // A slice past the end names the range asked for and the buffer's size.
  CHECK(whole.slice(12, 4).count == 4);
  CHECK_THROWS_WITH_AS(whole.slice(13, 4),
                       doctest::Contains("slice [13, 17) outside a buffer of 16 elements"),
                       InvalidArgument);
}

TEST_CASE("shard_of: shards tile the buffer in rank order and differ by at most one") {
  for (std::size_t total : {0u, 1u, 2u, 7u, 10u, 64u, 1001u}) {
    for (int world = 1; world <= 9; ++world) {
      std::size_t sum = 0, next_offset = 0, smallest = total, largest = 0;
      for (int rank = 0; rank < world; ++rank) {
        const Shard s = shard_of(total, world, rank);
        CHECK(s.offset == next_offset);
        next_offset = s.offset + s.count;
        sum += s.count;
        smallest = std::min(smallest, s.count);
        largest = std::max(largest, s.count);
        // The first total % world ranks carry the extra element.
        CHECK(s.count == total / world + (std::size_t(rank) < total % world ? 1 : 0));
      }
      CHECK(sum == total);
      CHECK(largest - smallest <= 1);
    }
  }
  CHECK_THROWS_WITH_AS(shard_of(10, 4, 4), doctest::Contains("shard_of: rank 4 outside world 4"),
                       InvalidArgument);
  CHECK_THROWS_AS(shard_of(10, 4, -1), InvalidArgument);
  CHECK_THROWS_AS(shard_of(10, 0, 0), InvalidArgument);
}

TEST_CASE("Parts: the even split is shard_of's, computed; chosen parts are kept as given") {
  for (std::size_t total : {0u, 1u, 7u, 64u, 1001u}) {
    for (int world = 1; world <= 5; ++world) {
      const Parts parts = Parts::even(total, world);
      REQUIRE(parts.size() == std::size_t(world));
      std::size_t largest = 0, r = 0;
      std::vector<std::size_t> counts;
      for (const Shard s : parts) {  // iteration and indexing agree with shard_of
        const Shard expected = shard_of(total, world, int(r));
        CHECK(s.offset == expected.offset);
        CHECK(s.count == expected.count);
        CHECK(parts[r].offset == expected.offset);
        largest = std::max(largest, s.count);
        counts.push_back(s.count);
        ++r;
      }
      CHECK(r == std::size_t(world));
      CHECK(parts.largest() == largest);
      CHECK(parts.counts() == counts);
      CHECK(parts.equal() == (total % std::size_t(world) == 0));
    }
  }
  const Parts chosen(std::vector<Shard>{{0, 3}, {3, 0}, {3, 5}});
  CHECK(chosen.size() == 3);
  CHECK(chosen[2].offset == 3);
  CHECK(chosen.largest() == 5);
  CHECK(chosen.counts() == std::vector<std::size_t>{3, 0, 5});
  CHECK_FALSE(chosen.equal());
  CHECK(Parts(std::vector<Shard>{{0, 4}, {4, 4}}).equal());
}

// Values every dtype holds exactly, so one expectation serves all six.
const std::vector<double> kA = {1, -2, 3, 0, 100, -7};
const std::vector<double> kB = {4, -5, 1, 0, -100, -7};

double expected(ReduceOp op, double a, double b) {
  switch (op) {
    case ReduceOp::sum:
      return a + b;
    case ReduceOp::min:
      return std::min(a, b);
    case ReduceOp::max:
      return std::max(a, b);
    case ReduceOp::avg:
      break;
  }
  return 0;
}

template <typename T>
void check_reduce() {
  const DType dtype = dtype_of<T>();
  for (ReduceOp op : {ReduceOp::sum, ReduceOp::min, ReduceOp::max}) {
    INFO("dtype ", std::string(dtype_name(dtype)), ", op ", std::string(reduce_op_name(op)));
    std::vector<T> a, b, out(kA.size());
    for (double v : kA) a.push_back(element_from_double<T>(v));
    for (double v : kB) b.push_back(element_from_double<T>(v));
    reduce_elements(out.data(), a.data(), b.data(), a.size(), dtype, op);
    for (std::size_t i = 0; i < kA.size(); ++i)
      CHECK(element_to_double(out[i]) == expected(op, kA[i], kB[i]));
    // In place (out aliases a), as the ring algorithms use it.
    reduce_elements(a.data(), a.data(), b.data(), a.size(), dtype, op);
    for (std::size_t i = 0; i < kA.size(); ++i)
      CHECK(element_to_double(a[i]) == expected(op, kA[i], kB[i]));
  }
  std::vector<T> x(2);
  CHECK_THROWS_AS(reduce_elements(x.data(), x.data(), x.data(), 1, dtype, ReduceOp::avg),
                  InvalidArgument);
  CHECK(wire_op(ReduceOp::avg) == ReduceOp::sum);
}

TEST_CASE("reduce_elements: sum, min and max for every dtype; avg has no kernel") {
  check_reduce<float>();
  check_reduce<double>();
  check_reduce<Half>();
  check_reduce<BFloat16>();
  check_reduce<std::int32_t>();
  check_reduce<std::int64_t>();
}

TEST_CASE("reduce_elements: 16-bit sums round to nearest even") {
  // 2048 + 1 is not a half: the sum ties between 2048 and 2050 and rounds to even (2048).
  std::vector<Half> a = {to_half(2048.0f)}, b = {to_half(1.0f)}, out(1);
  reduce_elements(out.data(), a.data(), b.data(), 1, DType::f16, ReduceOp::sum);
  CHECK(to_float(out[0]) == 2048.0f);
  std::vector<BFloat16> c = {to_bf16(256.0f)}, d = {to_bf16(1.0f)}, out2(1);
  reduce_elements(out2.data(), c.data(), d.data(), 1, DType::bf16, ReduceOp::sum);
  CHECK(to_float(out2[0]) == 256.0f);
}

TEST_CASE("divide_elements: the avg step in each dtype's arithmetic") {
  std::vector<float> f = {3.0f, -9.0f};
  divide_elements(f.data(), f.size(), DType::f32, 2);
  CHECK(f[0] == 1.5f);
  CHECK(f[1] == -4.5f);
  std::vector<std::int32_t> i = {7, -7};
  divide_elements(i.data(), i.size(), DType::i32, 2);
  CHECK(i[0] == 3);
  CHECK(i[1] == -3);  // truncates toward zero
  std::vector<Half> h = {to_half(3.0f)};
  divide_elements(h.data(), h.size(), DType::f16, 4);
  CHECK(to_float(h[0]) == 0.75f);
}

TEST_CASE("divide_elements: the same bits as true division, power-of-two divisors included") {
  // Power-of-two divisors multiply by the reciprocal; that must round exactly as dividing
  // does, subnormal results (where halving loses a bit) and non-finite values included.
  std::vector<float> values = {1.0f,
                               -3.0f,
                               0.1f,
                               1e30f,
                               std::numeric_limits<float>::max(),
                               std::numeric_limits<float>::min(),
                               std::numeric_limits<float>::denorm_min(),
                               3 * std::numeric_limits<float>::denorm_min(),
                               std::numeric_limits<float>::infinity(),
                               -0.0f};
  for (std::uint32_t bits = 1; bits < 2000000000u; bits += 7919777u)
    values.push_back(std::bit_cast<float>(bits));  // spread over normal and subnormal ranges
  for (int divisor : {2, 3, 4, 8, 6, 1024}) {
    CAPTURE(divisor);
    std::vector<float> got = values;
    divide_elements(got.data(), got.size(), DType::f32, divisor);
    std::vector<double> got64(values.begin(), values.end()), want64 = got64;
    divide_elements(got64.data(), got64.size(), DType::f64, divisor);
    for (std::size_t i = 0; i < values.size(); ++i) {
      CAPTURE(values[i]);
      CHECK(std::bit_cast<std::uint32_t>(got[i]) ==
            std::bit_cast<std::uint32_t>(values[i] / float(divisor)));
      CHECK(std::bit_cast<std::uint64_t>(got64[i]) ==
            std::bit_cast<std::uint64_t>(want64[i] / double(divisor)));
    }
    std::vector<Half> half(values.size());
    for (std::size_t i = 0; i < values.size(); ++i) half[i] = to_half(values[i]);
    std::vector<Half> half_got = half;
    divide_elements(half_got.data(), half_got.size(), DType::f16, divisor);
    for (std::size_t i = 0; i < values.size(); ++i)
      CHECK(std::bit_cast<std::uint16_t>(half_got[i]) ==
            std::bit_cast<std::uint16_t>(to_half(to_float(half[i]) / float(divisor))));
  }
  std::vector<float> nan = {std::numeric_limits<float>::quiet_NaN()};
  divide_elements(nan.data(), 1, DType::f32, 2);
  CHECK(std::isnan(nan[0]));
}

}  // namespace
}  // namespace accel
