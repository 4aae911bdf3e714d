#pragma once
// The subcommands of `accel`, one file each. Each takes the arguments after its own name and
// returns the exit status. Errors in what the user gave (flags, config) are ConfigError and
// exit 2; main() prints them.

namespace accel::tools {

int run_launch_command(int argc, char** argv);

}  // namespace accel::tools
