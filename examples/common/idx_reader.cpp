#include "examples/common/idx_reader.hpp"

#include <zlib.h>

#include <algorithm>
#include <climits>
#include <filesystem>
#include <stdexcept>

namespace examples {
namespace {

// Owns the gzFile so every error path closes it.
class GzFile {
 public:
  explicit GzFile(const std::string& path) : path_(path), file_(gzopen(path.c_str(), "rb")) {
    if (!file_) throw std::runtime_error(path + ": cannot open");
  }
  ~GzFile() { gzclose(file_); }
  GzFile(const GzFile&) = delete;
  GzFile& operator=(const GzFile&) = delete;

  // Exactly n bytes, or an error saying how many were there.
  void read(void* out, std::size_t n, const char* what) {
    auto* p = static_cast<unsigned char*>(out);
    std::size_t done = 0;
    while (done < n) {
      const unsigned chunk = unsigned(std::min<std::size_t>(n - done, INT_MAX / 2));
      const int got = gzread(file_, p + done, chunk);
      if (got < 0) {
        int code = 0;
        const char* msg = gzerror(file_, &code);
        throw std::runtime_error(path_ + ": cannot read " + what + ": " + msg);
      }
      if (got == 0)
        throw std::runtime_error(path_ + ": ends early in " + what + " (" + std::to_string(done) +
                                 " of " + std::to_string(n) + " bytes)");
      done += std::size_t(got);
    }
  }

 private:
  std::string path_;
  gzFile file_;
};

std::uint32_t big_endian(const unsigned char b[4]) {
  return std::uint32_t(b[0]) << 24 | std::uint32_t(b[1]) << 16 | std::uint32_t(b[2]) << 8 | b[3];
}

std::string existing(const std::string& dir, const std::string& name) {
  const auto gz = std::filesystem::path(dir) / (name + ".gz");
  if (std::filesystem::exists(gz)) return gz.string();
  const auto plain = std::filesystem::path(dir) / name;
  if (std::filesystem::exists(plain)) return plain.string();
  throw std::runtime_error(gz.string() + ": no such file (nor " + plain.string() + ")");
}

}  // namespace

IdxArray read_idx(const std::string& path, std::size_t max_items) {
  GzFile file(path);
  unsigned char header[4];
  file.read(header, 4, "the header");
  if (header[0] != 0 || header[1] != 0)
    throw std::runtime_error(path + ": not an IDX file (bad magic number)");
  if (header[2] != 0x08)
    throw std::runtime_error(path + ": element type 0x" + std::to_string(int(header[2])) +
                             " is not unsigned bytes (0x08)");
  const int ndims = header[3];
  if (ndims < 1 || ndims > 4)
    throw std::runtime_error(path + ": " + std::to_string(ndims) + " dimensions (1 to 4 expected)");
  IdxArray out;
  std::size_t total = 1;
  for (int d = 0; d < ndims; ++d) {
    unsigned char size[4];
    file.read(size, 4, "the dimension sizes");
    out.dims.push_back(big_endian(size));
  }
  if (max_items > 0 && max_items < out.dims[0]) out.dims[0] = max_items;
  for (std::size_t d : out.dims) {
    if (d != 0 && total > (std::size_t(1) << 34) / d)
      throw std::runtime_error(path + ": implausible sizes in the header");
    total *= d;
  }
  out.data.resize(total);
  file.read(out.data.data(), total, "the data");
  return out;
}

ImageDataset load_mnist_split(const std::string& dir, const std::string& split,
                              std::size_t max_items) {
  const std::string images_path = existing(dir, split + "-images-idx3-ubyte");
  const std::string labels_path = existing(dir, split + "-labels-idx1-ubyte");
  IdxArray images = read_idx(images_path, max_items);
  IdxArray labels = read_idx(labels_path, max_items);
  if (images.dims.size() != 3)
    throw std::runtime_error(images_path + ": expected 3 dimensions (count, rows, cols)");
  if (labels.dims.size() != 1)
    throw std::runtime_error(labels_path + ": expected 1 dimension (count)");
  if (images.dims[0] != labels.dims[0])
    throw std::runtime_error(images_path + " has " + std::to_string(images.dims[0]) +
                             " images but " + labels_path + " has " +
                             std::to_string(labels.dims[0]) + " labels");
  ImageDataset out;
  out.count = images.dims[0];
  out.rows = images.dims[1];
  out.cols = images.dims[2];
  out.pixels = std::move(images.data);
  out.labels = std::move(labels.data);
  return out;
}

}  // namespace examples
