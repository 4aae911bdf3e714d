#pragma once
// `accel config`: the questions, in Accelerate's order, skipping those that do not apply,
// each showing its default. The questions are asked through a Prompter, so the same wizard
// runs line by line on piped input (scripts, tests) or with arrow-key menus on a terminal.

#include <iosfwd>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "config/config.hpp"
#include "config/detect.hpp"

namespace accel::config {

// A key's question as the wizard asks it: the schema's (config.hpp), with its menu cut to the
// values the schema accepts.
struct Question {
  std::string key;              // schema key
  std::string text;             // "How many processes ...?"
  std::vector<Option> options;  // empty: a free-text answer
  std::string default_value;    // canonical
};

class Prompter {
 public:
  virtual ~Prompter() = default;
  // The answer as typed ("" takes the default), or for a choice picked from a menu the
  // option's value; nullopt when the input ended.
  virtual std::optional<std::string> ask(const Question&) = 0;
  // A line for the user: why an answer was not taken.
  virtual void say(const std::string& line) = 0;
};

// Reads answers line by line from `in`, writes questions (and echoes answers) to `out`.
std::unique_ptr<Prompter> make_line_prompter(std::istream& in, std::ostream& out);
// Menus with arrow keys (raw mode) for choices, cooked line input for the rest.
std::unique_ptr<Prompter> make_terminal_prompter(int in_fd, int out_fd);

// Asks until every question that applies has a valid answer; an invalid one is explained and
// asked again. Throws ConfigError when the input ends first. The result is consistent
// (it passes the same checks as a loaded file).
Config run_wizard(Prompter&, const Hardware&);

}  // namespace accel::config
