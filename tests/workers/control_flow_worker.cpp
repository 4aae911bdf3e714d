// One rank of control_flow_test: what a converted LibTorch loop does across ranks.
//   control_flow_worker seed --seed SEED [--seed_on_rank1 S] [--device_specific] [--no_set_seed]
//     set_seed, then torch::randn: prints "draws: " and the values in hex (exact).
//   control_flow_worker early_stop [--break_alone] [--after_loop exit|barrier|work]
//                      [--timeout_ms MS]
//     a DDP regression whose stop condition only rank 1 can meet (rank 0's targets are
//     noisy, so its batch loss stays far above the threshold; rank 1's are exact): with
//     set_trigger / check_trigger every rank leaves at the same step; with --break_alone
//     rank 1 simply breaks, then exits, waits in a barrier or works on without collectives,
//     while rank 0 trains on.
//   control_flow_worker print
//     acc.print's forms, on_main_process and on_local_main_process.
// Exits 0 when the loop ran to its end, 1 on an error (its message printed).

#include <cstdio>
#include <string>
#include <thread>

#include <torch/torch.h>

#include "accelerate/torch/torch_accelerator.hpp"
#include "tests/support/worker.hpp"

using namespace accel;

namespace {

int seed_check(const test::WorkerFlags& flags) {
  flags.only({"seed", "seed_on_rank1", "device_specific", "no_set_seed"});
  if (!flags.has("seed")) throw std::invalid_argument("control_flow_worker seed: no --seed");
  TorchAccelerator acc;
  const auto seed = std::uint64_t(flags.integer("seed"));
  const std::uint64_t mine = acc.process_index() == 1
                                 ? std::uint64_t(flags.integer("seed_on_rank1", (long long)seed))
                                 : seed;
  if (!flags.has("no_set_seed")) acc.set_seed(mine, flags.has("device_specific"));
  const torch::Tensor draws = torch::randn({6}, torch::kDouble);
  std::printf("draws:");
  for (std::int64_t i = 0; i < draws.numel(); ++i) std::printf(" %a", draws[i].item<double>());
  std::printf("\nseed: %llu\n", static_cast<unsigned long long>(acc.seed()));
  return 0;
}

int early_stop(const test::WorkerFlags& flags) {
  flags.only({"break_alone", "after_loop", "timeout_ms"});
  AcceleratorOptions options;
  if (flags.has("timeout_ms")) options.timeout = Milliseconds(flags.integer("timeout_ms"));
  TorchAccelerator acc(options);
  const bool break_alone = flags.has("break_alone");
  const int rank = acc.process_index();
  acc.set_seed(7, /*device_specific=*/true);  // each rank draws its own batches
  torch::nn::Linear net(4, 1);
  net->to(torch::kDouble);
  torch::optim::SGD sgd(net->parameters(), 0.1);
  auto [model, opt] = acc.prepare(net, sgd);
  const torch::Tensor w = torch::tensor({1.0, -2.0, 0.5, 3.0}, torch::kDouble).view({4, 1});
  // Rank 0's noise (std 0.3) keeps its batch MSE near 0.09, rank 1's exact targets let its
  // loss fall to the weights' small fluctuation: only rank 1 ever sees a loss below 0.01.
  const double threshold = 0.01;
  const int max_steps = 300;
  int left_at = -1;
  bool seen = false;
  for (int step = 0; step < max_steps; ++step) {
    const torch::Tensor x = torch::randn({16, 4}, torch::kDouble);
    torch::Tensor y = x.mm(w);
    if (rank == 0) y = y + 0.3 * torch::randn({16, 1}, torch::kDouble);
    opt.zero_grad();
    const torch::Tensor loss = torch::mse_loss(model(x), y);
    const bool stop_here = loss.item<double>() < threshold;
    if (stop_here && !seen)
      std::printf("rank %d: the stop condition held at step %d\n", rank, step);
    seen = seen || stop_here;
    if (!break_alone && stop_here) acc.set_trigger();
    // Alone: this rank leaves, the other trains on. Triggered: every rank leaves here.
    if (break_alone ? stop_here : acc.check_trigger()) {
      left_at = step;
      break;
    }
    acc.backward(loss);
    opt.step();
  }
  std::printf("rank %d: left the loop at step %d\n", rank, left_at);
  std::fflush(stdout);
  if (!break_alone)
    std::printf("rank %d: check_trigger after the loop: %s\n", rank,
                acc.check_trigger() ? "true" : "false");
  const std::string after = flags.text("after_loop", "exit");
  if (after == "barrier") acc.wait_for_everyone();
  // Work without collectives (an evaluation, a save) for longer than any test waits.
  if (after == "work") std::this_thread::sleep_for(std::chrono::seconds(120));
  std::printf("rank %d: done\n", rank);
  return 0;
}

int print_check() {
  TorchAccelerator acc;
  const int rank = acc.process_index();
  acc.print("printf form: step %d loss %.3f\n", 3, 0.25);
  acc.print("streaming form: loss ", 0.25, " at step ", 3);
  acc.print(std::string("a std::string, then "), 42u, ' ', -1.5f);
  acc.print("ends its own line\n");
  acc.on_main_process([&] { std::printf("on_main_process ran on rank %d\n", rank); });
  acc.on_local_main_process(
      [&] { std::printf("on_local_main_process ran on rank %d\n", acc.process_index()); });
  std::fflush(stdout);
  // Training metrics (accelerator.hpp's recipe): each rank's mean loss reduced on every rank,
  // printed once; as a raw value and as a LibTorch loss tensor.
  double loss = 1.0 + rank;
  acc.reduce(buffer_of(std::span(&loss, 1)), ReduceOp::avg);
  acc.print("mean loss ", loss);
  const torch::Tensor loss_tensor = torch::tensor(1.0 + rank, torch::kDouble);
  acc.print("mean loss tensor ", acc.reduce(loss_tensor.detach(), ReduceOp::avg).item<double>());
  return 0;
}

// A second accelerator while the first lives: refused at its construction, naming the fix, and
// the first keeps working.
int second_accelerator() {
  accel::TorchAccelerator first;
  try {
    accel::TorchAccelerator second;
    accel::test::VerdictLog().check(false, "a second accelerator is refused", "it was made");
    return 1;
  } catch (const accel::InvalidArgument& e) {
    std::printf("refused: %s\n", e.what());
  }
  first.wait_for_everyone();
  accel::test::VerdictLog().check(true, "the first accelerator still works");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  torch::set_num_threads(1);
  const std::string mode = argc > 1 ? argv[1] : "";
  try {
    // The mode, then its flags: WorkerFlags reads argv from the one after the mode.
    const test::WorkerFlags flags(argc > 1 ? argc - 1 : argc, argc > 1 ? argv + 1 : argv);
    if (mode == "seed") return seed_check(flags);
    if (mode == "early_stop") return early_stop(flags);
    if (mode == "print" || mode == "second_accelerator") flags.only({});
    if (mode == "print") return print_check();
    if (mode == "second_accelerator") return second_accelerator();
    std::fprintf(stderr,
                 "usage: control_flow_worker seed --seed SEED ... | early_stop ... | print\n");
    return 2;
  } catch (const std::exception& e) {
    std::printf("error: %s\n", e.what());
    return 1;
  }
}
