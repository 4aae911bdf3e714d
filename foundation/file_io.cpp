#include "foundation/file_io.hpp"

#include <unistd.h>

#include <cerrno>

#include "foundation/error.hpp"

namespace accel {

void write_all(int fd, std::string_view bytes, const std::string& what) {
  while (!bytes.empty()) {
    const ssize_t n = ::write(fd, bytes.data(), bytes.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw Error(what + ": cannot write: " + errno_text(errno));
    bytes.remove_prefix(std::size_t(n));
  }
}

}  // namespace accel
