#pragma once
// What the programs in tests/programs share, plain and converted alike (so it costs a converted
// twin no line): their flags, the dump of the final parameters, the per-step loss line and the
// synthetic data. Nothing here knows about the accelerator.
//
//   --steps N            optimizer steps (default 24)
//   --batch B            samples (or token columns) per process and step (default 16)
//   --dtype float|double the default dtype, so every model and sample is made in it
//   --dump FILE          the trained parameters, concatenated, as raw doubles
//   --data DIR           custom_dataset: the sample files (write_image_files)
//   --workers N          custom_dataset: DataLoaderOptions::workers (default 2)
//   --noise X            custom_dataset: the random per-sample transform's scale (default 0.1)
//   --target X           early_stop: stop once the loss is below X (default 0.3)
//   --set_to_none 0|1    gan: the modules' zero_grad(set_to_none) (default 0, LibTorch's)
// Each step prints "step S loss L" (L with 17 digits, so a test compares it exactly).

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <torch/torch.h>

namespace programs {

struct Flags {
  int steps = 24;
  std::int64_t batch = 16;
  std::string dump;
  std::string data;
  std::int64_t workers = 2;
  double noise = 0.1;
  double target = 0.3;
  bool set_to_none = false;
};

inline Flags parse_flags(int argc, char** argv) {
  Flags f;
  auto fail = [&](const std::string& why) {
    std::fprintf(stderr, "%s: %s\n", argv[0], why.c_str());
    std::exit(2);
  };
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (i + 1 == argc) fail("flag " + flag + " needs a value");
    const std::string value = argv[++i];
    if (flag == "--steps") {
      f.steps = std::stoi(value);
    } else if (flag == "--batch") {
      f.batch = std::stoll(value);
    } else if (flag == "--dump") {
      f.dump = value;
    } else if (flag == "--data") {
      f.data = value;
    } else if (flag == "--workers") {
      f.workers = std::stoll(value);
    } else if (flag == "--noise") {
      f.noise = std::stod(value);
    } else if (flag == "--target") {
      f.target = std::stod(value);
    } else if (flag == "--set_to_none" && (value == "0" || value == "1")) {
      f.set_to_none = value == "1";
    } else if (flag == "--dtype" && (value == "float" || value == "double")) {
      torch::set_default_dtype(value == "float" ? caffe2::TypeMeta::Make<float>()
                                                : caffe2::TypeMeta::Make<double>());
    } else {
      fail("unknown flag or value: " + flag + " " + value);
    }
  }
  // One thread, as the workers of `accel launch` on a small machine get: the plain run and the
  // converted one then use the same kernels.
  torch::set_num_threads(1);
  return f;
}

// The parameters as raw doubles. Written aside and renamed: every process of a converted run
// holds the same parameters and writes the same file, and none sees another's half-written.
inline void dump_parameters(const std::vector<torch::Tensor>& parameters, const std::string& path) {
  if (path.empty()) return;
  std::vector<torch::Tensor> parts;
  for (const auto& p : parameters) parts.push_back(p.detach().to(torch::kDouble).flatten().cpu());
  const torch::Tensor all = torch::cat(parts).contiguous();
  const std::string aside = path + ".tmp" + std::to_string(::getpid());
  {
    std::ofstream out(aside, std::ios::binary);
    out.write(static_cast<const char*>(all.data_ptr()), std::streamsize(all.numel() * 8));
  }
  std::filesystem::rename(aside, path);
}

// The same from a converted program's acc.get_state_dict(model) (the model's parameters in
// order, whole under ZeRO-3 too; these models have no buffers).
inline void dump_parameters(const std::vector<std::pair<std::string, torch::Tensor>>& state,
                            const std::string& path) {
  std::vector<torch::Tensor> tensors;
  for (const auto& [name, t] : state) tensors.push_back(t);
  dump_parameters(tensors, path);
}

inline void print_loss(int step, const torch::Tensor& loss) {
  std::printf("step %d loss %.17g\n", step, loss.item<double>());
  std::fflush(stdout);
}

// ---- data

inline constexpr std::int64_t kClasses = 4;
inline constexpr std::int64_t kImageSide = 6;

// n samples of a learnable task: randn features, the label the argmax of a fixed random
// "teacher" projection of them. Drawn from LibTorch's generator as it stands.
inline std::pair<torch::Tensor, torch::Tensor> teacher_samples(std::int64_t n,
                                                               std::int64_t features) {
  const torch::Tensor x = torch::randn({n, features});
  const torch::Tensor teacher = torch::randn({features, kClasses});
  return {x, torch::matmul(x, teacher).argmax(1)};
}

// The samples as a torch::data dataset (what a loop's own in-memory dataset looks like).
class InMemory : public torch::data::datasets::Dataset<InMemory> {
 public:
  explicit InMemory(std::pair<torch::Tensor, torch::Tensor> samples)
      : x_(std::move(samples.first)), y_(std::move(samples.second)) {}
  torch::data::Example<> get(std::size_t i) override {
    return {x_[std::int64_t(i)], y_[std::int64_t(i)]};
  }
  torch::optional<std::size_t> size() const override { return std::size_t(x_.size(0)); }

 private:
  torch::Tensor x_, y_;
};

// custom_dataset's files, written by the test: sample_<i>.bin holds a 1 x 6 x 6 image (36
// doubles, positive as pixel values are) and its label as a double.
inline void write_image_files(const std::string& dir, std::int64_t n, std::uint64_t seed) {
  torch::manual_seed(seed);
  auto [x, y] = teacher_samples(n, kImageSide * kImageSide);
  x = (x.to(torch::kDouble) * 0.25 + 0.5).clamp(0, 1);
  for (std::int64_t i = 0; i < n; ++i) {
    const torch::Tensor row = torch::cat({x[i], y.narrow(0, i, 1).to(torch::kDouble)});
    std::ofstream out(dir + "/sample_" + std::to_string(i) + ".bin", std::ios::binary);
    out.write(static_cast<const char*>(row.contiguous().data_ptr()),
              std::streamsize(row.numel() * sizeof(double)));
  }
}

// lstm_lm's corpus: a token stream of `vocab` tokens where each follows from the previous one
// (t -> 3t + 1 mod vocab) with probability 0.8, else is drawn uniformly: a language to learn.
inline torch::Tensor markov_tokens(std::int64_t n, std::int64_t vocab) {
  const torch::Tensor jump = torch::rand({n}) < 0.2;
  const torch::Tensor random = torch::randint(vocab, {n}, torch::kLong);
  torch::Tensor out = torch::empty({n}, torch::kLong);
  auto j = jump.accessor<bool, 1>();
  auto r = random.accessor<std::int64_t, 1>();
  auto o = out.accessor<std::int64_t, 1>();
  std::int64_t t = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    t = j[i] ? r[i] : (3 * t + 1) % vocab;
    o[i] = t;
  }
  return out;
}

}  // namespace programs
