// One rank of the LibTorch two-backward check (torch_accelerator_test): a loop that calls
// acc.backward twice before one optimizer step, without configured accumulation (a GAN's
// discriminator: a real batch, then a fake one), must step on the sum of both gradients under
// every strategy, as plain LibTorch does (gradients accumulate in .grad() until zero_grad).
// Compared with the same steps by plain LibTorch on the global batches, in this program.
// --no_sync: the first backward under acc.no_sync(model) (its gradients only accumulate
// locally; the second backward synchronises both), with the same result.
// Gives the verdicts "two backwards per step equal plain LibTorch" and "no_sync communicates
// nothing"; exits 1 on a failure.

#include <cstdio>
#include <string>

#include <torch/torch.h>

#include "accelerate/torch/torch_accelerator.hpp"
#include "tests/support/tolerance.hpp"
#include "tests/support/worker.hpp"

using namespace accel;

namespace {

struct NetImpl : torch::nn::Cloneable<NetImpl> {
  NetImpl() { reset(); }
  void reset() override {
    fc1 = register_module("fc1", torch::nn::Linear(16, 32));
    fc2 = register_module("fc2", torch::nn::Linear(32, 10));
  }
  torch::Tensor forward(const torch::Tensor& x) { return fc2(torch::relu(fc1(x))); }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
};
TORCH_MODULE(Net);

torch::Tensor flat(torch::nn::Module& m) {
  std::vector<torch::Tensor> parts;
  for (const auto& p : m.parameters()) parts.push_back(p.detach().flatten().to(torch::kDouble));
  return torch::cat(parts);
}

}  // namespace

int main(int argc, char** argv) {
  torch::set_num_threads(1);
  const bool no_sync = accel::test::WorkerFlags(argc, argv).has("no_sync");
  try {
    TorchAccelerator acc;
    const int world = acc.num_processes(), rank = acc.process_index();
    torch::manual_seed(100 + rank);  // prepare gives every rank rank 0's parameters
    Net net;
    torch::manual_seed(100);
    Net plain;
    // fp64: LibTorch's kernels depend on the CPU (tests/support/tolerance.hpp).
    net->to(torch::kDouble);
    plain->to(torch::kDouble);
    const auto sgd = torch::optim::SGDOptions(0.1).momentum(0.9);
    torch::optim::SGD optimizer(net->parameters(), sgd), plain_optimizer(plain->parameters(), sgd);
    auto [model, opt] = acc.prepare(net, optimizer);

    const std::int64_t per_rank = 4, global = per_rank * world;
    bool quiet = true;  // --no_sync: its backwards issued no collective
    for (int step = 0; step < 20; ++step) {
      torch::manual_seed(1000 + step);  // the same global batches whatever the world size
      const torch::Tensor real = torch::randn({global, 16}, torch::kDouble),
                          fake = torch::randn({global, 16}, torch::kDouble) + 0.5;
      const torch::Tensor real_y = torch::randint(10, {global}),
                          fake_y = torch::randint(10, {global});
      opt.zero_grad();
      const auto first = [&] {
        acc.backward(
            torch::nn::functional::cross_entropy(model(real.narrow(0, rank * per_rank, per_rank)),
                                                 real_y.narrow(0, rank * per_rank, per_rank)));
      };
      if (no_sync) {
        auto local = acc.no_sync(model);
        const std::uint64_t before = acc.comm().next_sequence();
        first();
        quiet &= acc.comm().next_sequence() == before;  // no collective at all
      } else {
        first();
      }
      acc.backward(
          torch::nn::functional::cross_entropy(model(fake.narrow(0, rank * per_rank, per_rank)),
                                               fake_y.narrow(0, rank * per_rank, per_rank)));
      opt.step();
      plain_optimizer.zero_grad();
      torch::nn::functional::cross_entropy(plain(real), real_y).backward();
      torch::nn::functional::cross_entropy(plain(fake), fake_y).backward();
      plain_optimizer.step();
    }
    const double diff = (flat(*net) - flat(*plain)).abs().max().item<double>();
    // The first-order bound of tests/support/tolerance.hpp in fp64, the terms as in
    // two_backward_worker (2 backwards x `global` rows, magnitude under 10). Losing a
    // backward's gradient moves parameters by ~1e-1 per step.
    const double limit = test::reordering_bound({.lr = 0.1,
                                                 .momentum = 0.9,
                                                 .steps = 20,
                                                 .longest_sum = std::size_t(2 * global),
                                                 .magnitude = 10,
                                                 .unit_roundoff = test::kUnitRoundoffF64});
    char line[200];
    std::snprintf(line, sizeof line,
                  "max |diff| %.3g (limit %.3g), fc1.weight sum %.4f (plain %.4f, %s, world %d%s)",
                  diff, limit, net->fc1->weight.sum().item<double>(),
                  plain->fc1->weight.sum().item<double>(),
                  std::string(acc.strategy().name()).c_str(), world, no_sync ? ", no_sync" : "");
    accel::test::VerdictLog verdicts;
    verdicts.check(diff <= limit, "two backwards per step equal plain LibTorch", line);
    verdicts.check(quiet, "no_sync communicates nothing");
    return verdicts.exit_code();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "torch_two_backward_worker: %s\n", e.what());
    return 2;
  }
}
