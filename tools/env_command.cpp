// `accel env`: what a bug report needs -- versions of everything accelerate-cpp was built
// with and runs on, the machine (cores, memory, GPUs), and the config in effect with where
// each value came from. Never fails on a broken config: it prints the error in its place.

#include <gnu/libc-version.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <string>

#include "backends/comm/registry.hpp"
#include "config/resolve.hpp"
#include "foundation/error.hpp"
#include "foundation/host_cores.hpp"
#include "launch/summary.hpp"
#include "launch/worker_env.hpp"
#include "tools/commands.hpp"

#ifndef ACCEL_VERSION
#define ACCEL_VERSION "unknown"
#endif

namespace accel::tools {
namespace {

std::string compiler() {
#if defined(__clang__)
  return std::string("clang ") + __clang_version__;
#elif defined(__GNUC__)
  return std::string("gcc ") + __VERSION__;
#else
  return "unknown";
#endif
}

// "MemTotal: 24576 MB, MemAvailable: 23000 MB" from /proc/meminfo.
std::string memory() {
  std::ifstream in("/proc/meminfo");
  std::string name, unit, out;
  long long kb = 0;
  while (in >> name >> kb >> unit) {
    if (name == "MemTotal:" || name == "MemAvailable:")
      out += (out.empty() ? "" : ", ") + std::to_string(kb >> 20) + " GiB " +
             (name == "MemTotal:" ? "total" : "available");
  }
  return out.empty() ? "unknown" : out;
}

std::string os() {
  utsname u{};
  if (uname(&u) != 0) return "unknown";
  return std::string(u.sysname) + " " + u.release + " " + u.machine + ", glibc " +
         gnu_get_libc_version();
}

void row(const std::string& name, const std::string& value) {
  std::printf("- %-26s %s\n", (name + ":").c_str(), value.c_str());
}

}  // namespace

int run_env_command(int argc, char** argv) {
  std::optional<std::string> config_file;
  for (int i = 0; i < argc; ++i) {
    const std::string arg(argv[i]);
    if (arg == "-h" || arg == "--help") {
      std::puts(
          "usage: accel env [--config_file FILE]\n"
          "Prints versions, the machine, and the config in effect, for bug reports.");
      return 0;
    }
    if (arg == "--config_file" && i + 1 < argc)
      config_file = argv[++i];
    else if (arg.starts_with("--config_file="))
      config_file = arg.substr(14);
    else
      throw ConfigError("accel env: unknown argument " + arg);
  }

  std::puts("Copy-and-paste the text below in your GitHub issue.\n");
  row("accelerate-cpp version", ACCEL_VERSION);
  row("Compiler", compiler());
  row("Platform", os());
#ifdef ACCEL_TORCH_VERSION
  row("LibTorch (built with)", ACCEL_TORCH_VERSION);
#else
  row("LibTorch", "not built in (ACCEL_WITH_TORCH=OFF or libtorch-dev not found)");
#endif
#ifdef ACCEL_GLOO_VERSION
  row("Gloo (built with)", ACCEL_GLOO_VERSION);
#else
  row("Gloo", "not built in (ACCEL_WITH_GLOO=OFF)");
#endif
#ifdef ACCEL_MPI_VERSION
  row("MPI standard (built with)", ACCEL_MPI_VERSION);
#else
  row("MPI", "not built in (ACCEL_WITH_MPI=OFF)");
#endif
#ifdef ACCEL_CUDA_VERSION
  row("CUDA toolkit (built with)", ACCEL_CUDA_VERSION);
#else
  row("NCCL / CUDA", "not built in (ACCEL_WITH_NCCL=OFF)");
#endif
  for (const auto& [name, value] : communicator_library_versions()) row(name, value);
  std::string comms;
  for (const auto& c : available_communicators()) comms += (comms.empty() ? "" : ", ") + c;
  row("Communicators", comms);
  row("CPU cores", std::to_string(usable_cores()) + " usable of " + std::to_string(online_cores()));
  row("Memory", memory());

  std::puts("\nConfig in effect (command line > environment > config file > default):");
  try {
    const auto resolved = config::resolve_config(config_file, {});
    std::fputs(launch::describe_settings(resolved, "  ").c_str(), stdout);
    for (const auto& w : launch::guess_warnings(resolved)) std::printf("  %s\n", w.c_str());
  } catch (const Error& e) {
    std::printf("  error: %s\n", e.what());
  }
  return 0;
}

}  // namespace accel::tools
