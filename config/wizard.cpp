#include "config/wizard.hpp"

#include <algorithm>
#include <charconv>
#include <istream>
#include <ostream>

#include "config/layers.hpp"
#include "config/terminal.hpp"
#include "foundation/error.hpp"

namespace accel::config {
namespace {

std::optional<int> as_number(const std::string& text) {
  int v = 0;
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || ptr != text.data() + text.size() || text.empty()) return std::nullopt;
  return v;
}

std::string trimmed(const std::string& s) {
  const auto b = s.find_first_not_of(" \t\r\n");
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(" \t\r\n") - b + 1);
}

const Option* default_option(const Question& q) {
  for (const auto& o : q.options)
    if (o.value == q.default_value) return &o;
  return q.options.empty() ? nullptr : &q.options.front();
}

class LinePrompter : public Prompter {
 public:
  LinePrompter(std::istream& in, std::ostream& out) : in_(in), out_(out) {}

  std::optional<std::string> ask(const Question& q) override {
    if (q.options.empty()) {
      out_ << q.text << " [" << q.default_value << "]: ";
    } else {
      out_ << q.text << "\n";
      for (const auto& o : q.options) out_ << "  " << o.number << ") " << o.label << "\n";
      const Option* d = default_option(q);
      out_ << "Number or name [" << (d ? std::to_string(d->number) + ": " + d->value : "") << "]: ";
    }
    out_.flush();
    std::string line;
    if (!std::getline(in_, line)) {
      out_ << "\n";
      return std::nullopt;
    }
    // Piped input is not echoed by a terminal; echo it so a transcript reads as a dialogue.
    out_ << line << "\n";
    return line;
  }

  void say(const std::string& line) override { out_ << line << "\n"; }

 private:
  std::istream& in_;
  std::ostream& out_;
};

class TerminalPrompter : public Prompter {
 public:
  TerminalPrompter(int in_fd, int out_fd) : in_(in_fd), out_(out_fd) {}

  std::optional<std::string> ask(const Question& q) override {
    if (q.options.empty()) {
      write_text(out_, q.text + " [" + q.default_value + "]: ");
      return read_terminal_line(in_);
    }
    std::vector<std::string> labels;
    std::vector<std::string> names;  // the label without its explanation, for the answered line
    std::vector<int> numbers;
    int initial = 0;
    for (std::size_t i = 0; i < q.options.size(); ++i) {
      labels.push_back(q.options[i].label);
      names.push_back(q.options[i].label.substr(0, q.options[i].label.find("  ")));
      numbers.push_back(q.options[i].number);
      if (q.options[i].value == q.default_value) initial = static_cast<int>(i);
    }
    const auto picked = choose_on_terminal(in_, out_, q.text, labels, names, numbers, initial);
    if (!picked) return std::nullopt;
    return q.options[static_cast<std::size_t>(*picked)].value;
  }

  void say(const std::string& line) override { write_text(out_, line + "\n"); }

 private:
  int in_;
  int out_;
};

// Reads a choice answer: an option's number, or a name the schema accepts ("deepspeed",
// "yes") that is one of the options.
Parsed interpret_choice(const Question& q, const std::string& text) {
  if (const auto n = as_number(text)) {
    for (const auto& o : q.options)
      if (o.number == *n) return {o.value, ""};
  }
  auto parsed = parse_value(q.key, text);
  if (parsed.value) {
    for (const auto& o : q.options)
      if (o.value == *parsed.value) return parsed;
  }
  std::string names;
  for (const auto& o : q.options) names += (names.empty() ? "" : ", ") + o.value;
  const int lo = q.options.front().number;
  const int hi = q.options.back().number;
  return {std::nullopt,
          "'" + text + "' is not a choice: type " +
              (lo == hi ? std::to_string(lo) : std::to_string(lo) + "-" + std::to_string(hi)) +
              " or one of " + names};
}

// The wizard's state: answers so far over derived defaults, rebuilt after each answer so a
// later question's default follows the earlier answers (num_processes after MULTI_GPU).
class Wizard {
 public:
  Wizard(Prompter& prompter, const Hardware& hw) : prompter_(prompter), hw_(hw) {}

  Config run() {
    const auto type = [&] { return current().distributed_type; };
    ask("compute_environment");
    ask("distributed_type");
    const bool multi_process = type() == DistributedType::MULTI_CPU ||
                               type() == DistributedType::MULTI_GPU ||
                               type() == DistributedType::ZERO;
    if (multi_process) {
      ask("num_machines");
      if (current().num_machines > 1) {
        ask("rdzv_backend");
        if (current().rdzv_backend == "c10d")
          ask("min_machines");  // ranks go by join order: no machine_rank
        else
          ask("machine_rank");
        ask("main_process_ip");
        ask("main_process_port");
      }
    }
    if (type() == DistributedType::NO || type() == DistributedType::ZERO ||
        type() == DistributedType::DATA_PARALLEL)
      ask("use_cpu");
    if (type() == DistributedType::DATA_PARALLEL && !uses_gpu(current()))
      ask("data_parallel_replicas");
    if (type() == DistributedType::ZERO) {
      ask("zero_stage");
      ask("offload_optimizer_device");
      if (current().zero_stage == 3) {
        ask("zero3_param_persistence_threshold");
        ask("reshard_after_forward");
        ask("auto_wrap_policy");
      }
    }
    if (multi_process) ask("num_processes");
    if (uses_gpu(current()) && type() != DistributedType::NO) ask("gpu_ids");
    ask("mixed_precision");
    if (multi_process && !uses_gpu(current())) ask("cpu_communicator");
    ask("gradient_accumulation_steps");
    if (type() == DistributedType::MULTI_CPU) {
      ask("pipeline_parallel_size");
      if (current().pipeline_parallel_size > 1) {
        ask("num_microbatches");
        ask("pipeline_schedule");
        if (current().pipeline_schedule == "INTERLEAVED_1F1B") ask("pipeline_chunks");
        ask("partition_method");
      }
    }
    return detail::build_config(answers_, hw_, true).config;
  }

 private:
  Config current() const { return detail::build_config(answers_, hw_, false).config; }

  // The schema's question for `key`, its menu cut to the values the schema accepts (a stage
  // beyond kMaxZeroStage is not offered), its default what the answers so far imply.
  void ask(const std::string& key) {
    const KeySpec& spec = *find_key(key);
    Question q{key, spec.question, {}, get_value(current(), key)};
    const std::string last_machine = "{last_machine}";
    if (const auto at = q.text.find(last_machine); at != std::string::npos)
      q.text.replace(at, last_machine.size(), std::to_string(current().num_machines - 1));
    for (const auto& option : spec.options)
      if (parse_value(key, option.value).value) q.options.push_back(option);
    ask(q);
  }

  void ask(const Question& q) {
    while (true) {
      const auto answer = prompter_.ask(q);
      if (!answer)
        throw ConfigError("accel config: the input ended before '" + q.key +
                          "' was answered; no config was written");
      const std::string text = trimmed(*answer);
      Parsed parsed;
      if (text.empty())
        parsed = {q.default_value, ""};
      else if (!q.options.empty())
        parsed = interpret_choice(q, text);
      else
        parsed = parse_value(q.key, text);
      if (!parsed.value) {
        prompter_.say("  " + parsed.problem + "; please answer again.");
        continue;
      }
      answers_[q.key] = {*parsed.value, Source::command_line, "answer"};
      if (auto problem = consistency_problem(current(), q.key)) {
        answers_.erase(q.key);
        prompter_.say("  " + *problem + "; please answer again.");
        continue;
      }
      return;
    }
  }

  Prompter& prompter_;
  Hardware hw_;
  detail::Layer answers_;
};

}  // namespace

std::unique_ptr<Prompter> make_line_prompter(std::istream& in, std::ostream& out) {
  return std::make_unique<LinePrompter>(in, out);
}

std::unique_ptr<Prompter> make_terminal_prompter(int in_fd, int out_fd) {
  return std::make_unique<TerminalPrompter>(in_fd, out_fd);
}

Config run_wizard(Prompter& prompter, const Hardware& hw) { return Wizard(prompter, hw).run(); }

}  // namespace accel::config
