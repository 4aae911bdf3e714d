#pragma once
// Skipping a test whose requirement is absent (GPU, MPI, LibTorch): it prints why, and when
// every test case the binary ran skipped, the binary exits 77, which ctest shows as
// "Skipped" (SKIP_RETURN_CODE in tests/CMakeLists.txt).

#include <string>

namespace accel::test {

inline constexpr int kSkipExitCode = 77;

// Call at the top of a test case: returns true (after printing why) when it must be skipped.
//   if (skip_unless(have_mpi(), "mpirun not found")) return;
bool skip_unless(bool available, const std::string& reason);

// True when at least one test case ran and every one of them skipped.
bool all_skipped();

}  // namespace accel::test
