// main() of the `accel` command: parsing and dispatch only.
//   accel launch [--num_processes N] [--main_process_ip IP] [--main_process_port P]
//                [--comm_backend gloo|mpi|nccl] [-q] PROGRAM [ARGS...]

#include <charconv>
#include <cstdio>
#include <cstring>
#include <string>
#include <string_view>

#include "backends/comm/error.hpp"
#include "launch/launcher.hpp"

namespace {

constexpr int kUsageError = 2;

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
    throw accel::ConfigError("accel launch: " + std::string(flag) + " expects an integer, got '" +
                             std::string(text) + "'");
  return out;
}

int run_launch(int argc, char** argv) {
  accel::launch::LaunchOptions options;
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
    if (i + 1 >= argc) throw accel::ConfigError("accel launch: " + std::string(arg) + " needs a value");
    const char* value = argv[++i];
    if (arg == "--num_processes") options.num_processes = parse_int(arg, value);
    else if (arg == "--main_process_ip") options.main_process_ip = value;
    else if (arg == "--main_process_port") options.main_process_port = parse_int(arg, value);
    else if (arg == "--comm_backend") options.comm_backend = value;
    else throw accel::ConfigError("accel launch: unknown option " + std::string(arg));
  }
  for (; i < argc; ++i) options.program.emplace_back(argv[i]);
  return accel::launch::launch(options);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || std::strcmp(argv[1], "-h") == 0 || std::strcmp(argv[1], "--help") == 0) {
    usage(argc < 2 ? stderr : stdout);
    return argc < 2 ? kUsageError : 0;
  }
  try {
    if (std::strcmp(argv[1], "launch") == 0) return run_launch(argc - 2, argv + 2);
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
