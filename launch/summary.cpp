#include "launch/summary.hpp"

#include <algorithm>

namespace accel::launch {
namespace {

std::string pad(std::string s, std::size_t width) {
  if (s.size() < width) s.append(width - s.size(), ' ');
  return s;
}

}  // namespace

std::string describe_settings(const config::ResolvedConfig& resolved, const std::string& indent) {
  std::size_t name_width = 0, value_width = 0;
  std::vector<std::pair<std::string, std::string>> rows;
  for (const auto& spec : config::schema()) {
    if (!config::is_written(resolved.config, spec.name)) continue;
    const std::string value = config::get_value(resolved.config, spec.name);
    rows.emplace_back(spec.name, value);
    name_width = std::max(name_width, spec.name.size());
    value_width = std::max(value_width, value.size());
  }
  std::string out;
  for (const auto& [name, value] : rows) {
    std::string origin;
    if (auto it = resolved.origins.find(name); it != resolved.origins.end())
      origin = it->second;
    else if (auto s = resolved.sources.find(name); s != resolved.sources.end())
      origin = config::to_string(s->second);
    out += indent + pad(name, name_width + 2) + pad(value, value_width + 2) + origin + "\n";
  }
  out += indent + "config file: " + (resolved.file ? *resolved.file : std::string("none")) + "\n";
  return out;
}

std::vector<std::string> guess_warnings(const config::ResolvedConfig& resolved) {
  std::vector<std::string> out;
  for (const auto& guess : resolved.guesses) {
    const std::string key = guess.substr(0, guess.find(' '));
    out.push_back("warning: " + guess + " was guessed; choose it with " + config::flag_for(key) +
                  ", " + config::env_var_for(key) + " or in the config file (accel config)");
  }
  return out;
}

std::string describe_env_defaults(const std::vector<EnvDefault>& defaults,
                                  const std::string& indent) {
  std::string out;
  for (const auto& d : defaults)
    out += indent + d.name + "=" + d.value + "  (" + d.why + "; to change: " + d.opt_out + ")\n";
  return out;
}

}  // namespace accel::launch
