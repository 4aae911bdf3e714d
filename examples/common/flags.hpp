#pragma once
// `--key value` and `--key=value` command lines for the examples, as a map; the example turns
// each value into its flag. `usage(problem)` is called (and must not return) on a malformed
// line.

#include <map>
#include <string>

namespace examples {

template <typename Usage>
std::map<std::string, std::string> parse_flag_values(int argc, char** argv, Usage&& usage) {
  std::map<std::string, std::string> values;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (!arg.starts_with("--")) usage("unexpected argument '" + arg + "'");
    arg = arg.substr(2);
    if (const auto eq = arg.find('='); eq != std::string::npos) {
      values[arg.substr(0, eq)] = arg.substr(eq + 1);
    } else {
      if (i + 1 >= argc) usage("--" + arg + " needs a value");
      values[arg] = argv[++i];
    }
  }
  return values;
}

}  // namespace examples
