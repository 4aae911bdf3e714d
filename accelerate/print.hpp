#pragma once
// Accelerator::print's two forms, framework-free (accelerator.hpp has the contract):
//  - printf: print("step %d loss %.4f\n", step, loss), when the first argument is a C string
//    with a '%' whose conversions read the other arguments exactly, one each of the type
//    printf reads (%d an int, %ld a long, %zu a size_t, %f a double, %s a C string; no %n);
//  - streaming: anything else, print("loss ", loss, " at ", step): each argument written with
//    operator<<, then a newline (Python's print) unless the text already ends with one.
// The check keeps printf from reading an argument that is not there or not of its type (no
// undefined behaviour); a streamed text whose '%' happens to read its arguments exactly
// ("50% done at ", step: "% d") is printf's, as in C. Debian 12's GCC 12 has no <format>, so
// a std::format form is not offered.

#include <cstddef>
#include <cstdio>
#include <initializer_list>
#include <sstream>
#include <string>
#include <type_traits>

namespace accel::print_detail {

// What printf reads for an argument, after the default argument promotions.
enum class PrintfArg {
  none,  // printf cannot take it (a class, a reference to one): the streaming form
  int_,  // int-sized integer (bool, char, short, int, unsigned, after promotion)
  long_,
  long_long,
  double_,  // float, double
  long_double,
  c_string,  // const char*, char*, and string literals (decayed)
  pointer,   // any other object pointer (%p)
};

template <typename T>
constexpr PrintfArg printf_arg() {
  using U = std::decay_t<T>;
  if constexpr (std::is_same_v<U, const char*> || std::is_same_v<U, char*>) {
    return PrintfArg::c_string;
  } else if constexpr (std::is_pointer_v<U>) {
    return PrintfArg::pointer;
  } else if constexpr (std::is_floating_point_v<U>) {
    return std::is_same_v<U, long double> ? PrintfArg::long_double : PrintfArg::double_;
  } else if constexpr (std::is_integral_v<U>) {
    if constexpr (sizeof(U) <= sizeof(int)) return PrintfArg::int_;
    if constexpr (sizeof(U) == sizeof(long)) return PrintfArg::long_;
    if constexpr (sizeof(U) == sizeof(long long)) return PrintfArg::long_long;
    return PrintfArg::none;
  } else {
    return PrintfArg::none;
  }
}

// Whether `format` holds at least one '%' and its conversions read exactly `args`, in order
// (a '*' width or precision reads an int; "%n" is never accepted).
bool printf_reads(const char* format, std::initializer_list<PrintfArg> args);

// Writes `text` to `out` in one call (a line from another rank cannot land inside it).
void write_text(std::FILE* out, const std::string& text);
// fprintf and fflush, for a format printf_reads accepted for these arguments.
void write_formatted(std::FILE* out, const char* format, ...);

template <typename First, typename... Rest>
void print_to(std::FILE* out, const First& first, const Rest&... rest) {
  if constexpr (printf_arg<First>() == PrintfArg::c_string &&
                ((printf_arg<Rest>() != PrintfArg::none) && ...)) {
    if (first != nullptr && printf_reads(first, {printf_arg<Rest>()...})) {
      write_formatted(out, first, rest...);
      return;
    }
  }
  std::ostringstream text;
  text << first;
  ((text << rest), ...);
  std::string line = text.str();
  if (line.empty() || line.back() != '\n') line += '\n';
  write_text(out, line);
}

}  // namespace accel::print_detail
