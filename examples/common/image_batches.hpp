#pragma once
// Fashion-MNIST images as standardised floats and batches of them, for the hand-written MLP
// examples (examples/raw_mlp on the CPU, examples/raw_cuda on a GPU): the same data, the same
// batches, so the two are comparable.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "accelerate/accelerator.hpp"
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
inline void take_batch(const FloatImages& d, const std::vector<std::size_t>& idx, std::size_t first,
                       std::size_t n, std::vector<float>& x, std::vector<int>& labels) {
  x.resize(n * d.features);
  labels.resize(n);
  for (std::size_t k = 0; k < n; ++k) {
    const std::size_t i = idx[first + k];
    std::copy_n(d.x.begin() + std::ptrdiff_t(i * d.features), d.features,
                x.begin() + std::ptrdiff_t(k * d.features));
    labels[k] = d.labels[i];
  }
}

// One micro-batch's forward and backward through acc.forward_backward: rows [first, first + n)
// of the batch on `replica` (the whole batch on `model`, or a chunk on each DataParallel
// replica's thread), through model.forward_backward(x, labels, loss_scale, on_layer_grads),
// which reports layer l's gradients final by on_layer_grads(l) (its weight is parameter 2l,
// its bias 2l + 1). `extra` follows on_layer_grads (raw_mlp's ZeRO-3 unit scopes). Returns the
// mean loss over the batch.
template <typename Model, typename... Extra>
float forward_backward_rows(accel::Accelerator& acc, Model& model, const std::vector<float>& x,
                            const std::vector<int>& labels, std::size_t features,
                            const Extra&... extra) {
  return acc.forward_backward(
      model, labels.size(), [&](Model& replica, std::size_t first, std::size_t n, auto ready) {
        return replica.forward_backward(
            std::span<const float>(x).subspan(first * features, n * features),
            std::span<const int>(labels).subspan(first, n), acc.loss_scale(),
            [&](std::size_t l) {
              ready(2 * l);      // weight
              ready(2 * l + 1);  // bias
            },
            extra...);
      });
}

// Test accuracy over the whole test set: each process predicts its shard (model.predict(x, n)
// returns n class indices), the verdicts are gathered without the sampler's padding, so
// exactly test.count samples are counted.
template <typename Model>
double test_accuracy(accel::Accelerator& acc, Model& model, const FloatImages& test) {
  const std::size_t batch = 256;
  accel::ShardedSampler sampler = acc.make_sampler(test.count, {batch, false, 0, false});
  const auto idx = sampler.indices();
  std::vector<float> x;
  std::vector<int> labels;
  std::size_t correct = 0, seen = 0;
  for (std::size_t b = 0; b < sampler.num_batches(); ++b) {
    const auto [begin, end] = sampler.batch_bounds(b);  // one process: a short last batch
    const std::size_t n = end - begin;
    take_batch(test, idx, begin, n, x, labels);
    const std::vector<int> predicted = model.predict(x, int(n));
    std::vector<std::int64_t> hit(n);
    for (std::size_t k = 0; k < n; ++k) hit[k] = predicted[k] == labels[k];
    const auto all = acc.gather_for_metrics(hit, sampler, b);
    for (std::int64_t h : all) correct += std::size_t(h);
    seen += all.size();
  }
  return double(correct) / double(seen);
}

}  // namespace examples
