// main() of the `accel` command: parsing and dispatch only.

#include <cstdio>
#include <cstring>
#include <string>

#include <unistd.h>

#include "backends/comm/error.hpp"
#include "tools/commands.hpp"

namespace {

constexpr int kUsageError = 2;

// This executable, for commands that run it again (accel test): /proc/self/exe survives a
// relative argv[0] and a changed directory.
std::string self_path(const char* argv0) {
  char buf[4096];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  return n > 0 ? std::string(buf, std::size_t(n)) : std::string(argv0);
}

void usage(std::FILE* out) {
  std::fputs(
      "usage: accel COMMAND [ARGS...]\n"
      "commands:\n"
      "  launch   start a training program on every process of the job\n"
      "  config   write, show or check the config `accel launch` reads\n"
      "  env      print versions, the machine and the config in effect (for bug reports)\n"
      "  test     run a distributed self-check under the config in effect\n"
      "  estimate-memory  per-rank memory of DDP and ZeRO stages 1-3 for a model size\n"
      "  merge-weights    a checkpoint's full weights (any strategy and world size) as a\n"
      "                   LibTorch archive that torch::load reads\n",
      out);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || std::strcmp(argv[1], "-h") == 0 || std::strcmp(argv[1], "--help") == 0) {
    usage(argc < 2 ? stderr : stdout);
    return argc < 2 ? kUsageError : 0;
  }
  try {
    if (std::strcmp(argv[1], "launch") == 0) return accel::tools::run_launch_command(argc - 2, argv + 2);
    if (std::strcmp(argv[1], "env") == 0) return accel::tools::run_env_command(argc - 2, argv + 2);
    if (std::strcmp(argv[1], "test") == 0)
      return accel::tools::run_test_command(argc - 2, argv + 2, self_path(argv[0]).c_str());
    if (std::strcmp(argv[1], "estimate-memory") == 0)
      return accel::tools::run_estimate_memory_command(argc - 2, argv + 2);
    if (std::strcmp(argv[1], "merge-weights") == 0)
      return accel::tools::run_merge_weights_command(argc - 2, argv + 2);
    if (std::strcmp(argv[1], "config") == 0) return accel::tools::run_config_command(argc - 2, argv + 2);
    std::fprintf(stderr, "accel: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return kUsageError;
  } catch (const accel::ConfigError& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return kUsageError;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "accel: %s\n", e.what());
    return 1;
  }
}
