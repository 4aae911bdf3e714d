// The test workers' shared parts (tests/support/worker.hpp) and the test side that reads their
// verdicts (tests/support/verdicts.hpp): flags, and records that survive any text.

#include <doctest/doctest.h>

#include <unistd.h>

#include <cstdio>
#include <string>
#include <vector>

#include "tests/support/verdicts.hpp"
#include "tests/support/worker.hpp"

using namespace accel::test;

namespace {
WorkerFlags flags_of(std::vector<std::string> args) {
  std::vector<char*> argv;
  static std::string program = "worker";
  argv.push_back(program.data());
  for (std::string& a : args) argv.push_back(a.data());
  return WorkerFlags(int(argv.size()), argv.data());
}

// What a VerdictLog writes for these checks, captured from stdout.
std::string written_by(
    const std::vector<std::pair<bool, std::pair<std::string, std::string>>>& checks,
    int& exit_code) {
  std::FILE* capture = std::tmpfile();
  REQUIRE(capture != nullptr);
  std::fflush(stdout);
  const int saved = dup(fileno(stdout));
  dup2(fileno(capture), fileno(stdout));
  VerdictLog log;
  for (const auto& [ok, what] : checks) log.check(ok, what.first, what.second);
  exit_code = log.exit_code();
  std::fflush(stdout);
  dup2(saved, fileno(stdout));
  close(saved);
  std::rewind(capture);
  std::string out;
  char buffer[256];
  while (std::fgets(buffer, sizeof buffer, capture) != nullptr) out += buffer;
  std::fclose(capture);
  return out;
}
}  // namespace

TEST_CASE("worker flags: values, switches, numbers, and what is refused") {
  const WorkerFlags f =
      flags_of({"--model", "cnn", "--shift", "-1", "--bf16", "--clip", "0.5", "--scheduler"});
  CHECK(f.text("model") == "cnn");
  CHECK(f.integer("shift") == -1);
  CHECK(f.has("bf16"));
  CHECK(f.real("clip") == 0.5);
  CHECK(f.has("scheduler"));
  CHECK(!f.has("dump"));
  CHECK(f.text("dump", "none") == "none");
  CHECK(f.integer("steps", 20) == 20);
  CHECK_THROWS_WITH_AS(flags_of({"--steps", "many"}).integer("steps"),
                       doctest::Contains("--steps 'many' is not a number"), std::invalid_argument);
  CHECK_NOTHROW(f.only({"model", "shift", "bf16", "clip", "scheduler"}));
  CHECK_THROWS_WITH_AS(f.only({"model", "shift", "bf16", "clip"}),
                       doctest::Contains("unknown flag --scheduler"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(flags_of({"model", "cnn"}), doctest::Contains("'model' is not a --flag"),
                       std::invalid_argument);
}

TEST_CASE("verdicts written by a worker are read back by name, whatever their text") {
  int exit_code = -1;
  const std::string out =
      written_by({{true, {"training equals one process", "max |diff| 1e-07 (limit 2e-06)"}},
                  {false, {"a \"quoted\" name, with \\ and a tab\t", "line\nbreak"}}},
                 exit_code);
  CHECK(exit_code == 1);
  const Verdicts v("other output\n" + out + "more output\n");
  REQUIRE(v.all().size() == 2);
  CHECK(v.problem("training equals one process").empty());
  CHECK(v.detail("training equals one process") == "max |diff| 1e-07 (limit 2e-06)");
  CHECK(v.all()[1].name == "a \"quoted\" name, with \\ and a tab\t");
  CHECK(v.all()[1].detail == "line\nbreak");
  CHECK(v.problem("a \"quoted\" name, with \\ and a tab\t").find("failed: line") !=
        std::string::npos);
  CHECK(v.problem("never given") == "no rank gave the verdict 'never given'");
  CHECK(v.problem("training equals one process", 2) ==
        "1 of 2 ranks gave the verdict 'training equals one process'");
  CHECK(v.failed().size() == 1);
}
