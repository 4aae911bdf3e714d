#include "foundation/env_value.hpp"

#include <charconv>
#include <cstdlib>
#include <string>
#include <string_view>

#include "foundation/error.hpp"

namespace accel {

std::uint64_t env_uint(const char* name, std::uint64_t fallback, std::uint64_t min,
                       std::uint64_t max) {
  const char* text = std::getenv(name);
  if (!text || !*text) return fallback;
  const std::string_view s(text);
  std::uint64_t value = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
  if (ec != std::errc() || end != s.data() + s.size() || value < min || value > max) {
    std::string range = "a whole number";
    if (max != std::numeric_limits<std::uint64_t>::max())
      range += " from " + std::to_string(min) + " to " + std::to_string(max);
    else if (min > 0)
      range += " of at least " + std::to_string(min);
    throw ConfigError(std::string(name) + "='" + text + "' is not " + range);
  }
  return value;
}

}  // namespace accel
