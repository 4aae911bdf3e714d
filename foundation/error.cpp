#include "foundation/error.hpp"

#include <cstring>
#include <filesystem>

namespace accel {

std::string with_location(const std::string& what, const char* file, int line) {
  return what + " (" + std::filesystem::path(file).filename().string() + ":" +
         std::to_string(line) + ")";
}

std::string errno_text(int err) {
  char buf[256];
  // GNU strerror_r returns the message pointer, which may or may not be buf.
  const char* msg = strerror_r(err, buf, sizeof(buf));
  return std::string(msg) + " (errno " + std::to_string(err) + ")";
}

}  // namespace accel
