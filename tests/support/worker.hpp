#pragma once
// What every test worker (tests/workers/) shares: one flag parser and named checks written as
// structured records, so a test asserts on a check by name (tests/support/verdicts.hpp), not
// on the words a worker printed. Header-only: workers link no test library for it.
//
// A verdict is one JSON line on stdout (a line of its own, flushed at once):
//   {"verdict":"training equals one process","ok":true,"rank":1,"detail":"max |diff| 1e-07"}
// NAME is what the test looks for and stays fixed; DETAIL carries the numbers, for the log.

#include <cstdio>
#include <cstdlib>
#include <initializer_list>
#include <map>
#include <stdexcept>
#include <string>

namespace accel::test {

// `--name value` pairs (a value may start with "-": "--shift -1"); `--name` alone at the end or
// before another `--flag` is a switch ("1").
class WorkerFlags {
 public:
  WorkerFlags(int argc, char** argv) {
    for (int i = 1; i < argc; ++i) {
      const std::string flag = argv[i];
      if (flag.rfind("--", 0) != 0 || flag.size() == 2)
        throw std::invalid_argument("worker: argument '" + flag + "' is not a --flag");
      const bool value = i + 1 < argc && std::string(argv[i + 1]).rfind("--", 0) != 0;
      values_[flag.substr(2)] = value ? argv[++i] : "1";
    }
  }
  bool has(const std::string& name) const { return values_.count(name) != 0; }
  // Refuses any flag not among `known` (a typo in a test's arguments fails instead of being
  // ignored).
  void only(std::initializer_list<const char*> known) const {
    for (const auto& [name, value] : values_) {
      bool found = false;
      for (const char* k : known) found = found || name == k;
      if (!found) throw std::invalid_argument("worker: unknown flag --" + name);
    }
  }
  std::string text(const std::string& name, const std::string& fallback = "") const {
    const auto it = values_.find(name);
    return it == values_.end() ? fallback : it->second;
  }
  long long integer(const std::string& name, long long fallback = 0) const {
    return number(name, fallback, [](const std::string& s, std::size_t* end) {
      return static_cast<long double>(std::stoll(s, end));
    });
  }
  double real(const std::string& name, double fallback = 0) const {
    return double(number(name, fallback, [](const std::string& s, std::size_t* end) {
      return static_cast<long double>(std::stod(s, end));
    }));
  }

 private:
  template <typename Parse>
  long double number(const std::string& name, long double fallback, Parse parse) const {
    const auto it = values_.find(name);
    if (it == values_.end()) return fallback;
    std::size_t end = 0;
    try {
      const long double v = parse(it->second, &end);
      if (end == it->second.size()) return v;
    } catch (const std::exception&) {
    }
    throw std::invalid_argument("worker: --" + name + " '" + it->second + "' is not a number");
  }
  std::map<std::string, std::string> values_;
};

// The checks one rank makes; exit_code() is main's return (1 when any failed).
class VerdictLog {
 public:
  // The rank the launcher (RANK) or mpirun (OMPI_COMM_WORLD_RANK) set; 0 without either.
  VerdictLog() : rank_(rank_from_environment()) {}
  explicit VerdictLog(int rank) : rank_(rank) {}
  bool check(bool ok, const std::string& name, const std::string& detail = "") {
    const std::string line = "{\"verdict\":" + quoted(name) + ",\"ok\":" + (ok ? "true" : "false") +
                             ",\"rank\":" + std::to_string(rank_) +
                             ",\"detail\":" + quoted(detail) + "}\n";
    std::fputs(line.c_str(), stdout);
    std::fflush(stdout);
    failures_ += ok ? 0 : 1;
    return ok;
  }
  int failures() const { return failures_; }
  int exit_code() const { return failures_ == 0 ? 0 : 1; }

 private:
  static int rank_from_environment() {
    for (const char* name : {"RANK", "OMPI_COMM_WORLD_RANK"})
      if (const char* v = std::getenv(name)) return std::atoi(v);
    return 0;
  }
  static std::string quoted(const std::string& s) {
    std::string out = "\"";
    for (const char c : s) {
      if (c == '"' || c == '\\') {
        out += '\\';
        out += c;
      } else if (static_cast<unsigned char>(c) < 0x20) {
        char escaped[8];
        std::snprintf(escaped, sizeof escaped, "\\u%04x", c);
        out += escaped;
      } else {
        out += c;
      }
    }
    return out + "\"";
  }
  int rank_;
  int failures_ = 0;
};

}  // namespace accel::test
