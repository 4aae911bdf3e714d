// main() of accel-merge-weights, the program behind `accel merge-weights` (accel_main.cpp says
// why it is a program of its own).

#include <cstdio>

#include "foundation/error.hpp"
#include "tools/commands.hpp"

int main(int argc, char** argv) {
  try {
    return accel::tools::run_merge_weights_command(argc - 1, argv + 1);
  } catch (const accel::ConfigError& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "accel merge-weights: %s\n", e.what());
    return 1;
  }
}
