#pragma once
// Splitting a model's layers into contiguous pipeline pieces: partition_method (config key)
//   uniform     balance layer counts
//   parameters  balance parameter counts (DeepSpeed's default)
//   profile     balance each layer's measured forward + backward time
// or explicit split points (the first layer of each piece after the first). Pure: the
// weights come from the caller (the LibTorch adapter counts or times the layers).

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace accel::pipeline {

enum class PartitionMethod { uniform, parameters, profile };
std::string to_string(PartitionMethod);  // "uniform", "parameters", "profile"
// Throws InvalidArgument naming the text and the choices.
PartitionMethod parse_partition_method(std::string_view text);

// Piece k holds layers [bounds[k], bounds[k + 1]): pieces + 1 bounds, bounds.front() == 0,
// bounds.back() == the layer count.
using PieceBounds = std::vector<std::size_t>;

// uniform: piece sizes differ by at most one layer, the larger pieces first (10 layers in 4:
// 3 3 2 2). Refuses fewer layers than pieces, naming both.
PieceBounds uniform(std::size_t layers, int pieces);

// The contiguous split of layers with these weights into `pieces` non-empty pieces that makes
// the heaviest piece as light as possible (among those, each piece as long as the bound
// allows, the earliest first). Refuses fewer layers than
// pieces, naming both, and a negative weight.
PieceBounds balance(const std::vector<double>& layer_weights, int pieces);

// Explicit split points by layer name: `first_layers` names the first layer of pieces 1 ..
// pieces-1, in order. Refuses a name that is not a layer, one out of order, or the wrong count,
// naming it.
PieceBounds split_at(const std::vector<std::string>& layer_names,
                     const std::vector<std::string>& first_layers, int pieces);

}  // namespace accel::pipeline
