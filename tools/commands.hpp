#pragma once
// The subcommands of `accel`, one file each. Each takes the arguments after its own name and
// returns the exit status. Errors in what the user gave (flags, config) are ConfigError and
// exit 2; main() prints them.

namespace accel::tools {

int run_launch_command(int argc, char** argv);
int run_config_command(int argc, char** argv);
int run_env_command(int argc, char** argv);
int run_estimate_memory_command(int argc, char** argv);
int run_merge_weights_command(int argc, char** argv);
int run_store_command(int argc, char** argv);
// `self` is the path of the running accel executable (accel test launches it again).
int run_test_command(int argc, char** argv, const char* self);

}  // namespace accel::tools
