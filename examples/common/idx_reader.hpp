#pragma once
// Reading MNIST-style IDX files (gzip-compressed or plain) for the examples: SHARED by
// examples/raw_mlp and examples/fashion_mnist. Link the `example_idx_reader` target
// (examples/CMakeLists.txt; it brings zlib) and include "examples/common/idx_reader.hpp".
//
//   auto train = examples::load_mnist_split("/usr/share/datasets/fashion-mnist", "train");
//   // train.count images of train.rows x train.cols bytes (0..255) in train.pixels,
//   // train.labels[i] in 0..9
//
// The format (http://yann.lecun.com/exdb/mnist/): a big-endian magic 0x000008DD (08 =
// unsigned bytes, DD = number of dimensions), DD big-endian 32-bit sizes, then the data.
// zlib's gzread passes files that are not gzip through unchanged, so .gz or not both work.
// Errors throw std::runtime_error naming the file and what is wrong with it.

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace examples {

struct IdxArray {
  std::vector<std::size_t> dims;   // e.g. {60000, 28, 28}
  std::vector<std::uint8_t> data;  // product(dims) bytes, row-major
};

// One IDX file of unsigned bytes. `max_items` > 0 reads only the first max_items entries of
// the first dimension (dims[0] is then that count), to keep tests and smoke runs quick.
IdxArray read_idx(const std::string& path, std::size_t max_items = 0);

// An images file with its labels file.
struct ImageDataset {
  std::size_t count = 0;
  std::size_t rows = 0, cols = 0;
  std::vector<std::uint8_t> pixels;  // count x rows x cols
  std::vector<std::uint8_t> labels;  // count
};

// DIR/SPLIT-images-idx3-ubyte.gz and DIR/SPLIT-labels-idx1-ubyte.gz, SPLIT being "train" or
// "t10k" (falls back to the names without .gz). Checks both have the same count.
ImageDataset load_mnist_split(const std::string& dir, const std::string& split,
                              std::size_t max_items = 0);

}  // namespace examples
