#pragma once
// Equivalence tolerances derived from the arithmetic, so that they hold on every CPU.
//
// Two runs of the same training that differ only in how each sum is split and ordered
// (replica chunks, ranks, bucket order, a BLAS kernel's blocking, which changes with the chunk
// size and the CPU: OpenBLAS picks SkylakeX/Cooperlake kernels on AVX-512 machines, Haswell
// ones elsewhere) compute every sum of n terms within 2 * gamma(n) * S of each other
// (gamma(n) = n u / (1 - n u), u the unit roundoff, S the sum of the terms' magnitudes;
// Higham, Accuracy and Stability of Numerical Algorithms, 2nd ed., eq. 4.4). SGD with
// momentum mu and rate lr weighs a step's gradient by at most lr / (1 - mu) in every later
// parameter, so after T steps the parameters differ by at most lr T / (1 - mu) * 2 gamma(n) S
// to first order. First order ignores the trajectory's own sensitivity, and fp32 is where that
// shows: the Fashion-MNIST CNN's one-step fp32 gradients differ by about 2e-8 between one batch
// and two chunks with either kernel family, first order predicts 2e-7 after 20 steps, and that
// is what Haswell kernels give, but SkylakeX/Cooperlake ones end 4e-5 apart (a ReLU or max-pool
// decision flipped by a rounding difference, then amplified). In fp64 such flips are out of
// reach and the drift stays first order (1e-15 measured), so LibTorch equivalence runs, whose
// kernels depend on the CPU, compare fp64 models against this bound.

#include <cstddef>

namespace accel::test {

inline constexpr double kUnitRoundoffF32 = 0x1p-24;
inline constexpr double kUnitRoundoffF64 = 0x1p-53;

// gamma(n) = n u / (1 - n u): the relative error bound of a sum of n terms in any order.
inline double gamma_n(std::size_t n, double unit_roundoff) {
  const double nu = double(n) * unit_roundoff;
  return nu / (1 - nu);
}

struct SgdRun {
  double lr = 0;
  double momentum = 0;
  int steps = 0;
  std::size_t longest_sum = 0;  // terms in the longest reduction of one gradient element
  double magnitude = 0;         // upper bound on the sum of that reduction's |terms|
  double unit_roundoff = kUnitRoundoffF64;
};

// The largest first-order difference between two runs' parameters (see above).
inline double reordering_bound(const SgdRun& r) {
  return r.lr * r.steps / (1 - r.momentum) * 2 * gamma_n(r.longest_sum, r.unit_roundoff) *
         r.magnitude;
}

}  // namespace accel::test
