#pragma once
// A progress bar for long loops (tqdm's, as an Accelerate user knows it): "DESC 47/118 40%
// 12.3 it/s ETA 0:05 loss 0.4321". On a terminal it redraws one line (carriage return, then
// erase to the end) at most every redraw_interval; anywhere else (a pipe, a file, rank-prefixed
// output under accel launch) it prints a plain line at most every line_interval, so logs stay
// readable. close() (or the destructor) prints the final state once.

#include <chrono>
#include <cstddef>
#include <optional>
#include <string>

namespace accel {

struct ProgressBarOptions {
  bool enabled = true;           // false: prints nothing (another rank, disable_progress_bar)
  int fd = 2;                    // stderr, as tqdm
  std::optional<bool> terminal;  // redraw one line; unset: whether fd is a terminal
  std::chrono::milliseconds redraw_interval{100};
  std::chrono::milliseconds line_interval{5000};
};

// For programs without an Accelerator (the accel commands): ACCEL_DISABLE_PROGRESS_BAR read as
// the config key disable_progress_bar is (ConfigError naming the variable for a bad value).
bool progress_bar_disabled_by_env();

class ProgressBar {
 public:
  // total 0: unknown (no percentage, no ETA).
  ProgressBar(std::string description, std::size_t total, ProgressBarOptions options = {});
  ~ProgressBar();
  ProgressBar(const ProgressBar&) = delete;
  ProgressBar& operator=(const ProgressBar&) = delete;

  void update(std::size_t n = 1);
  // Shown after the rate (e.g. "loss 0.4321"); drawn with the next update.
  void set_postfix(std::string text);
  void close();

  // The line as it would be drawn now, without control characters.
  std::string text() const;
  std::size_t count() const { return count_; }
  bool enabled() const { return options_.enabled; }

 private:
  using Clock = std::chrono::steady_clock;
  void draw(bool final);
  std::string description_, postfix_;
  std::size_t total_, count_ = 0;
  ProgressBarOptions options_;
  bool terminal_ = false, closed_ = false;
  Clock::time_point started_, last_draw_;
};

// "0:05", "12:34", "1:02:03".
std::string format_duration(double seconds);

}  // namespace accel
