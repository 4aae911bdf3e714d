#pragma once
// Writing files whole: a byte string to a file descriptor (write() again after a short write or
// an EINTR, until every byte is in; one call per record keeps a log readable after a crash), and
// a file replaced atomically (the config, acc.save, accel merge-weights' output).

#include <functional>
#include <string>
#include <string_view>

namespace accel {

// Throws Error "<what>: cannot write: <errno text>" on failure.
void write_all(int fd, std::string_view bytes, const std::string& what);

struct AtomicWrite {
  bool create_directories = true;  // false: a missing directory fails, and nothing is created
  // Runs after the data is on disk and before the rename; tests throw from it to simulate a
  // crash at the last moment.
  std::function<void()> before_rename;
};
// Writes `content` to a temporary PATH.tmp-XXXXXX beside `path`, fsyncs it, renames it over
// `path` and fsyncs the directory: readers see the old file or the new one, never a part. On
// failure (Error naming the file) the temporary is removed and `path` is untouched. A new file
// gets mode 0644, a replaced one keeps its mode.
void write_file_atomically(const std::string& path, std::string_view content,
                           const AtomicWrite& how = {});

}  // namespace accel
