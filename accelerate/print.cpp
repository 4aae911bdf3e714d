#include "accelerate/print.hpp"

#include <cctype>
#include <cstdarg>
#include <cstdint>
#include <cstring>
#include <string_view>

namespace accel::print_detail {
namespace {

// The integer kind printf reads for a type of `bytes` bytes (the same mapping printf_arg makes).
constexpr PrintfArg integer_of_size(std::size_t bytes) {
  if (bytes <= sizeof(int)) return PrintfArg::int_;
  if (bytes == sizeof(long)) return PrintfArg::long_;
  if (bytes == sizeof(long long)) return PrintfArg::long_long;
  return PrintfArg::none;
}

// The length modifier at `p` ("", "hh", "h", "l", "ll", "j", "z", "t", "L"), advanced past.
std::string_view length_modifier(const char*& p) {
  for (std::string_view m : {"hh", "ll", "h", "l", "j", "z", "t", "L"})
    if (std::strncmp(p, m.data(), m.size()) == 0) {
      p += m.size();
      return m;
    }
  return {};
}

// What conversion `c` with length `length` reads, or none when printf would not read one of
// our kinds (a wide character or string, %n, an unknown conversion).
PrintfArg reads(char c, std::string_view length) {
  if (std::strchr("diouxXc", c) != nullptr) {
    if (c == 'c') return length.empty() ? PrintfArg::int_ : PrintfArg::none;
    if (length.empty() || length == "h" || length == "hh") return PrintfArg::int_;
    if (length == "l") return integer_of_size(sizeof(long));
    if (length == "ll") return integer_of_size(sizeof(long long));
    if (length == "j") return integer_of_size(sizeof(std::intmax_t));
    if (length == "z") return integer_of_size(sizeof(std::size_t));
    if (length == "t") return integer_of_size(sizeof(std::ptrdiff_t));
    return PrintfArg::none;
  }
  if (std::strchr("fFeEgGaA", c) != nullptr) {
    if (length.empty() || length == "l") return PrintfArg::double_;
    return length == "L" ? PrintfArg::long_double : PrintfArg::none;
  }
  if (c == 's') return length.empty() ? PrintfArg::c_string : PrintfArg::none;
  if (c == 'p') return length.empty() ? PrintfArg::pointer : PrintfArg::none;
  return PrintfArg::none;
}

bool fits(PrintfArg wanted, PrintfArg given) {
  return wanted == given || (wanted == PrintfArg::pointer && given == PrintfArg::c_string);
}

}  // namespace

bool printf_reads(const char* format, std::initializer_list<PrintfArg> args) {
  const PrintfArg* next = args.begin();
  const auto take = [&](PrintfArg wanted) {
    return wanted != PrintfArg::none && next != args.end() && fits(wanted, *next++);
  };
  bool any_percent = false;
  for (const char* p = format; *p != '\0'; ++p) {
    if (*p != '%') continue;
    any_percent = true;
    if (*++p == '%') continue;
    while (*p != '\0' && std::strchr("-+ #0'", *p) != nullptr) ++p;  // flags
    if (*p == '*') {
      if (!take(PrintfArg::int_)) return false;
      ++p;
    }
    while (std::isdigit(static_cast<unsigned char>(*p))) ++p;  // width
    if (*p == '.') {
      if (*++p == '*') {
        if (!take(PrintfArg::int_)) return false;
        ++p;
      }
      while (std::isdigit(static_cast<unsigned char>(*p))) ++p;  // precision
    }
    const std::string_view length = length_modifier(p);
    if (*p == '\0' || !take(reads(*p, length))) return false;
  }
  return any_percent && next == args.end();
}

void write_formatted(std::FILE* out, const char* format, ...) {
  std::va_list args;
  va_start(args, format);
  std::vfprintf(out, format, args);
  va_end(args);
  std::fflush(out);
}

void write_text(std::FILE* out, const std::string& text) {
  std::fwrite(text.data(), 1, text.size(), out);
  std::fflush(out);
}

}  // namespace accel::print_detail
