// `accel launch [options] PROGRAM [ARGS...]`: parses the flags into LaunchOptions.

#include <charconv>
#include <cstdio>
#include <string>
#include <string_view>

#include "backends/comm/error.hpp"
#include "launch/launcher.hpp"
#include "tools/commands.hpp"

namespace accel::tools {
namespace {

void usage(std::FILE* out) {
  std::fputs(
      "usage: accel launch [--num_processes N] [--main_process_ip IP] [--main_process_port P]\n"
      "                    [--comm_backend gloo|mpi|nccl] [-q|--quiet] PROGRAM [ARGS...]\n",
      out);
}

int parse_int(std::string_view flag, const char* value) {
  int out = 0;
  const std::string_view text(value);
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), out);
  if (ec != std::errc() || ptr != text.data() + text.size())
    throw ConfigError("accel launch: " + std::string(flag) + " expects an integer, got '" +
                      std::string(text) + "'");
  return out;
}

}  // namespace

int run_launch_command(int argc, char** argv) {
  launch::LaunchOptions options;
  int i = 0;
  for (; i < argc; ++i) {
    const std::string_view arg(argv[i]);
    if (arg == "--") {
      ++i;
      break;
    }
    if (!arg.starts_with("-")) break;  // the program: everything from here is its own
    if (arg == "-q" || arg == "--quiet") {
      options.quiet = true;
      continue;
    }
    if (arg == "-h" || arg == "--help") {
      usage(stdout);
      return 0;
    }
    if (i + 1 >= argc) throw ConfigError("accel launch: " + std::string(arg) + " needs a value");
    const char* value = argv[++i];
    if (arg == "--num_processes") options.num_processes = parse_int(arg, value);
    else if (arg == "--main_process_ip") options.main_process_ip = value;
    else if (arg == "--main_process_port") options.main_process_port = parse_int(arg, value);
    else if (arg == "--comm_backend") options.comm_backend = value;
    else throw ConfigError("accel launch: unknown option " + std::string(arg));
  }
  for (; i < argc; ++i) options.program.emplace_back(argv[i]);
  return launch::launch(options);
}

}  // namespace accel::tools
