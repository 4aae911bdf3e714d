// `accel merge-weights DIR OUT` over real checkpoints: one saved by 4 ZeRO-2 ranks (each
// holding its slice) and one saved by a single process; the output loads into a plain LibTorch
// model with torch::load and predicts what the trained model predicted (zero_resume_worker
// writes a fixed input and its logits). A damaged or missing checkpoint fails naming the file
// and leaves no output behind. A checkpoint of the LibTorch adapter (state.model) is copied.

#include <torch/torch.h>
// LibTorch's logging header defines a CHECK of its own (fatal, uncounted); doctest's is meant.
#undef CHECK
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <vector>

#include "backends/comm/registry.hpp"
#include "tests/support/files.hpp"
#include "tests/support/ranks.hpp"
#include "tests/support/skip.hpp"
#include "tests/support/tolerance.hpp"

using namespace accel;
using namespace accel::test;
namespace fs = std::filesystem;

namespace {

constexpr int kRows = 5;
const std::vector<int> kSizes = {13, 37, 29, 10};  // zero_resume_worker's MLP

// What a user's LibTorch program would define: parameters "layers.0.weight", ...
struct Mlp : torch::nn::Module {
  torch::nn::ModuleList layers;
  Mlp() {
    layers = register_module("layers", torch::nn::ModuleList());
    for (std::size_t l = 0; l + 1 < kSizes.size(); ++l)
      layers->push_back(torch::nn::Linear(kSizes[l], kSizes[l + 1]));
  }
  torch::Tensor forward(torch::Tensor x) {
    for (std::size_t l = 0; l < layers->size(); ++l) {
      x = layers[l]->as<torch::nn::Linear>()->forward(x);
      if (l + 1 < layers->size()) x = torch::relu(x);
    }
    return x;
  }
};

std::vector<float> read_floats(const std::string& path) {
  const std::string bytes = read_file(path);
  std::vector<float> out(bytes.size() / sizeof(float));
  std::memcpy(out.data(), bytes.data(), out.size() * sizeof(float));
  return out;
}

struct Difference {
  double max_abs = 0;
  double limit = 0;
};

// tests/support/tolerance.hpp's forward bound, one-sided: the worker's fp32 loops against the
// merged model evaluated in fp64 (exact to 1e-16, and no CPU-dependent fp32 kernel involved),
// each layer's sum within gamma(in + 1) of exact relative to the sum of |terms|.
double forward_bound(Mlp& model, const torch::Tensor& x) {
  torch::Tensor a = x.to(torch::kDouble), e = torch::zeros_like(a);
  for (std::size_t l = 0; l < model.layers->size(); ++l) {
    const auto& layer = *model.layers[l]->as<torch::nn::Linear>();
    const torch::Tensor w = layer.weight.to(torch::kDouble), b = layer.bias.to(torch::kDouble);
    const double g = gamma_n(std::size_t(w.size(1)) + 1, kUnitRoundoffF32);
    e = e.matmul(w.abs().t()) + g * (a.abs().matmul(w.abs().t()) + b.abs());
    a = a.matmul(w.t()) + b;
    if (l + 1 < model.layers->size()) a = torch::relu(a);
  }
  return e.max().item<double>();
}

// Max |logits of the merged model - the trained model's| on the worker's fixed input, and the
// bound it must keep within.
Difference prediction_difference(const std::string& merged, const std::string& predict_file) {
  auto model = std::make_shared<Mlp>();
  torch::load(model, merged);
  const std::vector<float> saved = read_floats(predict_file);
  const std::size_t in = std::size_t(kRows) * kSizes.front();
  REQUIRE(saved.size() == in + std::size_t(kRows) * kSizes.back());
  const torch::Tensor x =
      torch::from_blob(const_cast<float*>(saved.data()), {kRows, kSizes.front()}).clone();
  const torch::Tensor expected =
      torch::from_blob(const_cast<float*>(saved.data() + in), {kRows, kSizes.back()}).clone();
  torch::NoGradGuard no_grad;
  const double limit = forward_bound(*model, x);
  model->to(torch::kDouble);
  const double d = (model->forward(x.to(torch::kDouble)) - expected.to(torch::kDouble))
                       .abs()
                       .max()
                       .item<double>();
  return {d, limit};
}

// Nothing named OUT or OUT.tmp-* beside it.
bool no_output(const fs::path& out) {
  if (fs::exists(out)) return false;
  for (const auto& e : fs::directory_iterator(out.parent_path()))
    if (e.path().filename().string().rfind(out.filename().string(), 0) == 0) return false;
  return true;
}

// zero_stage 0: DDP (or one process).
void save(int world, const std::string& dir, const std::string& predict, int zero_stage) {
  RanksOptions options;
  if (zero_stage > 0) options.env = zero_env(zero_stage);
  if (zero_stage == 3) options.env.emplace_back("ACCEL_ZERO3_PARAM_PERSISTENCE_THRESHOLD", "0");
  const auto r = run_ranks(world, "zero_resume_worker",
                           {"--phase", "save", "--dir", dir, "--predict", predict}, options);
  INFO(describe(r));
  REQUIRE(r.exit_code() == 0);
}

// Trains and saves at `world` ranks, merges the checkpoint (with `flags` first), and returns the
// merged model's max logit difference against the trained one; `output`: what merge-weights
// printed.
Difference merged_prediction_difference(int world, int zero_stage, std::string* output = nullptr,
                                        const std::vector<std::string>& flags = {}) {
  TempDir tmp("merge_weights_test");
  save(world, tmp / "ck", tmp / "predict.bin", zero_stage);
  std::vector<std::string> args = {"merge-weights"};
  args.insert(args.end(), flags.begin(), flags.end());
  args.insert(args.end(), {tmp / "ck", tmp / "model.pt"});
  const auto merged = run_accel(args);
  INFO(describe(merged));
  REQUIRE(merged.exit_code() == 0);
  if (output) *output = merged.workers.at(0).output;
  return prediction_difference(tmp / "model.pt", tmp / "predict.bin");
}

}  // namespace

TEST_CASE("merge-weights of a ZeRO-2 checkpoint of 4 ranks loads into a plain LibTorch model") {
  if (skip_unless(communicator_available("gloo"), "gloo communicator not built")) return;
  std::string output;
  const Difference d = merged_prediction_difference(4, 2, &output);
  MESSAGE("ZeRO-2 world 4 -> merge-weights -> torch::load: max |logits - trained| "
          << d.max_abs << " (limit " << d.limit << ")");
  CHECK(d.max_abs <= d.limit);
  // Its progress, piped: the final line, every parameter blob the MANIFEST lists read (the
  // shared "parameters" and the 4 ranks' "parameters.rankR").
  CHECK(output.find("accel merge-weights: parameter blobs 5/5 100%") != std::string::npos);
}

TEST_CASE("merge-weights of a ZeRO-3 checkpoint (each rank's slices only) loads the same way") {
  if (skip_unless(communicator_available("gloo"), "gloo communicator not built")) return;
  const Difference d = merged_prediction_difference(4, 3);
  MESSAGE("ZeRO-3 world 4 -> merge-weights -> torch::load: max |logits - trained| "
          << d.max_abs << " (limit " << d.limit << ")");
  CHECK(d.max_abs <= d.limit);
}

TEST_CASE("merge-weights of a single-process checkpoint gives the same model") {
  std::string output;
  const Difference d = merged_prediction_difference(1, 0, &output, {"--disable_progress_bar"});
  MESSAGE("world 1 -> merge-weights -> torch::load: max |logits - trained| "
          << d.max_abs << " (limit " << d.limit << ")");
  CHECK(d.max_abs <= d.limit);
  CHECK(output.find("parameter blobs") == std::string::npos);  // no progress bar
}

TEST_CASE("merge-weights refuses a damaged or missing checkpoint and writes nothing") {
  if (skip_unless(communicator_available("gloo"), "gloo communicator not built")) return;
  TempDir tmp("merge_weights_test");
  save(4, tmp / "ck", tmp / "predict.bin", 2);
  const fs::path out = tmp / "model.pt";
  auto expect_failure = [&](const std::string& dir, const std::string& message) {
    const auto r = run_accel({"merge-weights", dir, out.string()});
    INFO(describe(r));
    CHECK(r.exit_code() != 0);
    CHECK(r.workers.front().output.find(message) != std::string::npos);
    CHECK(no_output(out));
  };
  SUBCASE("a flipped byte in another rank's slice") {
    const std::string blob = tmp / "ck/parameters.rank2";
    std::string bytes = read_file(blob);
    bytes[bytes.size() / 2] ^= 0x01;
    write_file(blob, bytes);
    expect_failure(tmp / "ck", blob + ": checksum mismatch");
  }
  SUBCASE("a rank's slice missing") {
    fs::remove(tmp / "ck/parameters.rank1");
    expect_failure(tmp / "ck", tmp / "ck/parameters.rank1: missing");
  }
  SUBCASE("an output that cannot be written") {
    const fs::path nowhere = tmp / "no/such/dir/model.pt";
    const auto r = run_accel({"merge-weights", tmp / "ck", nowhere.string()});
    INFO(describe(r));
    CHECK(r.exit_code() != 0);
    CHECK(r.workers.front().output.find(nowhere.string() + ".tmp-") != std::string::npos);
    CHECK(r.workers.front().output.find("cannot create") != std::string::npos);
    CHECK(!fs::exists(tmp / "no"));
  }
  SUBCASE("no checkpoint at all") { expect_failure(tmp / "nowhere", "no checkpoint there"); }
  SUBCASE("a save that never finished (no MANIFEST)") {
    fs::remove(tmp / "ck/MANIFEST");
    expect_failure(tmp / "ck", "MANIFEST: missing");
  }
}

TEST_CASE(
    "merge-weights of a LibTorch adapter checkpoint (ZeRO-2, 2 ranks) copies its state.model") {
  if (skip_unless(communicator_available("gloo"), "gloo communicator not built")) return;
  TempDir tmp("merge_weights_test");
  RanksOptions options;
  options.env = zero_env(2);
  const auto trained =
      run_ranks(2, "torch_resume_worker", {"--epochs", "1", "--checkpoint", tmp / "ck"}, options);
  INFO(describe(trained));
  REQUIRE(trained.exit_code() == 0);
  const auto merged = run_accel({"merge-weights", tmp / "ck", tmp / "model.pt"});
  INFO(describe(merged));
  REQUIRE(merged.exit_code() == 0);
  CHECK(merged.workers.front().output.find("from state.model") != std::string::npos);
  CHECK(read_file(tmp / "model.pt") == read_file(tmp / "ck/state.model"));
}

TEST_CASE(
    "merge-weights of a SHARDED_STATE_DICT LibTorch checkpoint (ZeRO-2, 2 ranks): parameters "
    "and named BatchNorm buffers load into the plain model") {
  if (skip_unless(communicator_available("gloo"), "gloo communicator not built")) return;
  TempDir tmp("merge_weights_test");
  RanksOptions options;
  options.env = zero_env(2);
  options.env.emplace_back("ACCEL_STATE_DICT_TYPE", "SHARDED_STATE_DICT");
  const auto trained = run_ranks(
      2, "torch_resume_worker",
      {"--epochs", "1", "--checkpoint", tmp / "ck", "--out", tmp / "trained.bin"}, options);
  INFO(describe(trained));
  REQUIRE(trained.exit_code() == 0);
  CHECK_FALSE(fs::exists(tmp / "ck/state.model"));  // each rank's slices instead
  CHECK(fs::exists(tmp / "ck/parameters.rank1"));
  CHECK(read_file(tmp / "ck/parameters.layout").find("running_mean") != std::string::npos);
  const auto merged = run_accel({"merge-weights", tmp / "ck", tmp / "model.pt"});
  INFO(describe(merged));
  REQUIRE(merged.exit_code() == 0);
  CHECK(merged.workers.front().output.find("left out") == std::string::npos);
  const auto loaded = run_ranks(1, "torch_resume_worker",
                                {"--load_archive", tmp / "model.pt", "--out", tmp / "merged.bin"});
  INFO(describe(loaded));
  REQUIRE(loaded.exit_code() == 0);
  CHECK(read_file(tmp / "merged.bin") == read_file(tmp / "trained.bin"));
}
