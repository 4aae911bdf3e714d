// `accel store`: a rendezvous store of its own, for elastic jobs whose endpoint is not any
// agent's machine (torchrun's external endpoint): every agent then connects to it as a client,
// and any machine may die without taking the store along. Serves until SIGINT or SIGTERM.

#include <signal.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "foundation/error.hpp"
#include "foundation/store/tcp_store.hpp"
#include "tools/commands.hpp"

namespace accel::tools {
namespace {

constexpr const char* kUsage =
    "usage: accel store [--host ADDRESS] [--port PORT]\n"
    "Serves the rendezvous store of elastic jobs whose --rdzv_endpoint is ADDRESS:PORT (default\n"
    "0.0.0.0:29500), until SIGINT or SIGTERM. ACCEL_STORE_TOKEN, when set, is the secret every\n"
    "agent and worker must give (set the same on every machine).\n";

int parse_port(const std::string& value) {
  char* end = nullptr;
  const long port = std::strtol(value.c_str(), &end, 10);
  if (value.empty() || *end != '\0' || port < 0 || port > 65535)
    throw ConfigError("accel store: --port expects a TCP port (0-65535), got '" + value + "'");
  return int(port);
}

}  // namespace

int run_store_command(int argc, char** argv) {
  std::string host = "0.0.0.0";
  int port = 29500;
  for (int i = 0; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "-h" || flag == "--help") {
      std::fputs(kUsage, stdout);
      return 0;
    }
    if ((flag == "--host" || flag == "--port") && i + 1 >= argc)
      throw ConfigError("accel store: " + flag + " needs a value");
    if (flag == "--host")
      host = argv[++i];
    else if (flag == "--port")
      port = parse_port(argv[++i]);
    else
      throw ConfigError("accel store: unknown flag '" + flag + "'\n" + kUsage);
  }
  // Block the signals before the server's thread starts, so that only sigwait sees them.
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGINT);
  sigaddset(&stop, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);
  const char* token = std::getenv("ACCEL_STORE_TOKEN");
  TcpStoreServer server(host, port, token ? token : "");
  std::printf("accel store: serving on %s:%d%s\n", host.c_str(), server.port(),
              token && *token ? " (with ACCEL_STORE_TOKEN)" : "");
  std::fflush(stdout);
  int sig = 0;
  sigwait(&stop, &sig);
  std::printf("accel store: stopped by %s\n", sig == SIGINT ? "SIGINT" : "SIGTERM");
  return 0;
}

}  // namespace accel::tools
