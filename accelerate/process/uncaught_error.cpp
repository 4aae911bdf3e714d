#include "accelerate/process/uncaught_error.hpp"

#include <cxxabi.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>
#include <string>
#include <typeinfo>

#include "foundation/error.hpp"

namespace accel {
namespace {

std::atomic<int> g_rank{-1};
std::terminate_handler g_previous = nullptr;

std::string demangled(const std::type_info& type) {
  int status = 0;
  std::unique_ptr<char, void (*)(void*)> name(
      abi::__cxa_demangle(type.name(), nullptr, nullptr, &status), std::free);
  return status == 0 && name ? name.get() : type.name();
}

[[noreturn]] void on_terminate() {
  if (std::exception_ptr error = std::current_exception()) try {
      std::rethrow_exception(error);
    } catch (const Error& e) {
      const int rank = g_rank.load();
      const std::string who = rank >= 0 ? "[rank " + std::to_string(rank) : "[accel";
      std::fflush(stdout);
      std::fprintf(stderr, "%s%s%s: %s\n", who.c_str(), kUncaughtTag, demangled(typeid(e)).c_str(),
                   e.what());
      std::fflush(nullptr);
      // Not exit(): other threads (a communicator's worker) still run, and static
      // destructors racing them could hang; nothing of ours is left half-written (checkpoints
      // are installed by rename).
      std::_Exit(1);
    } catch (...) {
    }
  if (g_previous != nullptr) g_previous();
  std::abort();
}

}  // namespace

void exit_cleanly_on_uncaught_errors(int rank) {
  g_rank = rank;
  static const bool installed = [] {
    g_previous = std::set_terminate(on_terminate);
    return true;
  }();
  (void)installed;
}

}  // namespace accel
