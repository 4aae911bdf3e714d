#include "foundation/file_io.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <system_error>

#include "foundation/error.hpp"
#include "foundation/unique_fd.hpp"

namespace accel {

void write_all(int fd, std::string_view bytes, const std::string& what) {
  while (!bytes.empty()) {
    const ssize_t n = ::write(fd, bytes.data(), bytes.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw Error(what + ": cannot write: " + errno_text(errno));
    bytes.remove_prefix(std::size_t(n));
  }
}

void write_file_atomically(const std::string& path, std::string_view content,
                           const AtomicWrite& how) {
  namespace fs = std::filesystem;
  const fs::path target(path);
  const fs::path dir = target.has_parent_path() ? target.parent_path() : fs::path(".");
  if (how.create_directories) {
    std::error_code ec;
    fs::create_directories(dir, ec);
    if (ec) throw Error(path + ": cannot create directory " + dir.string() + ": " + ec.message());
  }
  // Beside the target, so the rename stays on one filesystem and is atomic.
  std::string tmp = path + ".tmp-XXXXXX";
  UniqueFd fd(::mkstemp(tmp.data()));
  if (!fd) throw Error(tmp + ": cannot create: " + errno_text(errno));
  try {
    // mkstemp makes the file 0600: keep the old file's mode, or give a new one 0644.
    struct stat st {};
    const mode_t mode = ::stat(path.c_str(), &st) == 0 ? (st.st_mode & 07777) : 0644;
    ::fchmod(fd.get(), mode);
    write_all(fd.get(), content, tmp);
    if (::fsync(fd.get()) != 0) throw Error(tmp + ": cannot sync: " + errno_text(errno));
    if (const int err = fd.close(); err != 0)
      throw Error(tmp + ": cannot close: " + errno_text(err));
    if (how.before_rename) how.before_rename();
    if (::rename(tmp.c_str(), path.c_str()) != 0)
      throw Error(path + ": cannot replace with " + tmp + ": " + errno_text(errno));
  } catch (...) {
    fd.reset();
    ::unlink(tmp.c_str());
    throw;
  }
  // The rename is durable once the directory entry is; a failure here loses nothing already
  // visible, so it is not reported.
  const UniqueFd dfd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (dfd) ::fsync(dfd.get());
}

}  // namespace accel
