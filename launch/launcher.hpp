#pragma once
// `accel launch` on one machine: hosts the rendezvous store, starts one worker per process
// with the torchrun-style environment, forwards SIGINT/SIGTERM to them, and reports the root
// cause when one fails. The command-line front end (tools/) only parses into LaunchOptions.

#include <string>
#include <vector>

namespace accel::launch {

struct LaunchOptions {
  int num_processes = 1;
  std::string main_process_ip = "127.0.0.1";
  int main_process_port = 29500;  // 0 = pick a free port
  std::string comm_backend;       // ACCEL_COMM_BACKEND for the workers; empty = their default
  bool quiet = false;
  std::vector<std::string> program;  // the training program and its arguments
};

// Runs the job; returns the exit status `accel launch` exits with (0, or the failed
// worker's status).
int launch(const LaunchOptions& options);

}  // namespace accel::launch
