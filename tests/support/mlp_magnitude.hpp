#pragma once
// The magnitudes tests/support/tolerance.hpp's bounds need, measured for the raw MLP
// (examples/raw_mlp) instead of bounded by hand: a batch gradient element is a sum over the
// rows of each row's contribution, and the sum of those contributions' |values| (S) is what a
// reordering of that sum can be off by, relatively. Measured by running every row through a
// copy of the model alone (the contributions are then exactly the per-row gradients).

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <span>
#include <vector>

#include "examples/raw_mlp/mlp.hpp"

namespace accel::test {

struct GradientMagnitude {
  double max = 0;    // the largest S over the gradient elements
  double norm = 0;   // sqrt(sum of S^2): bounds the gradients' 2-norm difference (clipping)
  double share = 0;  // the largest max |g_j| / |g| of a step that clipped (ClippedRun)
};

// S of every gradient element for the batch (x, labels) of forward_backward(x, labels,
// loss_scale), whose mean over the rows each row enters with loss_scale / rows.
inline std::vector<double> gradient_magnitudes(const raw_mlp::Mlp& model, std::span<const float> x,
                                               std::span<const int> labels, float loss_scale) {
  raw_mlp::Mlp row_model = model;
  const std::size_t rows = labels.size();
  const std::size_t features = rows == 0 ? 0 : x.size() / rows;
  std::vector<double> s;
  for (const auto& l : model.layers()) s.resize(s.size() + l.weight.size() + l.bias.size());
  for (std::size_t n = 0; n < rows; ++n) {
    row_model.zero_grad();
    row_model.forward_backward(x.subspan(n * features, features), labels.subspan(n, 1),
                               loss_scale / float(rows), [](std::size_t) {});
    std::size_t at = 0;
    for (const auto& l : row_model.layers()) {
      for (float g : l.weight_grad) s[at++] += std::abs(double(g));
      for (float g : l.bias_grad) s[at++] += std::abs(double(g));
    }
  }
  return s;
}

// Several micro-batches accumulated into one step's gradient add their magnitudes.
inline void add_magnitudes(std::vector<double>& into, const std::vector<double>& more) {
  if (into.empty()) into.assign(more.size(), 0.0);
  for (std::size_t i = 0; i < more.size(); ++i) into[i] += more[i];
}

// The largest S and the 2-norm of all S of one step, folded into the run's worst (`worst`).
inline void fold_step(GradientMagnitude& worst, const std::vector<double>& step) {
  double sq = 0, mx = 0;
  for (double v : step) {
    sq += v * v;
    mx = std::max(mx, v);
  }
  worst.max = std::max(worst.max, mx);
  worst.norm = std::max(worst.norm, std::sqrt(sq));
}

// After the step's gradient is complete, before clipping to `clip`: its largest element over
// its norm, when clipping will act.
inline void fold_clip_share(GradientMagnitude& worst, const raw_mlp::Mlp& model, double clip) {
  double sq = 0, mx = 0;
  for (const auto& l : model.layers())
    for (const auto* grads : {&l.weight_grad, &l.bias_grad})
      for (float g : *grads) {
        sq += double(g) * g;
        mx = std::max(mx, std::abs(double(g)));
      }
  const double norm = std::sqrt(sq);
  if (norm > clip) worst.share = std::max(worst.share, mx / norm);
}

}  // namespace accel::test
