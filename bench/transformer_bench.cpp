// transformer_bench: training steps of a LibTorch transformer (tests/support/tiny_transformer.hpp,
// sized by the flags) under the config's strategy, started by `accel launch`: the model's
// parameter count, the median step time after the first step, and the peak resident memory
// of every rank (getrusage). bench/run_transformer_bench.sh runs the table in bench/README.md
// and the ZeRO-3 demonstration (a model DDP cannot hold at world 4 on this machine).
//   transformer_bench [--width W] [--hidden H] [--blocks B] [--vocab V] [--context T]
//                     [--batch ROWS] [--steps N] [--units root|automatic|wrapper]
// (root: auto_wrap_policy NO_WRAP; automatic: the blocks' ModuleList children as units)
// Memory that runs out (a process limit, `ulimit -v`) ends the run with "out of memory on rank
// R: ..." and exit code 2 instead of a crash or swapping.

#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <new>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "accelerate/torch/torch_accelerator.hpp"
#include "tests/support/tiny_transformer.hpp"

using namespace accel;
using namespace accel::test;

namespace {

double peak_rss_gib() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return double(usage.ru_maxrss) / (1024.0 * 1024.0);  // KiB
}

bool out_of_memory(const std::exception& e) {
  const std::string what = e.what();
  return dynamic_cast<const std::bad_alloc*>(&e) != nullptr ||
         what.find("can't allocate memory") != std::string::npos ||
         what.find("out of memory") != std::string::npos;
}

}  // namespace

int main(int argc, char** argv) {
  TransformerShape shape{.vocab = 1024, .context = 16, .width = 256, .hidden = 1024, .blocks = 4};
  std::int64_t batch = 4;
  int steps = 5;
  Units units = Units::wrapper;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    const std::string value = argv[i + 1];
    if (flag == "--width")
      shape.width = std::stoll(value);
    else if (flag == "--hidden")
      shape.hidden = std::stoll(value);
    else if (flag == "--blocks")
      shape.blocks = std::stoll(value);
    else if (flag == "--vocab")
      shape.vocab = std::stoll(value);
    else if (flag == "--context")
      shape.context = std::stoll(value);
    else if (flag == "--batch")
      batch = std::stoll(value);
    else if (flag == "--steps")
      steps = std::stoi(value);
    else if (flag == "--units")
      units = units_named(value);
  }
  int rank = -1;
  try {
    AcceleratorOptions options;
    if (units == Units::root) options.auto_wrap_policy = "NO_WRAP";
    TorchAccelerator acc(options);
    rank = acc.process_index();
    torch::manual_seed(1);
    Transformer model(shape, units == Units::wrapper);
    std::int64_t parameters = 0;
    for (const auto& p : model->parameters()) parameters += p.numel();
    parameters -= shape.vocab * shape.width;  // the tied weight, listed twice
    torch::optim::AdamW adamw(model->parameters(), torch::optim::AdamWOptions(1e-4));
    auto [net, opt] = acc.prepare(model, adamw);
    const torch::Tensor tokens =
        torch::randint(shape.vocab, {batch, shape.context + 1}, torch::kLong);
    const torch::Tensor ids = tokens.narrow(1, 0, shape.context);
    const torch::Tensor next = tokens.narrow(1, 1, shape.context);
    std::vector<double> seconds;
    for (int s = 0; s < steps; ++s) {
      const auto start = std::chrono::steady_clock::now();
      opt.zero_grad();
      const torch::Tensor logits = net(ids);
      acc.backward(torch::nn::functional::cross_entropy(logits.reshape({-1, shape.vocab}),
                                                        next.reshape({-1})));
      opt.step();
      seconds.push_back(
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
      acc.print("step " + std::to_string(s + 1) + ": " + std::to_string(seconds.back()) + " s");
    }
    std::vector<double> later(seconds.begin() + (seconds.size() > 1 ? 1 : 0), seconds.end());
    std::sort(later.begin(), later.end());
    const double median = later[later.size() / 2];
    const torch::Tensor rss = acc.gather(torch::tensor({peak_rss_gib()}, torch::kDouble));
    std::string per_rank;
    for (std::int64_t r = 0; r < rss.size(0); ++r)
      per_rank += (r ? ", " : "") + std::to_string(rss[r].item<double>()).substr(0, 5);
    const std::string strategy(acc.strategy().name());
    const char* unit_form = strategy != "zero3"         ? "-"
                            : units == Units::wrapper   ? "blocks"
                            : units == Units::automatic ? "automatic"
                                                        : "root";
    char line[400];
    std::snprintf(line, sizeof line, "| %d | %s | %s | %.1fM | %.3f s | %s GiB |",
                  acc.num_processes(), strategy.c_str(), unit_form, double(parameters) / 1e6,
                  median, per_rank.c_str());
    acc.print("| world | strategy | units | parameters | median step | peak RSS per rank |");
    acc.print(line);
    return 0;
  } catch (const c10::Error& e) {  // LibTorch's: its message without the backtrace
    const std::string what = e.what_without_backtrace();
    if (what.find("can't allocate memory") != std::string::npos) {
      std::fprintf(stderr, "out of memory on rank %d (peak RSS %.2f GiB): %s\n", rank,
                   peak_rss_gib(), what.c_str());
      return 2;
    }
    std::fprintf(stderr, "transformer_bench: rank %d: %s\n", rank, what.c_str());
    return 1;
  } catch (const std::exception& e) {
    if (out_of_memory(e)) {
      std::fprintf(stderr, "out of memory on rank %d (peak RSS %.2f GiB): %s\n", rank,
                   peak_rss_gib(), e.what());
      return 2;
    }
    std::fprintf(stderr, "transformer_bench: rank %d: %s\n", rank, e.what());
    return 1;
  }
}
