#pragma once
// Raw-mode keyboard input for the wizard on a real terminal: an arrow-key menu and plain
// line input. The terminal's settings are restored however the process leaves: normally,
// by an exception, or by SIGINT/SIGTERM/SIGHUP/SIGQUIT (then the signal does what it would
// have done).

#include <optional>
#include <string>
#include <vector>

namespace accel::config {

// While alive, `fd` (a terminal) delivers key presses unbuffered and unechoed. Ctrl-C still
// raises SIGINT. One at a time per process.
class RawMode {
 public:
  explicit RawMode(int fd);
  ~RawMode();
  RawMode(const RawMode&) = delete;
  RawMode& operator=(const RawMode&) = delete;

 private:
  int fd_;
  bool active_ = false;
};

enum class KeyKind { up, down, enter, digit, end_of_input, other };
struct Key {
  KeyKind kind = KeyKind::other;
  int digit = 0;  // for KeyKind::digit
};

// One key press from `fd` in raw mode; arrow-key escape sequences (CSI and SS3) decoded, j/k
// as down/up, Ctrl-D or a closed terminal as end_of_input.
Key read_key(int fd);

// Draws `question` and the `labels` on out_fd with a marker on the current one; arrows move
// it, a digit jumps to the option whose number (`numbers[i]`) it is, Enter picks. Afterwards
// the menu collapses into one line "question  names[i]". Returns the index, or nullopt at end
// of input.
std::optional<int> choose_on_terminal(int in_fd, int out_fd, const std::string& question,
                                      const std::vector<std::string>& labels,
                                      const std::vector<std::string>& names,
                                      const std::vector<int>& numbers, int initial);

// A line typed in the terminal's normal (cooked, echoing) mode, without the newline; nullopt
// at end of input.
std::optional<std::string> read_terminal_line(int in_fd);

// write(2) all of `text`.
void write_text(int fd, const std::string& text);

}  // namespace accel::config
