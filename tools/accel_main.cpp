// main() of the `accel` command: parsing and dispatch only.

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include <unistd.h>

#include "foundation/error.hpp"
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

// `accel merge-weights` writes LibTorch archives, so it lives in its own program linked with
// LibTorch (built next to accel when LibTorch is found): every other command then starts
// without loading LibTorch's libraries (0.7 s here).
int run_merge_weights_program(const std::string& self, char** args) {
  const std::string program =
      (std::filesystem::path(self).parent_path() / "accel-merge-weights").string();
  if (::access(program.c_str(), X_OK) != 0) {
    std::fprintf(stderr,
                 "accel merge-weights: this build of accel has no LibTorch (configured without "
                 "ACCEL_WITH_TORCH: %s is missing), so it cannot write a LibTorch archive\n",
                 program.c_str());
    return 1;
  }
  std::vector<char*> argv = {const_cast<char*>(program.c_str())};
  for (char** a = args; *a != nullptr; ++a) argv.push_back(*a);
  argv.push_back(nullptr);
  ::execv(program.c_str(), argv.data());
  std::fprintf(stderr, "accel merge-weights: cannot run %s: %s\n", program.c_str(),
               std::strerror(errno));
  return 1;
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
      "                   LibTorch archive that torch::load reads\n"
      "  store    serve an elastic job's rendezvous store on a machine of its own\n",
      out);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || std::strcmp(argv[1], "-h") == 0 || std::strcmp(argv[1], "--help") == 0) {
    usage(argc < 2 ? stderr : stdout);
    return argc < 2 ? kUsageError : 0;
  }
  try {
    if (std::strcmp(argv[1], "launch") == 0)
      return accel::tools::run_launch_command(argc - 2, argv + 2);
    if (std::strcmp(argv[1], "env") == 0) return accel::tools::run_env_command(argc - 2, argv + 2);
    if (std::strcmp(argv[1], "test") == 0)
      return accel::tools::run_test_command(argc - 2, argv + 2, self_path(argv[0]).c_str());
    if (std::strcmp(argv[1], "estimate-memory") == 0)
      return accel::tools::run_estimate_memory_command(argc - 2, argv + 2);
    if (std::strcmp(argv[1], "merge-weights") == 0)
      return run_merge_weights_program(self_path(argv[0]), argv + 2);
    if (std::strcmp(argv[1], "config") == 0)
      return accel::tools::run_config_command(argc - 2, argv + 2);
    if (std::strcmp(argv[1], "store") == 0)
      return accel::tools::run_store_command(argc - 2, argv + 2);
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
