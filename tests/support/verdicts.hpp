#pragma once
// The test side of tests/support/worker.hpp: the verdict records every rank wrote, read from
// the workers' output, asserted on by name:
//   const Verdicts v(result);
//   CHECK_VERDICTS_PASSED(v);                               // no check failed on any rank
//   CHECK_VERDICT(v, "training equals one process");         // given, and passed, everywhere
// Header-only, like the worker side.

#include <cctype>
#include <cstddef>
#include <string>
#include <vector>

#include <doctest/doctest.h>

#include "launch/worker_group.hpp"

namespace accel::test {

struct Verdict {
  std::string name;
  bool ok = false;
  int rank = -1;
  std::string detail;
};

class Verdicts {
 public:
  explicit Verdicts(const launch::GroupResult& result) {
    for (const auto& worker : result.workers) parse(worker.output);
  }
  explicit Verdicts(const std::string& output) { parse(output); }

  const std::vector<Verdict>& all() const { return all_; }
  // The records of `name`, rank by rank as they came.
  std::vector<Verdict> named(const std::string& name) const {
    std::vector<Verdict> out;
    for (const Verdict& v : all_)
      if (v.name == name) out.push_back(v);
    return out;
  }
  // Why `name` did not pass ("" when it did): no rank gave it, fewer than `ranks` did (when
  // ranks > 0), or a rank gave it not ok (with its detail).
  std::string problem(const std::string& name, int ranks = 0) const {
    const std::vector<Verdict> given = named(name);
    if (given.empty()) return "no rank gave the verdict '" + name + "'";
    if (ranks > 0 && int(given.size()) < ranks)
      return std::to_string(given.size()) + " of " + std::to_string(ranks) +
             " ranks gave the verdict '" + name + "'";
    for (const Verdict& v : given)
      if (!v.ok) return "rank " + std::to_string(v.rank) + ": '" + name + "' failed: " + v.detail;
    return "";
  }
  // Every verdict not ok, "rank R: NAME: DETAIL".
  std::vector<std::string> failed() const {
    std::vector<std::string> out;
    for (const Verdict& v : all_)
      if (!v.ok) out.push_back("rank " + std::to_string(v.rank) + ": " + v.name + ": " + v.detail);
    return out;
  }
  // The detail of `name` on `rank` (the first given when rank < 0); "" when absent.
  std::string detail(const std::string& name, int rank = -1) const {
    for (const Verdict& v : all_)
      if (v.name == name && (rank < 0 || v.rank == rank)) return v.detail;
    return "";
  }

 private:
  // Our own records only: {"verdict":S,"ok":B,"rank":N,"detail":S}, one per line.
  void parse(const std::string& output) {
    std::size_t at = 0;
    while ((at = output.find("{\"verdict\":", at)) != std::string::npos) {
      std::size_t p = at + 11;
      Verdict v;
      bool good = string_at(output, p, v.name) && literal(output, p, ",\"ok\":");
      if (good) {
        v.ok = output.compare(p, 4, "true") == 0;
        p += v.ok ? 4 : 5;
        good = literal(output, p, ",\"rank\":");
      }
      if (good) {
        std::size_t end = p;
        while (end < output.size() && (std::isdigit(output[end]) || output[end] == '-')) ++end;
        v.rank = end > p ? std::stoi(output.substr(p, end - p)) : -1;
        p = end;
        good = literal(output, p, ",\"detail\":") && string_at(output, p, v.detail) &&
               literal(output, p, "}");
      }
      if (good) all_.push_back(std::move(v));
      at = p > at ? p : at + 1;
    }
  }
  static bool literal(const std::string& s, std::size_t& p, const char* text) {
    const std::string t = text;
    if (s.compare(p, t.size(), t) != 0) return false;
    p += t.size();
    return true;
  }
  static bool string_at(const std::string& s, std::size_t& p, std::string& out) {
    if (p >= s.size() || s[p] != '"') return false;
    for (++p; p < s.size(); ++p) {
      if (s[p] == '"') {
        ++p;
        return true;
      }
      if (s[p] == '\\' && p + 1 < s.size()) {
        ++p;
        if (s[p] == 'u' && p + 4 < s.size()) {
          out += char(std::stoi(s.substr(p + 1, 4), nullptr, 16));
          p += 4;
          continue;
        }
      }
      out += s[p];
    }
    return false;
  }
  std::vector<Verdict> all_;
};

}  // namespace accel::test

// The checks a test makes on them, with the reason in the failure message.
#define CHECK_VERDICT(verdicts, ...)                                           \
  do {                                                                         \
    const std::string accel_verdict_problem = (verdicts).problem(__VA_ARGS__); \
    CHECK_MESSAGE(accel_verdict_problem.empty(), accel_verdict_problem);       \
  } while (false)
#define CHECK_VERDICTS_PASSED(verdicts)                                        \
  do {                                                                         \
    const std::vector<std::string> accel_verdict_failed = (verdicts).failed(); \
    for (const std::string& f : accel_verdict_failed) FAIL_CHECK(f);           \
    CHECK(!(verdicts).all().empty());                                          \
  } while (false)
