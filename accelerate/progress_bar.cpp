#include "accelerate/progress_bar.hpp"

#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string_view>

#include "config/config.hpp"

namespace accel {

bool progress_bar_disabled_by_env() {
  const char* v = std::getenv("ACCEL_DISABLE_PROGRESS_BAR");
  if (v == nullptr || *v == '\0') return false;
  return config::parse_value_or_throw("disable_progress_bar", v,
                                      "environment variable ACCEL_DISABLE_PROGRESS_BAR") == "true";
}

std::string format_duration(double seconds) {
  const long total = std::lround(std::max(0.0, seconds));
  char text[32];
  if (total >= 3600)
    std::snprintf(text, sizeof text, "%ld:%02ld:%02ld", total / 3600, total / 60 % 60, total % 60);
  else
    std::snprintf(text, sizeof text, "%ld:%02ld", total / 60, total % 60);
  return text;
}

ProgressBar::ProgressBar(std::string description, std::size_t total, ProgressBarOptions options)
    : description_(std::move(description)), total_(total), options_(options) {
  terminal_ = options_.terminal.value_or(::isatty(options_.fd) == 1);
  started_ = last_draw_ = Clock::now();
  if (options_.enabled && terminal_) draw(false);
}

ProgressBar::~ProgressBar() { close(); }

void ProgressBar::update(std::size_t n) {
  count_ += n;
  if (!options_.enabled || closed_) return;
  const auto interval = terminal_ ? options_.redraw_interval : options_.line_interval;
  if (Clock::now() - last_draw_ >= interval) draw(false);
}

void ProgressBar::set_postfix(std::string text) { postfix_ = std::move(text); }

void ProgressBar::close() {
  if (closed_) return;
  if (options_.enabled) draw(true);
  closed_ = true;
}

std::string ProgressBar::text() const {
  const double elapsed = std::chrono::duration<double>(Clock::now() - started_).count();
  const double rate = elapsed > 0 ? double(count_) / elapsed : 0;
  char part[128];
  std::string out = description_.empty() ? "" : description_ + " ";
  if (total_ > 0) {
    std::snprintf(part, sizeof part, "%zu/%zu %3.0f%%", count_, total_,
                  100.0 * double(count_) / double(total_));
  } else {
    std::snprintf(part, sizeof part, "%zu", count_);
  }
  out += part;
  if (count_ > 0) {
    // it/s, or s/it for slow loops (a step of many seconds reads better that way).
    if (rate >= 1)
      std::snprintf(part, sizeof part, " %.1f it/s", rate);
    else
      std::snprintf(part, sizeof part, " %.1f s/it", 1 / rate);
    out += part;
  }
  if (total_ > 0 && count_ > 0 && count_ < total_)
    out += " ETA " + format_duration(double(total_ - count_) / rate);
  else if (total_ > 0 && count_ >= total_)
    out += " in " + format_duration(elapsed);
  if (!postfix_.empty()) out += " " + postfix_;
  return out;
}

void ProgressBar::draw(bool final) {
  last_draw_ = Clock::now();
  // One write() per line, so ranks or threads sharing the stream do not split it.
  const std::string line =
      terminal_ ? "\r" + text() + "\x1b[K" + (final ? "\n" : "") : text() + "\n";
  for (std::size_t at = 0; at < line.size();) {
    const ssize_t n = ::write(options_.fd, line.data() + at, line.size() - at);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // a closed stream: progress is not worth failing the loop for
    at += std::size_t(n);
  }
}

}  // namespace accel
