// The one doctest main every test binary links. doctest prints its summary at the end of
// each binary; when every test case skipped itself, the binary exits with the code ctest
// reports as "skipped".
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>

#include "tests/support/skip.hpp"

namespace accel::test {
namespace {
int g_started = 0;
int g_skipped = 0;

// Counts test-case entries (doctest re-enters a case once per subcase path; a case that
// skips returns before any subcase, so it is entered exactly once).
struct StartCounter : doctest::IReporter {
  explicit StartCounter(const doctest::ContextOptions&) {}
  void report_query(const doctest::QueryData&) override {}
  void test_run_start() override {}
  void test_run_end(const doctest::TestRunStats&) override {}
  void test_case_start(const doctest::TestCaseData&) override { ++g_started; }
  void test_case_reenter(const doctest::TestCaseData&) override { ++g_started; }
  void test_case_end(const doctest::CurrentTestCaseStats&) override {}
  void test_case_exception(const doctest::TestCaseException&) override {}
  void subcase_start(const doctest::SubcaseSignature&) override {}
  void subcase_end() override {}
  void log_assert(const doctest::AssertData&) override {}
  void log_message(const doctest::MessageData&) override {}
  void test_case_skipped(const doctest::TestCaseData&) override {}
};
}  // namespace

bool skip_unless(bool available, const std::string& reason) {
  if (available) return false;
  ++g_skipped;
  std::printf("SKIPPED: %s\n", reason.c_str());
  std::fflush(stdout);
  return true;
}

bool all_skipped() { return g_started > 0 && g_skipped == g_started; }

}  // namespace accel::test

DOCTEST_REGISTER_LISTENER("start_counter", 1, accel::test::StartCounter);

int main(int argc, char** argv) {
  doctest::Context context(argc, argv);
  const int result = context.run();
  if (context.shouldExit()) return result;
  if (result == 0 && accel::test::all_skipped()) return accel::test::kSkipExitCode;
  return result;
}
