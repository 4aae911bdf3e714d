// One rank of the full-optimizer-state check (torch_accelerator_test), written as a user's
// program is: no try/catch, a plain torch::nn::Module (not Cloneable), upstream's Adam.
//   torch_full_state_worker DIR
// Trains 3 steps on the global batches (each rank its share), saves the optimizer with
// acc.save(optimizer, DIR/optimizer.pt) and the model's values, trains 3 more. The main process
// then loads both into a plain model and a plain torch::optim::Adam (torch::load), steps them
// 3 times on the same global batches and compares with the accelerated run, within the fp64
// Adam bound of tests/support/tolerance.hpp; a plain Adam without the loaded state must end
// outside it (the check can fail). Gives the verdict "full optimizer state" (exit 1 when not ok).
//   torch_full_state_worker DIR --replica_factory
// The same model prepared with a factory for DATA_PARALLEL's replicas (prepare(net, adam,
// [] { return Net(); })); without it, DATA_PARALLEL refuses the module: the refusal escapes
// main() and must end the program cleanly (accelerate/process/uncaught_error.hpp), as must
// acc.save(optimizer) under state_dict_type SHARDED_STATE_DICT.

#include <cstdio>
#include <filesystem>
#include <string>

#include <torch/torch.h>

#include "accelerate/torch/torch_accelerator.hpp"
#include "tests/support/tolerance.hpp"
#include "tests/support/worker.hpp"

namespace {

constexpr std::int64_t kIn = 12, kHidden = 16, kClasses = 5, kPerRank = 4;
constexpr double kLr = 0.01;

struct Net : torch::nn::Module {  // as upstream examples write models: not Cloneable
  Net()
      : fc1(register_module("fc1", torch::nn::Linear(kIn, kHidden))),
        fc2(register_module("fc2", torch::nn::Linear(kHidden, kClasses))) {}
  torch::Tensor forward(const torch::Tensor& x) { return fc2(torch::tanh(fc1(x))); }
  torch::nn::Linear fc1, fc2;
};

struct Batch {
  torch::Tensor x, y;
};

Batch global_batch(int step, int world) {  // the same samples whatever the world size
  torch::manual_seed(1000 + step);
  return {torch::randn({kPerRank * world, kIn}, torch::kDouble),
          torch::randint(kClasses, {kPerRank * world})};
}

torch::Tensor flat(const std::vector<torch::Tensor>& tensors) {
  std::vector<torch::Tensor> parts;
  for (const auto& t : tensors) parts.push_back(t.detach().flatten());
  return torch::cat(parts);
}

std::vector<torch::Tensor> values_of(
    const std::vector<std::pair<std::string, torch::Tensor>>& state_dict) {
  std::vector<torch::Tensor> out;
  for (const auto& [name, value] : state_dict) out.push_back(value);
  return out;
}

// The plain program from the saved point: a fresh model given the saved values, a plain Adam
// (with the saved state when `load` is set), 3 steps on the global batches.
torch::Tensor plain_continuation(const std::vector<torch::Tensor>& saved, const std::string& file,
                                 bool load, int world) {
  Net plain;
  plain.to(torch::kDouble);
  {
    torch::NoGradGuard no_grad;
    const auto params = plain.parameters();
    for (std::size_t i = 0; i < params.size(); ++i) params[i].copy_(saved[i]);
  }
  torch::optim::Adam adam(plain.parameters(), torch::optim::AdamOptions(kLr));
  if (load) torch::load(adam, file);
  for (int step = 3; step < 6; ++step) {
    const Batch b = global_batch(step, world);
    adam.zero_grad();
    torch::nn::functional::cross_entropy(plain.forward(b.x), b.y).backward();
    adam.step();
  }
  return flat(plain.parameters());
}

}  // namespace

int main(int argc, char** argv) {
  torch::set_num_threads(1);
  const accel::test::WorkerFlags flags(argc, argv);
  const std::string dir = flags.text("dir", ".");
  const bool factory = flags.has("replica_factory");
  const std::string file = (std::filesystem::path(dir) / "optimizer.pt").string();
  accel::TorchAccelerator acc;
  const int world = acc.num_processes(), rank = acc.process_index();
  torch::manual_seed(7);
  Net net;
  net.to(torch::kDouble);
  torch::optim::Adam adam(net.parameters(), torch::optim::AdamOptions(kLr));
  auto [model, optimizer] =
      factory ? acc.prepare(net, adam, [] { return Net(); }) : acc.prepare(net, adam);
  auto train = [&](int from, int to) {
    for (int step = from; step < to; ++step) {
      const Batch b = global_batch(step, world);
      optimizer.zero_grad();
      acc.backward(
          torch::nn::functional::cross_entropy(model(b.x.narrow(0, rank * kPerRank, kPerRank)),
                                               b.y.narrow(0, rank * kPerRank, kPerRank)));
      optimizer.step();
    }
  };
  train(0, 3);
  acc.save(optimizer, file);
  const std::vector<torch::Tensor> saved = values_of(acc.get_state_dict(model));
  train(3, 6);
  const torch::Tensor ours = flat(values_of(acc.get_state_dict(model)));
  if (!acc.is_main_process()) return 0;
  const double diff =
      (ours - plain_continuation(saved, file, true, world)).abs().max().item<double>();
  const double fresh =
      (ours - plain_continuation(saved, file, false, world)).abs().max().item<double>();
  // 3 Adam steps (fp64) after the saved point, each gradient a mean of the global batch's rows
  // reduced over `world` partials (forward inner products of kHidden + 1 terms). Terms: softmax
  // errors below 2 times tanh features below 1, or randn inputs below 6 times fc2 weights
  // below 1 (kClasses of them): below 100.
  const double limit = accel::test::adam_reordering_bound(
      {.lr = kLr,
       .steps = 3,
       .longest_sum = std::size_t(kPerRank * world + kHidden + 1 + world),
       .magnitude = 100});
  const bool ok = diff <= limit && fresh > limit;
  char line[200];
  std::snprintf(line, sizeof line,
                "%s, world %d: max |diff| %.3g with the loaded state, %.3g without (limit %.3g)",
                std::string(acc.strategy().name()).c_str(), world, diff, fresh, limit);
  accel::test::VerdictLog verdicts;
  verdicts.check(ok, "full optimizer state", line);
  return verdicts.exit_code();
}
