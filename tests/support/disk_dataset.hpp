#pragma once
// A torch::data Dataset as users write one for data larger than memory: get(i) reads sample
// i's file (16 doubles, a 1 x 4 x 4 image, then the label as a double). Every read is logged, in
// every copy of the dataset (LibTorch's workers each hold one), so a test sees which samples a
// process read.

#include <cstdint>
#include <fstream>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include <torch/torch.h>

namespace accel::test {

inline constexpr std::int64_t kDiskFeatures = 16;
inline constexpr std::int64_t kDiskClasses = 10;

// Writes n samples under dir (sample_<i>.bin): randn features, a label below kDiskClasses.
inline void write_disk_samples(const std::string& dir, std::size_t n, std::uint64_t seed) {
  torch::manual_seed(seed);
  const torch::Tensor x = torch::randn({std::int64_t(n), kDiskFeatures}, torch::kDouble);
  const torch::Tensor y = torch::randint(kDiskClasses, {std::int64_t(n)}, torch::kDouble);
  for (std::size_t i = 0; i < n; ++i) {
    const torch::Tensor row = torch::cat({x[std::int64_t(i)], y.narrow(0, std::int64_t(i), 1)});
    std::ofstream out(dir + "/sample_" + std::to_string(i) + ".bin", std::ios::binary);
    out.write(static_cast<const char*>(row.contiguous().data_ptr()),
              std::streamsize(row.numel() * sizeof(double)));
  }
}

struct ReadLog {
  std::mutex mutex;
  std::vector<std::size_t> reads;
  void add(std::size_t i) {
    std::lock_guard<std::mutex> lock(mutex);
    reads.push_back(i);
  }
};

class DiskDataset : public torch::data::datasets::Dataset<DiskDataset> {
 public:
  DiskDataset(std::string dir, std::size_t n, std::shared_ptr<ReadLog> log)
      : dir_(std::move(dir)), n_(n), log_(std::move(log)) {}

  torch::data::Example<> get(std::size_t index) override {
    if (log_) log_->add(index);
    std::vector<double> row(kDiskFeatures + 1);
    std::ifstream in(dir_ + "/sample_" + std::to_string(index) + ".bin", std::ios::binary);
    if (!in.read(reinterpret_cast<char*>(row.data()), std::streamsize(row.size() * sizeof(double))))
      throw std::runtime_error("DiskDataset: cannot read sample " + std::to_string(index));
    const torch::Tensor t = torch::tensor(row, torch::kDouble);
    // A 1 x 4 x 4 image, as Normalize<> expects (channels first).
    return {t.narrow(0, 0, kDiskFeatures).view({1, 4, 4}), t[kDiskFeatures].to(torch::kLong)};
  }
  torch::optional<std::size_t> size() const override { return n_; }

 private:
  std::string dir_;
  std::size_t n_;
  std::shared_ptr<ReadLog> log_;
};

// A random per-sample transform (augmentation noise from LibTorch's generator).
inline torch::data::transforms::Lambda<torch::data::Example<>> jitter() {
  return torch::data::transforms::Lambda<torch::data::Example<>>([](torch::data::Example<> e) {
    e.data = e.data + 0.1 * torch::randn_like(e.data);
    return e;
  });
}

// A dataset as the tests feed it: normalised, optionally jittered, stacked into Example<>.
template <typename D>
auto normalised(D dataset) {
  return std::move(dataset)
      .map(torch::data::transforms::Normalize<>(0.1, 1.1))
      .map(torch::data::transforms::Stack<>());
}
template <typename D>
auto jittered(D dataset) {
  return std::move(dataset)
      .map(torch::data::transforms::Normalize<>(0.1, 1.1))
      .map(jitter())
      .map(torch::data::transforms::Stack<>());
}

// The model both sides of the disk-dataset tests train (double, seeded), and its parameters
// flattened for comparison.
inline torch::nn::Sequential disk_mlp() {
  torch::manual_seed(1);
  torch::nn::Sequential net(torch::nn::Flatten(), torch::nn::Linear(kDiskFeatures, 32),
                            torch::nn::ReLU(), torch::nn::Linear(32, kDiskClasses));
  net->to(torch::kDouble);
  return net;
}

inline torch::Tensor flat_parameters(torch::nn::Module& m) {
  std::vector<torch::Tensor> parts;
  for (const auto& p : m.parameters()) parts.push_back(p.detach().flatten());
  return torch::cat(parts);
}

}  // namespace accel::test
