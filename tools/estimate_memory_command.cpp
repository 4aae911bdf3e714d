// `accel estimate-memory`: per-rank bytes of parameters, gradients and optimizer state under
// DDP and ZeRO stages 1-3 for a parameter count (or a checkpoint's parameters), a world size
// and a precision, as a table (backends/zero/memory_estimate.hpp has the accounting).
//
//   accel estimate-memory --params 25M --world_size 2 [--precision bf16] [--optimizer adamw]
//   accel estimate-memory --checkpoint DIR --world_size 4 [--bytes]

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "accelerate/checkpointing/parameter_layout.hpp"
#include "backends/zero/memory_estimate.hpp"
#include "foundation/error.hpp"
#include "tools/commands.hpp"

namespace accel::tools {
namespace {

constexpr const char* kUsage =
    "usage: accel estimate-memory (--params N | --checkpoint DIR) [--world_size N]\n"
    "                             [--precision fp32|bf16|fp16] [--optimizer "
    "adam|adamw|sgd_momentum|sgd]\n"
    "                             [--bytes]\n"
    "  --params N       parameter count; K, M, B suffixes (25M = 25,000,000)\n"
    "  --checkpoint DIR count the parameters of a checkpoint saved by save_state\n"
    "  --bytes          exact byte counts instead of MiB/GiB\n";

std::uint64_t parse_count(const std::string& text) {
  std::size_t used = 0;
  double value = 0;
  try {
    value = std::stod(text, &used);
  } catch (const std::exception&) {
    throw ConfigError("accel estimate-memory: --params: '" + text + "' is not a count");
  }
  const std::string suffix = text.substr(used);
  double scale = 1;
  if (suffix == "K" || suffix == "k")
    scale = 1e3;
  else if (suffix == "M" || suffix == "m")
    scale = 1e6;
  else if (suffix == "B" || suffix == "b" || suffix == "G")
    scale = 1e9;
  else if (!suffix.empty())
    throw ConfigError("accel estimate-memory: --params: '" + text + "' has an unknown suffix");
  if (!(value >= 0)) throw ConfigError("accel estimate-memory: --params must not be negative");
  return std::uint64_t(value * scale + 0.5);
}

// The parameter count of a checkpoint's parameters.layout
// (accelerate/checkpointing/parameter_layout.hpp).
std::uint64_t checkpoint_params(const std::string& dir) {
  const std::string path = dir + "/parameters.layout";
  std::ifstream in(path);
  if (!in) throw ConfigError("accel estimate-memory: " + path + ": cannot be read");
  std::ostringstream text;
  text << in.rdbuf();
  ParameterLayout layout;
  try {
    layout = parse_layout(text.str(), path);
  } catch (const std::exception& e) {
    throw ConfigError(std::string("accel estimate-memory: ") + e.what());
  }
  std::uint64_t total = 0;
  for (const SavedParam& p : layout.params) total += p.count;
  return total;
}

std::string human(std::uint64_t bytes, bool exact) {
  char buf[64];
  if (exact)
    std::snprintf(buf, sizeof buf, "%llu", static_cast<unsigned long long>(bytes));
  else if (bytes >= (1ull << 30))
    std::snprintf(buf, sizeof buf, "%.2f GiB", double(bytes) / double(1ull << 30));
  else
    std::snprintf(buf, sizeof buf, "%.2f MiB", double(bytes) / double(1ull << 20));
  return buf;
}

}  // namespace

int run_estimate_memory_command(int argc, char** argv) {
  MemoryEstimateOptions options;
  std::string checkpoint;
  bool have_params = false, exact = false;
  for (int i = 0; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "-h" || flag == "--help") {
      std::fputs(kUsage, stdout);
      return 0;
    }
    if (flag == "--bytes") {
      exact = true;
      continue;
    }
    if (i + 1 >= argc)
      throw ConfigError("accel estimate-memory: " + flag + " needs a value\n" + kUsage);
    const std::string value = argv[++i];
    if (flag == "--params") {
      options.num_params = parse_count(value);
      have_params = true;
    } else if (flag == "--checkpoint") {
      checkpoint = value;
    } else if (flag == "--world_size" || flag == "--num_processes") {
      try {
        options.world_size = std::stoi(value);
      } catch (const std::exception&) {
        options.world_size = 0;
      }
      if (options.world_size < 1)
        throw ConfigError("accel estimate-memory: " + flag + ": '" + value +
                          "' is not a positive count");
    } else if (flag == "--precision" || flag == "--mixed_precision") {
      options.precision = value == "no" ? "fp32" : value;
    } else if (flag == "--optimizer") {
      options.optimizer = value;
    } else {
      throw ConfigError("accel estimate-memory: unknown flag " + flag + "\n" + kUsage);
    }
  }
  if (have_params == !checkpoint.empty())
    throw ConfigError(std::string("accel estimate-memory: give --params or --checkpoint\n") +
                      kUsage);
  if (!checkpoint.empty()) options.num_params = checkpoint_params(checkpoint);
  std::vector<MemoryEstimate> rows;
  int k = 0;
  try {
    k = optimizer_bytes_per_param(options);
    rows = estimate_memory(options);
  } catch (const InvalidArgument& e) {
    throw ConfigError(e.what());
  }
  std::printf(
      "%llu parameters, world size %d, precision %s, optimizer %s: K = %d bytes of "
      "optimizer state per parameter\n",
      static_cast<unsigned long long>(options.num_params), options.world_size,
      options.precision.c_str(), options.optimizer.c_str(), k);
  std::printf("%-8s %16s %16s %16s %16s\n", "strategy", "parameters", "gradients",
              "optimizer state", "total per rank");
  for (const MemoryEstimate& r : rows)
    std::printf("%-8s %16s %16s %16s %16s\n", r.strategy.c_str(),
                human(r.parameter_bytes, exact).c_str(), human(r.gradient_bytes, exact).c_str(),
                human(r.optimizer_bytes, exact).c_str(), human(r.total(), exact).c_str());
  return 0;
}

}  // namespace accel::tools
