#include "config/terminal.hpp"

#include <poll.h>
#include <signal.h>
#include <termios.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <stdexcept>

#include "foundation/error.hpp"

namespace accel::config {
namespace {

// The one terminal in raw mode and how to put it back, reachable from a signal handler.
int g_raw_fd = -1;
termios g_saved{};
constexpr std::array<int, 4> kSignals = {SIGINT, SIGTERM, SIGHUP, SIGQUIT};
std::array<struct sigaction, kSignals.size()> g_old_actions{};

extern "C" void restore_and_reraise(int sig) {
  if (g_raw_fd >= 0) ::tcsetattr(g_raw_fd, TCSANOW, &g_saved);
  for (std::size_t i = 0; i < kSignals.size(); ++i)
    if (kSignals[i] == sig) ::sigaction(sig, &g_old_actions[i], nullptr);
  // Delivered when this handler returns, to whatever handled it before (by default: exit).
  ::raise(sig);
}

// Reads one byte, retrying on EINTR; -1 at end of input.
int read_byte(int fd) {
  unsigned char c = 0;
  while (true) {
    const ssize_t n = ::read(fd, &c, 1);
    if (n == 1) return c;
    if (n < 0 && errno == EINTR) continue;
    return -1;
  }
}

// True when another byte arrives within a moment: a lone Escape key sends only ESC, an arrow
// key sends ESC [ A at once.
bool more_follows(int fd) {
  pollfd p{fd, POLLIN, 0};
  return ::poll(&p, 1, 50) > 0;
}

}  // namespace

RawMode::RawMode(int fd) : fd_(fd) {
  if (g_raw_fd >= 0) throw std::logic_error("RawMode: a terminal is already in raw mode");
  termios saved{};
  if (::tcgetattr(fd, &saved) != 0)
    throw Error("cannot read terminal settings: " + errno_text(errno));
  g_saved = saved;
  g_raw_fd = fd;
  struct sigaction action {};
  action.sa_handler = restore_and_reraise;
  sigemptyset(&action.sa_mask);
  for (std::size_t i = 0; i < kSignals.size(); ++i)
    ::sigaction(kSignals[i], &action, &g_old_actions[i]);
  termios raw = saved;
  // Key by key, no echo. ISIG stays on so Ctrl-C interrupts as everywhere else; output
  // processing stays on so "\n" still returns the carriage.
  raw.c_lflag &= ~static_cast<tcflag_t>(ICANON | ECHO);
  raw.c_cc[VMIN] = 1;
  raw.c_cc[VTIME] = 0;
  // TCSANOW, not TCSAFLUSH: keys typed ahead must not be thrown away.
  if (::tcsetattr(fd, TCSANOW, &raw) != 0) {
    const int err = errno;
    for (std::size_t i = 0; i < kSignals.size(); ++i)
      ::sigaction(kSignals[i], &g_old_actions[i], nullptr);
    g_raw_fd = -1;
    throw Error("cannot set terminal to raw mode: " + errno_text(err));
  }
  active_ = true;
}

RawMode::~RawMode() {
  if (!active_) return;
  ::tcsetattr(fd_, TCSANOW, &g_saved);
  for (std::size_t i = 0; i < kSignals.size(); ++i)
    ::sigaction(kSignals[i], &g_old_actions[i], nullptr);
  g_raw_fd = -1;
}

Key read_key(int fd) {
  const int c = read_byte(fd);
  if (c < 0 || c == 0x04) return {KeyKind::end_of_input};
  if (c == '\r' || c == '\n') return {KeyKind::enter};
  if (c >= '0' && c <= '9') return {KeyKind::digit, c - '0'};
  if (c == 'k') return {KeyKind::up};
  if (c == 'j') return {KeyKind::down};
  if (c == 0x1b) {
    if (!more_follows(fd)) return {KeyKind::other};
    const int intro = read_byte(fd);
    if (intro != '[' && intro != 'O') return {KeyKind::other};
    int final_byte = read_byte(fd);
    // Skip parameters (ESC [ 1 ; 5 A for Ctrl-Up) up to the final byte.
    while (final_byte >= '0' && final_byte <= '?') final_byte = read_byte(fd);
    if (final_byte == 'A') return {KeyKind::up};
    if (final_byte == 'B') return {KeyKind::down};
    if (final_byte < 0) return {KeyKind::end_of_input};
  }
  return {KeyKind::other};
}

void write_text(int fd, const std::string& text) {
  std::size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return;  // the terminal went away; the read that follows reports end of input
    }
    done += static_cast<std::size_t>(n);
  }
}

std::optional<int> choose_on_terminal(int in_fd, int out_fd, const std::string& question,
                                      const std::vector<std::string>& labels,
                                      const std::vector<std::string>& names,
                                      const std::vector<int>& numbers, int initial) {
  const int n = static_cast<int>(labels.size());
  int current = (initial >= 0 && initial < n) ? initial : 0;
  auto draw = [&](bool first) {
    std::string text;
    if (!first) text += "\x1b[" + std::to_string(n) + "A";  // back up to the first option
    for (int i = 0; i < n; ++i) {
      text += "\r\x1b[2K";
      text += (i == current ? " > " : "   ") + std::to_string(numbers[i]) + ") " + labels[i] + "\n";
    }
    write_text(out_fd, text);
  };
  write_text(out_fd, question + "  (arrow keys or number, Enter to pick)\n");
  RawMode raw(in_fd);
  draw(true);
  while (true) {
    const Key key = read_key(in_fd);
    switch (key.kind) {
      case KeyKind::end_of_input:
        return std::nullopt;
      case KeyKind::up:
        current = (current + n - 1) % n;
        break;
      case KeyKind::down:
        current = (current + 1) % n;
        break;
      case KeyKind::digit:
        for (int i = 0; i < n; ++i)
          if (numbers[i] == key.digit) current = i;
        break;
      case KeyKind::enter:
        // Replace the menu with the question and the answer, as a line-by-line session reads.
        write_text(out_fd, "\x1b[" + std::to_string(n + 1) + "A\r\x1b[J" + question + "  " +
                               names[current] + "\n");
        return current;
      case KeyKind::other:
        continue;
    }
    draw(false);
  }
}

std::optional<std::string> read_terminal_line(int in_fd) {
  std::string line;
  while (true) {
    const int c = read_byte(in_fd);
    if (c < 0) {
      if (line.empty()) return std::nullopt;
      return line;
    }
    if (c == '\n') return line;
    if (c != '\r') line += static_cast<char>(c);
  }
}

}  // namespace accel::config
