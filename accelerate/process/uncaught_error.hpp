#pragma once
// What a program gets when an accel::Error escapes its main() (or a thread): what a Python
// user gets from an uncaught exception. One line on stderr, "[rank R] uncaught KIND: MESSAGE",
// then exit code 1, instead of std::terminate's abort (signal 6, a core dump, "terminate
// called after throwing ..."). Other exceptions keep the handler that was there before.
// The launcher's failure report quotes that line (kUncaughtTag, foundation/error.hpp).

namespace accel {

// Installs the handler once per process (later calls only update the rank; -1: not known yet).
void exit_cleanly_on_uncaught_errors(int rank);

}  // namespace accel
