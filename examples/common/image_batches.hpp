#pragma once
// Fashion-MNIST images as standardised floats and batches of them, for the hand-written MLP
// examples (examples/raw_mlp on the CPU, examples/raw_cuda on a GPU): the same data, the same
// batches, so the two are comparable.

#include <algorithm>
#include <cstddef>
#include <vector>

#include "examples/common/idx_reader.hpp"

namespace examples {

// Pixels scaled to [0, 1] and standardised with Fashion-MNIST's mean and deviation.
struct FloatImages {
  std::size_t count = 0, features = 0;
  std::vector<float> x;  // count x features
  std::vector<int> labels;
};

inline FloatImages to_floats(const ImageDataset& d) {
  FloatImages out;
  out.count = d.count;
  out.features = d.rows * d.cols;
  out.x.resize(d.pixels.size());
  for (std::size_t i = 0; i < d.pixels.size(); ++i)
    out.x[i] = (float(d.pixels[i]) / 255.0f - 0.2860f) / 0.3530f;
  out.labels.assign(d.labels.begin(), d.labels.end());
  return out;
}

// Rows `idx[first, first + n)` of the data, as one batch.
inline void take_batch(const FloatImages& d, const std::vector<std::size_t>& idx,
                       std::size_t first, std::size_t n, std::vector<float>& x,
                       std::vector<int>& labels) {
  x.resize(n * d.features);
  labels.resize(n);
  for (std::size_t k = 0; k < n; ++k) {
    const std::size_t i = idx[first + k];
    std::copy_n(d.x.begin() + std::ptrdiff_t(i * d.features), d.features,
                x.begin() + std::ptrdiff_t(k * d.features));
    labels[k] = d.labels[i];
  }
}

}  // namespace examples
