// `accel config`: parsing and dispatch only; the work is in config/.
//   accel config [--config_file F]                    ask questions, write the config
//   accel config default [--config_file F] [--force]  write one for this machine, no questions
//   accel config show [--config_file F]               the config in effect and where each value
//   came from accel config validate [FILE]                      check a file (default: the default
//   location)

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <iostream>
#include <optional>
#include <string>
#include <string_view>

#include "config/config_file.hpp"
#include "config/detect.hpp"
#include "config/resolve.hpp"
#include "config/wizard.hpp"
#include "foundation/error.hpp"
#include "tools/commands.hpp"

namespace accel::tools {
namespace {

namespace cfg = accel::config;

constexpr const char* kUsage =
    "usage: accel config [--config_file FILE]\n"
    "           ask the questions and write the config (Enter takes the [default])\n"
    "       accel config default [--config_file FILE] [--force]\n"
    "           write a config for this machine without questions\n"
    "       accel config show [--config_file FILE]\n"
    "           print the config in effect and where each value came from\n"
    "       accel config validate [FILE]\n"
    "           check a config file; exit 0 if valid, 2 with the problem if not\n"
    "The default file is $ACCEL_CONFIG_FILE, else $XDG_CONFIG_HOME (or ~/.config)"
    "/accelerate-cpp/default_config.yaml.\n";

struct Args {
  std::string action;  // "", "default", "show", "validate"
  std::optional<std::string> config_file;
  std::optional<std::string> file;  // validate's FILE
  bool force = false;
  bool help = false;
};

Args parse_args(int argc, char** argv) {
  Args args;
  int i = 0;
  if (argc > 0 && argv[0][0] != '-') {
    args.action = argv[0];
    if (args.action != "default" && args.action != "show" && args.action != "validate")
      throw ConfigError("accel config: unknown action '" + args.action +
                        "' (default, show, validate)");
    ++i;
  }
  for (; i < argc; ++i) {
    const std::string_view arg(argv[i]);
    if (arg == "-h" || arg == "--help") {
      args.help = true;
    } else if (arg == "--force" && args.action == "default") {
      args.force = true;
    } else if (arg == "--config_file" || arg == "--config-file") {
      if (i + 1 >= argc) throw ConfigError("accel config: --config_file needs a value");
      args.config_file = argv[++i];
    } else if (arg.starts_with("--config_file=")) {
      args.config_file = std::string(arg.substr(std::string_view("--config_file=").size()));
    } else if (args.action == "validate" && !arg.starts_with("-") && !args.file) {
      args.file = std::string(arg);
    } else {
      throw ConfigError("accel config" + (args.action.empty() ? "" : " " + args.action) +
                        ": unexpected argument '" + std::string(arg) + "'");
    }
  }
  return args;
}

std::string target_path(const Args& args) {
  return args.config_file ? *args.config_file : cfg::default_config_path();
}

void print_notes(const std::vector<std::string>& notes) {
  for (const auto& note : notes) std::cout << "note: " << note << "\n";
}

int run_wizard_command(const Args& args) {
  const std::string path = target_path(args);
  // Menus need a terminal on both ends: keys come from stdin, the redrawn menu goes to stdout.
  const bool terminal = ::isatty(STDIN_FILENO) == 1 && ::isatty(STDOUT_FILENO) == 1;
  std::cout << "accel config: answers go to " << path << " (Enter takes the [default])\n";
  std::cout.flush();
  const auto prompter = terminal ? cfg::make_terminal_prompter(STDIN_FILENO, STDOUT_FILENO)
                                 : cfg::make_line_prompter(std::cin, std::cout);
  const cfg::Config config = cfg::run_wizard(*prompter, cfg::detect_hardware());
  cfg::save_config(path, config);
  std::cout << "accel config: wrote " << path << "\n";
  return 0;
}

int run_default_command(const Args& args) {
  const std::string path = target_path(args);
  std::error_code ec;
  if (std::filesystem::exists(path, ec) && !args.force)
    throw ConfigError(
        "accel config default: " + path +
        " already exists; pass --force to replace it, or run `accel config` to change it");
  const cfg::Hardware hw = cfg::detect_hardware();
  const cfg::Config config = cfg::defaults_for(hw);
  cfg::save_config(path, config);
  std::cout << "accel config default: wrote " << path << " for this machine (" << cfg::describe(hw)
            << "):\n";
  for (const auto& spec : cfg::schema())
    if (cfg::is_written(config, spec.name))
      std::cout << "  " << spec.name << ": " << cfg::get_value(config, spec.name) << "\n";
  return 0;
}

int run_show_command(const Args& args) {
  const cfg::ResolvedConfig resolved = cfg::resolve_config(args.config_file, {});
  if (resolved.file)
    std::cout << "config file: " << *resolved.file << "\n";
  else
    std::cout << "config file: none (" << cfg::default_config_path() << " does not exist)\n";
  std::size_t width = 0;
  for (const auto& spec : cfg::schema()) width = std::max(width, spec.name.size());
  for (const auto& spec : cfg::schema()) {
    if (!cfg::is_written(resolved.config, spec.name)) continue;
    std::string value = cfg::get_value(resolved.config, spec.name);
    std::string line = "  " + spec.name + ": " + std::string(width - spec.name.size(), ' ') + value;
    line += std::string(line.size() < width + 20 ? width + 20 - line.size() : 1, ' ');
    std::cout << line << "(" << resolved.origins.at(spec.name) << ")\n";
  }
  print_notes(resolved.notes);
  return 0;
}

int run_validate_command(const Args& args) {
  const std::string path = args.file ? *args.file : target_path(args);
  const cfg::ResolvedConfig loaded = cfg::load_config_file(path);
  print_notes(loaded.notes);
  std::cout << path << ": valid\n";
  return 0;
}

}  // namespace

int run_config_command(int argc, char** argv) {
  const Args args = parse_args(argc, argv);
  if (args.help) {
    std::fputs(kUsage, stdout);
    return 0;
  }
  if (args.action == "default") return run_default_command(args);
  if (args.action == "show") return run_show_command(args);
  if (args.action == "validate") return run_validate_command(args);
  return run_wizard_command(args);
}

}  // namespace accel::tools
