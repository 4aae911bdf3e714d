// tune_malloc_for_training: left alone when the user chose (ACCEL_MALLOC_TUNING=0, a
// glibc.malloc tunable in GLIBC_TUNABLES), a bad value named, and once tuned a freed 16 MiB
// block stays in the heap for the next allocation instead of being mapped and unmapped.
// The cases run in file order: the last one changes this process's malloc for good.

#include <doctest/doctest.h>
#include <malloc.h>

#include <cstdlib>
#include <cstring>

#include "accelerate/process/malloc_tuning.hpp"
#include "foundation/error.hpp"

using namespace accel;

namespace {

struct Env {
  Env(const char* name, const char* value) : name_(name) { setenv(name, value, 1); }
  ~Env() { unsetenv(name_); }
  const char* name_;
};

}  // namespace

TEST_CASE("malloc tuning: ACCEL_MALLOC_TUNING=0 leaves malloc alone") {
  Env off("ACCEL_MALLOC_TUNING", "0");
  CHECK_FALSE(tune_malloc_for_training());
}

TEST_CASE("malloc tuning: a glibc.malloc tunable in GLIBC_TUNABLES is the user's choice") {
  Env user("GLIBC_TUNABLES", "glibc.malloc.arena_max=2");
  CHECK_FALSE(tune_malloc_for_training());
}

TEST_CASE("malloc tuning: a bad ACCEL_MALLOC_TUNING is refused, naming it") {
  Env bad("ACCEL_MALLOC_TUNING", "yes");
  CHECK_THROWS_WITH(tune_malloc_for_training(), doctest::Contains("ACCEL_MALLOC_TUNING"));
}

TEST_CASE("malloc tuning: a freed 16 MiB block stays in the heap") {
  unsetenv("GLIBC_TUNABLES");
  REQUIRE(tune_malloc_for_training());
  constexpr std::size_t kBytes = 16u << 20;
  const struct mallinfo2 before = mallinfo2();
  void* block = std::malloc(kBytes);
  REQUIRE(block != nullptr);
  std::memset(block, 1, kBytes);
  const struct mallinfo2 held = mallinfo2();
  // From the heap, not mmap (glibc's default threshold starts at 128 KiB).
  CHECK(held.hblkhd == before.hblkhd);
  CHECK(held.arena >= before.arena + kBytes);
  std::free(block);
  const struct mallinfo2 after = mallinfo2();
  CHECK(after.arena == held.arena);  // not trimmed
  CHECK(after.fordblks >= kBytes);   // free, for the next allocation
}
