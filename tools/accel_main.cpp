// main() of the `accel` command: parsing and dispatch only.

#include <cstdio>
#include <cstring>
#include <string>

#include "backends/comm/error.hpp"
#include "tools/commands.hpp"

namespace {

constexpr int kUsageError = 2;

void usage(std::FILE* out) {
  std::fputs(
      "usage: accel COMMAND [ARGS...]\n"
      "commands:\n"
      "  launch   start a training program on every process of the job\n",
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
