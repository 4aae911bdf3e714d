#include "accelerate/pipeline/partition.hpp"

#include <algorithm>

#include "foundation/error.hpp"

namespace accel::pipeline {
namespace {

// Piece weights are differences of one prefix-sum array, so every comparison below sees the
// same rounded values.
class PrefixWeights {
 public:
  explicit PrefixWeights(const std::vector<double>& w) : sum_(w.size() + 1, 0) {
    for (std::size_t i = 0; i < w.size(); ++i) sum_[i + 1] = sum_[i] + w[i];
  }
  std::size_t layers() const { return sum_.size() - 1; }
  double of(std::size_t begin, std::size_t end) const { return sum_[end] - sum_[begin]; }

  // The fewest pieces, each at most `cap`, that layers [begin, end) split into; 0 when a
  // single layer is heavier than cap (no split exists).
  std::size_t fewest_pieces(std::size_t begin, std::size_t end, double cap) const {
    std::size_t pieces = 0;
    for (std::size_t i = begin; i < end; ++pieces) {
      std::size_t j = i + 1;
      if (of(i, j) > cap) return 0;
      while (j < end && of(i, j + 1) <= cap) ++j;
      i = j;
    }
    return pieces;
  }
  // Layers [begin, end) split into exactly `pieces` non-empty pieces of at most `cap`: at
  // least that many layers, and no more than `pieces` needed (a piece splits further).
  bool splits(std::size_t begin, std::size_t end, std::size_t pieces, double cap) const {
    if (end - begin < pieces) return false;
    if (begin == end) return pieces == 0;
    const std::size_t fewest = fewest_pieces(begin, end, cap);
    return fewest != 0 && fewest <= pieces;
  }

 private:
  std::vector<double> sum_;
};

void check_enough_layers(std::size_t layers, int pieces) {
  if (pieces < 1 || layers < std::size_t(pieces))
    throw InvalidArgument("pipeline: " + std::to_string(layers) + " layers cannot make " +
                          std::to_string(pieces) + " pipeline pieces (each needs a layer)");
}

}  // namespace

std::string to_string(PartitionMethod m) {
  switch (m) {
    case PartitionMethod::uniform:
      return "uniform";
    case PartitionMethod::parameters:
      return "parameters";
    case PartitionMethod::profile:
      return "profile";
  }
  return "?";
}

PartitionMethod parse_partition_method(std::string_view text) {
  for (PartitionMethod m :
       {PartitionMethod::uniform, PartitionMethod::parameters, PartitionMethod::profile})
    if (text == to_string(m)) return m;
  throw InvalidArgument("partition_method '" + std::string(text) +
                        "' is not a method (uniform, parameters, profile)");
}

PieceBounds uniform(std::size_t layers, int pieces) {
  check_enough_layers(layers, pieces);
  const std::size_t k = std::size_t(pieces), base = layers / k, larger = layers % k;
  PieceBounds bounds{0};
  for (std::size_t piece = 0; piece < k; ++piece)
    bounds.push_back(bounds.back() + base + (piece < larger ? 1 : 0));
  return bounds;
}

PieceBounds balance(const std::vector<double>& layer_weights, int pieces) {
  check_enough_layers(layer_weights.size(), pieces);
  for (std::size_t i = 0; i < layer_weights.size(); ++i)
    if (!(layer_weights[i] >= 0))
      throw InvalidArgument("pipeline: layer " + std::to_string(i) + "'s weight " +
                            std::to_string(layer_weights[i]) + " is not a count or a time");
  const PrefixWeights w(layer_weights);
  const std::size_t n = w.layers(), k = std::size_t(pieces);
  // The lightest heaviest piece is one of the contiguous ranges' weights: the smallest that
  // splits.
  std::vector<double> candidates;
  for (std::size_t i = 0; i < n; ++i)
    for (std::size_t j = i + 1; j <= n; ++j) candidates.push_back(w.of(i, j));
  std::sort(candidates.begin(), candidates.end());
  candidates.erase(std::unique(candidates.begin(), candidates.end()), candidates.end());
  const auto cap = *std::partition_point(candidates.begin(), candidates.end(),
                                         [&](double c) { return !w.splits(0, n, k, c); });
  // Each piece as long as the cap allows with the rest still splitting (the rest only gets
  // easier to split as the piece grows, until too few layers are left for it).
  PieceBounds bounds{0};
  for (std::size_t piece = 0; piece + 1 < k; ++piece) {
    const std::size_t begin = bounds.back(), rest = k - piece - 1;
    std::size_t longest = begin + 1;
    for (std::size_t end = begin + 1; end + rest <= n && w.of(begin, end) <= cap; ++end)
      if (w.splits(end, n, rest, cap)) longest = end;
    bounds.push_back(longest);
  }
  bounds.push_back(n);
  return bounds;
}

PieceBounds split_at(const std::vector<std::string>& layer_names,
                     const std::vector<std::string>& first_layers, int pieces) {
  if (first_layers.size() + 1 != std::size_t(pieces))
    throw InvalidArgument("pipeline: " + std::to_string(first_layers.size()) +
                          " split points make " + std::to_string(first_layers.size() + 1) +
                          " pieces, not " + std::to_string(pieces));
  PieceBounds bounds{0};
  for (const std::string& name : first_layers) {
    const auto it = std::find(layer_names.begin(), layer_names.end(), name);
    if (it == layer_names.end())
      throw InvalidArgument("pipeline: split point '" + name + "' is not a layer of the model");
    const auto at = std::size_t(it - layer_names.begin());
    if (at <= bounds.back())
      throw InvalidArgument("pipeline: split point '" + name +
                            "' does not come after the previous piece's first layer (each piece "
                            "needs a layer, in the model's order)");
    bounds.push_back(at);
  }
  bounds.push_back(layer_names.size());
  return bounds;
}

}  // namespace accel::pipeline
