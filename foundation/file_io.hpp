#pragma once
// Writing a whole byte string to a file descriptor: write() again after a short write or an
// EINTR, until every byte is in. One call per record keeps a log readable after a crash.

#include <string>
#include <string_view>

namespace accel {

// Throws Error "<what>: cannot write: <errno text>" on failure.
void write_all(int fd, std::string_view bytes, const std::string& what);

}  // namespace accel
