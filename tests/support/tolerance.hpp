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

#include <cmath>
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

// The largest first-order difference between two runs' parameters (see above). Nesterov
// momentum weighs a gradient by lr (1 + mu + mu^2 + ...) as well; weight decay and an LR
// schedule that only lowers the rate keep within it (first order).
inline double reordering_bound(const SgdRun& r) {
  return r.lr * r.steps / (1 - r.momentum) * 2 * gamma_n(r.longest_sum, r.unit_roundoff) *
         r.magnitude;
}

// Adam (and AdamW, AMSGrad) divides by sqrt(v^) + eps, so the gradient's own size does not
// bound the step's sensitivity and eps does. With bias correction m^_t and v^_t are weighted
// means of the gradients g_k and their squares (weights a_k, b_k summing to 1), so a gradient
// difference d moves m^_t by at most d and s = sqrt(v^_t) by at most
// sum b_k |g_k| d / s <= d (Cauchy-Schwarz), and |m^_t| <= rho_t s with
// rho_t^2 = sum a_k^2 / b_k (Cauchy-Schwarz again; AMSGrad's max only raises s). The step's
// ratio m^ / (s + eps) then moves by at most (1 + rho_t) d / (s + eps) <= (1 + rho_t) d / eps.
// Summed over the steps with d = 2 gamma(n) S as for SGD: in fp64 that is a usable bound, in
// fp32 (d / eps ~ 1e-5 S / 1e-8) it exceeds the step itself, so no fp32 Adam bound exists.
struct AdamRun {
  double lr = 0;
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
  int steps = 0;
  std::size_t longest_sum = 0;  // as SgdRun's
  double magnitude = 0;
  double unit_roundoff = kUnitRoundoffF64;
};

inline double adam_rho(int t, double beta1, double beta2) {
  double geometric = 0, q = 1;
  for (int j = 0; j < t; ++j, q *= beta1 * beta1 / beta2) geometric += q;
  const double a = (1 - beta1) / (1 - std::pow(beta1, t));
  return std::sqrt(a * a * (1 - std::pow(beta2, t)) / (1 - beta2) * geometric);
}

inline double adam_reordering_bound(const AdamRun& r) {
  const double d = 2 * gamma_n(r.longest_sum, r.unit_roundoff) * r.magnitude;
  double sum = 0;
  for (int t = 1; t <= r.steps; ++t) sum += 1 + adam_rho(t, r.beta1, r.beta2);
  return r.lr * sum * d / r.eps;
}

// Two gradient norms (clip_grad_norm's) of P elements, each element a sum as in SgdRun: the
// gradients differ by at most D = 2 gamma(n) |S|_2 in 2-norm (|S|_2 the 2-norm of the
// elements' S), so the norms by at most D, plus each norm's own rounding: its sum of squares
// is within gamma(P) of exact relatively (in the norm's precision), the norm, a square root,
// within half that; and a norm is at most |S|_2.
struct NormRun {
  double norm_magnitude = 0;  // |S|_2
  std::size_t elements = 0;   // P
  std::size_t longest_sum = 0;
  double unit_roundoff = kUnitRoundoffF64;       // the gradients'
  double norm_unit_roundoff = kUnitRoundoffF64;  // the norm's sum
};

inline double norm_reordering_bound(const NormRun& r) {
  return r.norm_magnitude *
         (2 * gamma_n(r.longest_sum, r.unit_roundoff) + gamma_n(r.elements, r.norm_unit_roundoff));
}

// A gradient clipped to norm c (clip_grad_norm) before the step: with the gradients d apart
// per element (d = 2 gamma(n) S_max) and D apart in 2-norm (D = 2 gamma(n) |S|_2, |S|_2 the
// 2-norm of every element's S), the norms differ by at most D plus their own rounding,
// gamma(P) |g| for P elements (summed in the norm's precision). While clipping acts
// (|g| >= c) an element g_j becomes g_j c / |g|, rounded once more (u c), which the norms'
// difference moves by at most |g_j| c / |g| (D / |g| + gamma(P)) <= D share + c gamma(P),
// share = max |g_j| / |g| <= 1 (measured on the reference, or 1). As a magnitude for SgdRun
// (d = 2 gamma(n) magnitude): S_max + |S|_2 share + c (gamma(P) + 2 u) / (2 gamma(n)).
struct ClippedRun {
  double max_magnitude = 0;   // S_max
  double norm_magnitude = 0;  // |S|_2
  double share = 1;           // the largest |g_j| / |g| over the steps that clipped
  double clip = 0;            // c
  std::size_t elements = 0;   // P
  std::size_t longest_sum = 0;
  double unit_roundoff = kUnitRoundoffF64;       // the gradients'
  double norm_unit_roundoff = kUnitRoundoffF64;  // the norm's sum (clip_grad_norm: double)
};

inline double clipped_magnitude(const ClippedRun& r) {
  return r.max_magnitude + r.norm_magnitude * r.share +
         r.clip * (gamma_n(r.elements, r.norm_unit_roundoff) + 2 * r.unit_roundoff) /
             (2 * gamma_n(r.longest_sum, r.unit_roundoff));
}

// A forward pass computed with another summation order (another BLAS kernel, another
// blocking): a layer's output sum_i w_i a_i + b of n = in + 1 terms is within gamma(n) of exact
// relative to sum |w_i a_i| + |b| in each order; the difference of the layer's inputs, e,
// reaches its outputs as at most |W| e (ReLU and tanh are 1-Lipschitz). So to first order
// e_0 = 0, e_{l+1} = |W| e_l + 2 gamma(in + 1) (|W| |a_l| + |b|), and the outputs differ by at
// most the last e, evaluated with the exact activations a_l. Against the exact (fp64) forward
// pass instead of another fp32 order, gamma replaces 2 gamma (merge_weights_test).

}  // namespace accel::test
