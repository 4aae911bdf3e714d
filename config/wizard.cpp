#include "config/wizard.hpp"

#include <algorithm>
#include <charconv>
#include <istream>
#include <ostream>

#include "backends/comm/error.hpp"
#include "config/layers.hpp"
#include "config/terminal.hpp"

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
    choose("compute_environment", "In which compute environment are you running?",
           {{"LOCAL_MACHINE", "This machine", 0}});
    choose("distributed_type", "Which type of distributed training do you want?",
           {{"NO", "NO             one process, one device", 0},
            {"DATA_PARALLEL",
             "DATA_PARALLEL  one process, a model replica on each GPU (or CPU thread)", 1},
            {"MULTI_CPU", "MULTI_CPU      one process per CPU share (DDP over gloo or mpi)", 2},
            {"MULTI_GPU", "MULTI_GPU      one process per GPU (DDP over NCCL)", 3},
            {"ZERO", "ZERO           one process per device, optimizer state sharded (ZeRO)", 4}});
    const bool multi_process = type() == DistributedType::MULTI_CPU ||
                               type() == DistributedType::MULTI_GPU ||
                               type() == DistributedType::ZERO;
    if (multi_process) {
      free_text("num_machines",
                "How many different machines will you use (more than 1 for multi-node training)?");
      if (current().num_machines > 1) {
        free_text("machine_rank", "What is the rank of this machine (0 .. " +
                                      std::to_string(current().num_machines - 1) + ")?");
        free_text("main_process_ip",
                  "What is the IP address of the machine that will host the main process?");
        free_text("main_process_port",
                  "What is the port you will use to communicate with the main process?");
      }
    }
    if (type() == DistributedType::NO || type() == DistributedType::ZERO ||
        type() == DistributedType::DATA_PARALLEL)
      choose("use_cpu",
             "Do you want to run your training on CPU only (even if a GPU is available)?",
             {{"false", "no", 0}, {"true", "yes", 1}});
    if (type() == DistributedType::DATA_PARALLEL && !uses_gpu(current()))
      free_text("data_parallel_replicas",
                "How many model replicas (threads) should DataParallel run (0 = one per CPU "
                "core)?");
    if (type() == DistributedType::ZERO) {
      choose("zero_stage", "What should be your ZeRO optimization stage?",
             {{"1", "stage 1: shard optimizer state", 1},
              {"2", "stage 2: shard optimizer state and gradients", 2},
              {"3", "stage 3: shard optimizer state, gradients and parameters", 3}});
      choose("offload_optimizer_device", "Where to offload optimizer states?",
             {{"none", "none", 0}, {"cpu", "cpu", 1}});
    }
    if (multi_process)
      free_text("num_processes",
                "How many processes should be used for distributed training (over all machines)?");
    if (uses_gpu(current()) && type() != DistributedType::NO)
      free_text("gpu_ids",
                "What GPU(s) (by id) should be used for training on this machine as a "
                "comma-separated list?");
    choose("mixed_precision", "Do you wish to use mixed precision?",
           {{"no", "no", 0}, {"fp16", "fp16", 1}, {"bf16", "bf16", 2}});
    if (multi_process && !uses_gpu(current()))
      choose("cpu_communicator", "Which communicator should the CPU processes use?",
             {{"auto", "auto  shared memory within a machine, Gloo between machines", 0},
              {"gloo", "gloo  TCP, started by accel launch", 1},
              {"mpi", "mpi   MPI, for clusters with a fast interconnect", 2}});
    free_text("gradient_accumulation_steps", "How many gradient accumulation steps?");
    return detail::build_config(answers_, hw_, true).config;
  }

 private:
  Config current() const { return detail::build_config(answers_, hw_, false).config; }

  void choose(const std::string& key, const std::string& text, std::vector<Option> options) {
    ask({key, text, std::move(options), get_value(current(), key)});
  }
  void free_text(const std::string& key, const std::string& text) {
    ask({key, text, {}, get_value(current(), key)});
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
