#include "launch/worker_group.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>

#include "backends/comm/error.hpp"

extern char** environ;

namespace accel::launch {
namespace {

using Clock = std::chrono::steady_clock;

// One stream (stdout or stderr) of one worker, split into lines as it arrives.
struct Stream {
  int fd = -1;
  bool is_stderr = false;
  std::string partial;
};

struct Worker {
  const WorkerSpec* spec = nullptr;
  pid_t pid = -1;
  bool running = false;
  Stream out, err;
  std::deque<std::string> tail;
  std::unique_ptr<std::ofstream> log;
  WorkerExit exit;
};

std::vector<std::string> build_environment(const WorkerSpec& spec) {
  std::map<std::string, std::string> env;
  for (char** e = environ; *e; ++e) {
    std::string kv(*e);
    const auto eq = kv.find('=');
    if (eq != std::string::npos) env[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  for (const auto& [k, v] : spec.env) env[k] = v;
  std::vector<std::string> out;
  for (const auto& [k, v] : env) out.push_back(k + "=" + v);
  return out;
}

void start(Worker& w) {
  int out_pipe[2], err_pipe[2];
  if (pipe2(out_pipe, O_CLOEXEC) != 0 || pipe2(err_pipe, O_CLOEXEC) != 0)
    throw Error("launch: pipe failed: " + errno_text(errno));
  // Everything the child needs is prepared before fork: after it, only async-signal-safe
  // calls are allowed.
  std::vector<std::string> env_strings = build_environment(*w.spec);
  std::vector<char*> envp, argv;
  for (auto& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::vector<std::string> args = w.spec->argv;
  for (auto& s : args) argv.push_back(s.data());
  argv.push_back(nullptr);

  const pid_t pid = fork();
  if (pid < 0) throw Error("launch: fork failed: " + errno_text(errno));
  if (pid == 0) {
    setpgid(0, 0);  // own process group: signals reach the worker's children too
    dup2(out_pipe[1], STDOUT_FILENO);
    dup2(err_pipe[1], STDERR_FILENO);
    execvpe(argv[0], argv.data(), envp.data());
    const char msg[] = "launch: could not execute the worker program\n";
    (void)!write(STDERR_FILENO, msg, sizeof(msg) - 1);
    _exit(127);
  }
  setpgid(pid, pid);  // also from the parent, so kill(-pid) works before the child runs
  close(out_pipe[1]);
  close(err_pipe[1]);
  w.pid = pid;
  w.running = true;
  w.out = Stream{out_pipe[0], false, {}};
  w.err = Stream{err_pipe[0], true, {}};
}

void emit_line(Worker& w, const WorkerGroupOptions& opt, const std::string& line, bool is_err) {
  if (opt.echo) {
    std::string text = (opt.prefix_output ? "[" + w.spec->label + "] " : "") + line + "\n";
    (void)!write(is_err ? STDERR_FILENO : STDOUT_FILENO, text.data(), text.size());
  }
  if (w.log) *w.log << line << '\n' << std::flush;
  if (opt.capture) w.exit.output += line + "\n";
  if (is_err) {
    w.tail.push_back(line);
    if (w.tail.size() > opt.tail_lines) w.tail.pop_front();
  }
}

// Reads what is available; returns false at end of stream.
bool pump(Worker& w, Stream& s, const WorkerGroupOptions& opt) {
  char buf[65536];
  const ssize_t n = read(s.fd, buf, sizeof(buf));
  if (n < 0 && (errno == EINTR || errno == EAGAIN)) return true;
  if (n <= 0) {
    if (!s.partial.empty()) emit_line(w, opt, s.partial, s.is_stderr);
    s.partial.clear();
    close(s.fd);
    s.fd = -1;
    return false;
  }
  s.partial.append(buf, std::size_t(n));
  std::size_t start = 0, nl;
  while ((nl = s.partial.find('\n', start)) != std::string::npos) {
    emit_line(w, opt, s.partial.substr(start, nl - start), s.is_stderr);
    start = nl + 1;
  }
  s.partial.erase(0, start);
  return true;
}

void signal_all(std::vector<Worker>& workers, int sig) {
  for (auto& w : workers)
    if (w.running) {
      kill(-w.pid, sig);
      w.exit.stopped_by_us = true;
    }
}

bool reap(Worker& w) {
  int status = 0;
  const pid_t r = waitpid(w.pid, &status, WNOHANG);
  if (r != w.pid) return false;
  w.running = false;
  if (WIFSIGNALED(status)) w.exit.signal = WTERMSIG(status);
  else w.exit.exit_code = WEXITSTATUS(status);
  return true;
}

bool failed(const WorkerExit& e) { return e.signal != 0 || e.exit_code != 0; }

}  // namespace

int GroupResult::exit_code() const {
  if (!first_failure) return (timed_out || stopped) ? 1 : 0;
  const WorkerExit& e = workers[*first_failure];
  return e.signal ? 128 + e.signal : e.exit_code;
}

std::string GroupResult::failure_report() const {
  if (!first_failure) {
    if (timed_out) return "the worker group did not finish within its timeout";
    if (stopped) return "the worker group was stopped";
    return "";
  }
  const WorkerExit& e = workers[*first_failure];
  std::string report = e.label + (e.signal ? " was killed by signal " + std::to_string(e.signal) +
                                                 " (" + strsignal(e.signal) + ")"
                                           : " exited with code " + std::to_string(e.exit_code));
  if (!e.stderr_tail.empty()) report += "; last lines of its stderr:\n" + e.stderr_tail;
  return report;
}

GroupResult run_worker_group(const std::vector<WorkerSpec>& specs,
                             const WorkerGroupOptions& opt) {
  std::vector<Worker> workers(specs.size());
  if (!opt.log_dir.empty()) std::filesystem::create_directories(opt.log_dir);
  GroupResult result;
  for (std::size_t i = 0; i < specs.size(); ++i) {
    workers[i].spec = &specs[i];
    workers[i].exit.label = specs[i].label;
    if (!opt.log_dir.empty())
      workers[i].log = std::make_unique<std::ofstream>(
          std::filesystem::path(opt.log_dir) / (specs[i].label + ".log"));
  }
  try {
    for (auto& w : workers) start(w);
  } catch (...) {
    signal_all(workers, SIGKILL);
    for (auto& w : workers)
      if (w.running) waitpid(w.pid, nullptr, 0);
    throw;
  }

  const auto started = Clock::now();
  std::optional<Clock::time_point> kill_at;  // set once we asked everyone to stop
  std::optional<Clock::time_point> all_exited_at;
  auto stop_group = [&] {
    if (kill_at) return;
    signal_all(workers, SIGTERM);
    kill_at = Clock::now() + opt.grace;
  };

  for (;;) {
    std::vector<pollfd> fds;
    std::vector<std::pair<Worker*, Stream*>> owners;
    for (auto& w : workers)
      for (Stream* s : {&w.out, &w.err})
        if (s->fd >= 0) {
          fds.push_back({s->fd, POLLIN, 0});
          owners.emplace_back(&w, s);
        }
    if (opt.stop_fd >= 0) fds.push_back({opt.stop_fd, POLLIN, 0});
    poll(fds.data(), fds.size(), 50);
    for (std::size_t i = 0; i < owners.size(); ++i)
      if (fds[i].revents) pump(*owners[i].first, *owners[i].second, opt);
    if (opt.stop_fd >= 0 && fds.back().revents && !result.stopped) {
      result.stopped = true;
      stop_group();
    }

    bool any_running = false;
    for (std::size_t i = 0; i < workers.size(); ++i) {
      Worker& w = workers[i];
      if (w.running && reap(w) && failed(w.exit) && !result.first_failure && !kill_at) {
        result.first_failure = i;  // the root cause; the others are collateral
        stop_group();
      }
      any_running |= w.running;
    }
    bool streams_open = false;
    for (auto& w : workers) streams_open |= (w.out.fd >= 0 || w.err.fd >= 0);
    if (!any_running && !streams_open) break;
    // A worker that exited may leave a grandchild holding its pipes: drain briefly, then go.
    if (!any_running) {
      if (!all_exited_at) all_exited_at = Clock::now();
      if (Clock::now() - *all_exited_at > std::chrono::seconds(2)) break;
    }

    if (opt.timeout.count() > 0 && !kill_at && Clock::now() - started > opt.timeout) {
      result.timed_out = true;
      stop_group();
    }
    if (kill_at && Clock::now() > *kill_at) signal_all(workers, SIGKILL);
  }
  for (auto& w : workers) {
    for (Stream* s : {&w.out, &w.err})
      if (s->fd >= 0) close(s->fd);
    for (const auto& line : w.tail) w.exit.stderr_tail += line + "\n";
    result.workers.push_back(std::move(w.exit));
  }
  return result;
}

}  // namespace accel::launch
