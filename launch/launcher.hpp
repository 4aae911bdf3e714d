#pragma once
// `accel launch`: resolves the settings (command line > environment > config file > detected
// default) and prints them, hosts the rendezvous store on machine 0 (or joins machine 0's),
// starts this machine's workers with the torchrun-style environment, forwards SIGINT/SIGTERM
// to them, restarts the whole group after a failure while --max_restarts allows, and reports
// the root cause when it gives up. The command-line front end (tools/) only parses into
// LaunchOptions.

#include "launch/launch_options.hpp"

namespace accel::launch {

// Runs the job; returns the exit status `accel launch` exits with: 0, the failed worker's
// status (128 + signal when it was killed), 128 + signal when the launcher was interrupted,
// or 1 when the machines could not meet. Throws ConfigError for bad settings (exit 2) and
// Error naming host:port when the store cannot be hosted (a busy port).
int launch(const LaunchOptions& options);

}  // namespace accel::launch
