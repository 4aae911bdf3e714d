// Progress bars (accelerate/progress_bar.hpp, Accelerator::progress): the line's text (count,
// percentage, rate, ETA, the postfix), one redrawn line on a real pseudo-terminal (openpty),
// plain lines in a pipe, nothing when disabled or off the main process; Accelerator::progress
// over a range shows the last logged loss; ACCEL_DISABLE_PROGRESS_BAR read like the config key.

#include <doctest/doctest.h>
#include <fcntl.h>
#include <poll.h>
#include <pty.h>
#include <unistd.h>

#include <cstdlib>
#include <regex>
#include <string>
#include <vector>

#include "accelerate/accelerator.hpp"
#include "accelerate/progress_bar.hpp"
#include "foundation/error.hpp"

using namespace accel;

namespace {

// Everything readable on fd now (it is non-blocking), as a string.
std::string drain(int fd) {
  std::string out;
  char buf[4096];
  pollfd ready{fd, POLLIN, 0};
  while (::poll(&ready, 1, 50) > 0) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n <= 0) break;
    out.append(buf, std::size_t(n));
  }
  return out;
}

std::size_t count(const std::string& s, const std::string& what) {
  std::size_t n = 0;
  for (std::size_t at = s.find(what); at != std::string::npos; at = s.find(what, at + 1)) ++n;
  return n;
}

struct Pipe {
  int read = -1, write = -1;
  Pipe() {
    int fds[2];
    REQUIRE(::pipe(fds) == 0);
    read = fds[0];
    write = fds[1];
  }
  ~Pipe() {
    ::close(read);
    ::close(write);
  }
};

}  // namespace

TEST_CASE("the line: count of total, percentage, rate, ETA; done: the time it took") {
  ProgressBarOptions off;
  off.enabled = false;
  ProgressBar bar("epoch 1", 4, off);
  CHECK(bar.text() == "epoch 1 0/4   0%");
  bar.update(1);
  CHECK(std::regex_match(bar.text(),
                         std::regex(R"(epoch 1 1/4  25% [0-9.]+ (it/s|s/it) ETA \d+:\d\d)")));
  bar.set_postfix("loss 0.25");
  bar.update(3);
  CHECK(std::regex_match(
      bar.text(), std::regex(R"(epoch 1 4/4 100% [0-9.]+ (it/s|s/it) in \d+:\d\d loss 0.25)")));
  ProgressBar unknown("", 0, off);  // no total: no percentage, no ETA
  unknown.update(7);
  CHECK(std::regex_match(unknown.text(), std::regex(R"(7 [0-9.]+ (it/s|s/it))")));
  CHECK(format_duration(5) == "0:05");
  CHECK(format_duration(754) == "12:34");
  CHECK(format_duration(3723) == "1:02:03");
}

TEST_CASE("on a pseudo-terminal: one line redrawn in place, a newline only at the end") {
  int master = -1, slave = -1;
  REQUIRE(::openpty(&master, &slave, nullptr, nullptr, nullptr) == 0);
  ::fcntl(master, F_SETFL, O_NONBLOCK);
  {
    ProgressBarOptions options;
    options.fd = slave;  // a terminal: isatty decides, nothing forced
    options.redraw_interval = std::chrono::milliseconds(0);
    ProgressBar bar("steps", 3, options);
    for (int i = 0; i < 3; ++i) bar.update();
  }
  const std::string out = drain(master);
  ::close(slave);
  ::close(master);
  INFO("terminal saw: " << out);
  // Drawn at the start, at each of 3 updates and at the end, each from the line's start and
  // erasing what a longer line left; one newline (the terminal makes it \r\n).
  CHECK(count(out, "\r") - count(out, "\r\n") == 5);
  CHECK(count(out, "\x1b[K") == 5);
  CHECK(count(out, "\n") == 1);
  CHECK(out.find("\rsteps 0/3   0%") == 0);
  CHECK(out.find("steps 3/3 100%") != std::string::npos);
}

TEST_CASE("in a pipe: plain lines at most every line_interval, and the final one") {
  Pipe pipe;
  ::fcntl(pipe.read, F_SETFL, O_NONBLOCK);
  {
    ProgressBarOptions options;
    options.fd = pipe.write;
    ProgressBar bar("steps", 100, options);  // the default 5 s: no line during a fast loop
    for (int i = 0; i < 100; ++i) bar.update();
  }
  std::string out = drain(pipe.read);
  CHECK(count(out, "\n") == 1);
  CHECK(out.find("steps 100/100 100%") == 0);
  CHECK(out.find('\r') == std::string::npos);
  CHECK(out.find('\x1b') == std::string::npos);
  {
    ProgressBarOptions options;
    options.fd = pipe.write;
    options.line_interval = std::chrono::milliseconds(0);
    ProgressBar bar("steps", 3, options);
    for (int i = 0; i < 3; ++i) bar.update();
  }
  out = drain(pipe.read);
  CHECK(count(out, "\n") == 4);  // each update, then the final line
  CHECK(out.find("steps 1/3  33%") == 0);
}

TEST_CASE("Accelerator::progress: the loop unchanged, the last logged loss shown; disabled") {
  Pipe pipe;
  ::fcntl(pipe.read, F_SETFL, O_NONBLOCK);
  const int saved = ::dup(2);
  ::dup2(pipe.write, 2);  // the bar writes to stderr
  std::vector<int> seen;
  {
    AcceleratorOptions options;
    options.communicator = "local";
    Accelerator acc(options);
    acc.init_trackers("progress");
    const std::vector<int> items = {1, 2, 3};
    for (int x : acc.progress(items, "items")) {
      seen.push_back(x);
      acc.log({{"train/loss", 0.5 / x}, {"lr", 0.1}}, x);
    }
    options.disable_progress_bar = true;
    Accelerator quiet(options);
    CHECK_FALSE(quiet.progress_bar_options().enabled);
    for (int x : quiet.progress(items)) seen.push_back(x);
  }
  ::dup2(saved, 2);
  ::close(saved);
  const std::string out = drain(pipe.read);
  INFO("stderr: " << out);
  CHECK(seen == std::vector<int>{1, 2, 3, 1, 2, 3});
  CHECK(count(out, "\n") == 1);  // the first bar's final line; the disabled one nothing
  CHECK(std::regex_search(out, std::regex(R"(^items 3/3 100% .* train/loss 0.1667\n)")));
}

TEST_CASE("ACCEL_DISABLE_PROGRESS_BAR reads as the config key; a bad value is named") {
  ::unsetenv("ACCEL_DISABLE_PROGRESS_BAR");
  CHECK_FALSE(progress_bar_disabled_by_env());
  ::setenv("ACCEL_DISABLE_PROGRESS_BAR", "true", 1);
  CHECK(progress_bar_disabled_by_env());
  ::setenv("ACCEL_DISABLE_PROGRESS_BAR", "0", 1);
  CHECK_FALSE(progress_bar_disabled_by_env());
  ::setenv("ACCEL_DISABLE_PROGRESS_BAR", "maybe", 1);
  CHECK_THROWS_WITH_AS(progress_bar_disabled_by_env(),
                       doctest::Contains("ACCEL_DISABLE_PROGRESS_BAR"), ConfigError);
  ::unsetenv("ACCEL_DISABLE_PROGRESS_BAR");
}
