#include "config/config_file.hpp"

#include <fcntl.h>
#include <pwd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <yaml-cpp/yaml.h>

#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <string_view>
#include <vector>

#include "config/detect.hpp"
#include "config/layers.hpp"
#include "foundation/error.hpp"
#include "foundation/file_io.hpp"
#include "foundation/unique_fd.hpp"

namespace accel::config {
namespace {

namespace fs = std::filesystem;

// Accelerate nests its DeepSpeed settings; these three mean the same as our top-level keys.
constexpr const char* kDeepspeedSection = "deepspeed_config";
constexpr const char* kFsdpSection = "fsdp_config";
bool is_deepspeed_mapped(const std::string& key) {
  return key == "zero_stage" || key == "offload_optimizer_device" ||
         key == "gradient_accumulation_steps";
}

// FSDP's sharding strategies as ZeRO stages (fsdp_sharding_strategy, by name or number).
std::optional<int> zero_stage_of_sharding(const std::string& value) {
  const std::string v = upper(value);
  if (v == "FULL_SHARD" || v == "1") return 3;
  if (v == "SHARD_GRAD_OP" || v == "2") return 2;
  if (v == "NO_SHARD" || v == "3") return 0;      // DDP
  if (v == "HYBRID_SHARD" || v == "4") return 3;  // within each machine (hybrid_shard)
  if (v == "_HYBRID_SHARD_ZERO2" || v == "5") return 2;
  return std::nullopt;
}

std::string kind_of(const YAML::Node& node) {
  if (node.IsSequence()) return "a list";
  if (node.IsMap()) return "a map";
  return "nothing";
}

// What a file is, for "it is a FIFO, not a regular file".
std::string file_kind(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO (named pipe)";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

// The whole file, refusing anything that is not a regular file of at most kMaxConfigFileBytes:
// a FIFO would block the reader forever and /dev/zero would fill memory. O_NONBLOCK makes
// opening a FIFO return at once, so fstat can refuse it; it changes nothing for a regular file.
std::string read_text(const std::string& path) {
  const UniqueFd file(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY));
  const int fd = file.get();
  if (fd < 0) throw ConfigError(path + ": cannot read config file: " + errno_text(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0)
    throw ConfigError(path + ": cannot read config file: " + errno_text(errno));
  if (!S_ISREG(st.st_mode))
    throw ConfigError(path + ": cannot read config file: it is " + file_kind(st.st_mode) +
                      ", not a regular file");
  const std::string too_big = path + ": cannot read config file: it is larger than " +
                              std::to_string(kMaxConfigFileBytes >> 20) +
                              " MiB, the most a config file may be";
  if (st.st_size > static_cast<off_t>(kMaxConfigFileBytes)) throw ConfigError(too_big);
  std::string text;
  char buffer[16384];
  for (;;) {  // to the end, not st_size: the file may grow while it is read
    const ssize_t n = ::read(fd, buffer, sizeof(buffer));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw ConfigError(path + ": cannot read config file: " + errno_text(errno));
    if (n == 0) break;
    text.append(buffer, static_cast<std::size_t>(n));
    if (text.size() > kMaxConfigFileBytes) throw ConfigError(too_big);
  }
  return text;
}

class FileReader {
 public:
  explicit FileReader(std::string path) : path_(std::move(path)) {}

  detail::FileSettings read() {
    const YAML::Node root = parse();
    if (root.IsNull() || !root.IsDefined()) return std::move(out_);  // an empty file: all defaults
    if (!root.IsMap())
      throw ConfigError(at(root) + ": expected a map of key: value, got " +
                        (root.IsScalar() ? "'" + root.Scalar() + "'" : kind_of(root)));
    for (auto it = root.begin(); it != root.end(); ++it) {
      const std::string key = key_name(it->first);
      if (key == kDeepspeedSection) {
        read_deepspeed(it->first, it->second);
      } else if (key == kFsdpSection) {
        read_fsdp(it->first, it->second);
      } else if (find_key(key) != nullptr) {
        add(key, key, it->first, it->second);
      } else if (auto note = ignored_key_note("", key)) {
        out_.notes.push_back(at(it->first) + ": key '" + key + "': " + *note);
      } else {
        throw ConfigError(at(it->first) + ": key '" + key + "': " + unknown_key_problem(key));
      }
    }
    apply_fsdp();
    return std::move(out_);
  }

 private:
  YAML::Node parse() {
    text_ = read_text(path_);
    std::vector<YAML::Node> documents;
    try {
      documents = YAML::LoadAll(text_);
    } catch (const YAML::ParserException& e) {
      throw ConfigError(path_ + ":" + std::to_string(e.mark.line + 1) + ": invalid YAML: " + e.msg);
    }
    // LoadAll, not Load: Load reads the first document and drops the rest without a word.
    if (documents.size() > 1)
      throw ConfigError(path_ + ":" + std::to_string(documents[1].Mark().line + 1) +
                        ": a second YAML document (after '---'); a config file holds one");
    return documents.empty() ? YAML::Node() : documents.front();
  }

  // yaml-cpp takes a quote that is never closed as running to the end of the file (PyYAML
  // refuses it): `main_process_ip: '10.0.0.1` would read as valid, the keys after it lost.
  void check_quote_closed(const YAML::Node& node, const std::string& what) const {
    if (!node.IsScalar() || node.Mark().pos < 0) return;
    const auto pos = static_cast<std::size_t>(node.Mark().pos);
    if (pos >= text_.size() || (text_[pos] != '\'' && text_[pos] != '"')) return;
    const char quote = text_[pos];
    for (std::size_t i = pos + 1; i < text_.size(); ++i) {
      if (quote == '"' && text_[i] == '\\') {
        ++i;  // an escaped character, maybe a quote
      } else if (text_[i] == quote) {
        if (quote == '\'' && i + 1 < text_.size() && text_[i + 1] == '\'') {
          ++i;  // '' is a quote inside a single-quoted scalar
          continue;
        }
        return;
      }
    }
    throw ConfigError(at(node) + ": " + what + ": the quote (" + std::string(1, quote) +
                      ") opened here is never closed");
  }

  // `key: null` (or ~) is how Accelerate writes "not set"; `key:` with nothing after it is a
  // value forgotten, and taking the default for it would hide that.
  bool is_written_null(const YAML::Node& value) const {
    if (value.Mark().pos < 0) return false;
    const std::string_view rest = std::string_view(text_).substr(
        std::min(text_.size(), static_cast<std::size_t>(value.Mark().pos)));
    for (std::string_view word : {"null", "Null", "NULL", "~"}) {
      if (!rest.starts_with(word)) continue;
      const std::string_view after = rest.substr(word.size());
      if (after.empty() || after.front() == ' ' || after.front() == '\t' || after.front() == '\n' ||
          after.front() == '\r' || after.front() == '#' || after.front() == ',' ||
          after.front() == '}' || after.front() == ']')
        return true;
    }
    return false;
  }

  std::string at(const YAML::Node& node) const {
    return path_ + ":" + std::to_string(node.Mark().line + 1);
  }

  std::string key_name(const YAML::Node& key) const {
    if (!key.IsScalar())
      throw ConfigError(at(key) + ": keys must be plain names, got " + kind_of(key));
    check_quote_closed(key, "a key");
    return key.Scalar();
  }

  void read_deepspeed(const YAML::Node& key_node, const YAML::Node& section) {
    if (section.IsNull()) return;  // Accelerate writes `deepspeed_config: {}` or null when unused
    if (!section.IsMap())
      throw ConfigError(at(key_node) + ": key 'deepspeed_config': expected a map, got " +
                        (section.IsScalar() ? "'" + section.Scalar() + "'" : kind_of(section)));
    for (auto it = section.begin(); it != section.end(); ++it) {
      const std::string key = key_name(it->first);
      const std::string shown = std::string(kDeepspeedSection) + "." + key;
      if (is_deepspeed_mapped(key)) {
        add(key, shown, it->first, it->second);
      } else if (key == "stage3_param_persistence_threshold") {  // DeepSpeed's own name
        add("zero3_param_persistence_threshold", shown, it->first, it->second);
      } else if (key == "offload_param_device" && it->second.IsScalar() &&
                 it->second.Scalar() != "none") {
        throw ConfigError(at(it->first) + ": key '" + shown + "': offloading parameters ('" +
                          it->second.Scalar() +
                          "') is not available (offload_optimizer_device cpu offloads the "
                          "optimizer state); write none");
      } else if (auto note = ignored_key_note(kDeepspeedSection, key)) {
        out_.notes.push_back(at(it->first) + ": key '" + shown + "': " + *note);
      } else {
        throw ConfigError(at(it->first) + ": key '" + shown + "': unknown key");
      }
    }
  }

  // Accelerate's FSDP section, read key by key: each one maps to a key of ours, is noted as
  // meaningless here, or is refused naming the line (a feature not built); apply_fsdp() then
  // turns distributed_type FSDP and the sharding strategy into ZERO and its stage.
  void read_fsdp(const YAML::Node& key_node, const YAML::Node& section) {
    if (section.IsNull()) return;
    if (!section.IsMap())
      throw ConfigError(at(key_node) + ": key 'fsdp_config': expected a map, got " +
                        (section.IsScalar() ? "'" + section.Scalar() + "'" : kind_of(section)));
    for (auto it = section.begin(); it != section.end(); ++it) {
      const std::string key = key_name(it->first);
      const std::string shown = std::string(kFsdpSection) + "." + key;
      const std::string where = at(it->first) + ": key '" + shown + "': ";
      const std::string value = it->second.IsScalar() ? it->second.Scalar() : "";
      const auto refuse = [&](const std::string& why) { throw ConfigError(where + why); };
      // Older Accelerate writes the strategy's name under fsdp_reshard_after_forward too; a
      // number there is FSDP2's boolean (1: true), never a strategy's number.
      const bool named_strategy =
          !value.empty() && !std::isdigit(static_cast<unsigned char>(value[0]));
      if (key == "fsdp_sharding_strategy" ||
          (key == "fsdp_reshard_after_forward" && named_strategy &&
           (zero_stage_of_sharding(value) || upper(value).find("HYBRID") != std::string::npos))) {
        const std::string v = upper(value);
        // Sharded within each machine, replicated across machines.
        if (v.find("HYBRID") != std::string::npos || v == "4" || v == "5")
          add("hybrid_shard", shown, it->first, YAML::Node("true"));
        const auto stage = zero_stage_of_sharding(v);
        if (!stage)
          refuse("'" + v + "' is not one of FULL_SHARD, SHARD_GRAD_OP, NO_SHARD, HYBRID_SHARD");
        fsdp_stage_ = *stage;
        fsdp_stage_where_ = at(it->first);
      } else if (key == "fsdp_reshard_after_forward") {
        add("reshard_after_forward", shown, it->first, it->second);
      } else if (key == "fsdp_activation_checkpointing") {
        add("activation_checkpointing", shown, it->first, it->second);
      } else if (key == "fsdp_state_dict_type") {
        add("state_dict_type", shown, it->first, it->second);
      } else if (key == "fsdp_auto_wrap_policy") {
        if (upper(value) == "SIZE_BASED_WRAP")
          refuse(
              "SIZE_BASED_WRAP is not available: units are the children of the model's "
              "ModuleLists and Sequentials (TRANSFORMER_BASED_WRAP) or the whole model (NO_WRAP)");
        add("auto_wrap_policy", shown, it->first, it->second);
      } else if (key == "fsdp_offload_params") {
        const auto on = parse_value("reshard_after_forward", value);  // a boolean
        if (!on.value) refuse(on.problem);
        if (*on.value == "true")
          refuse(
              "offloading parameters is not available (offload_optimizer_device cpu offloads the "
              "optimizer state); write false");
      } else if (auto note = ignored_key_note(kFsdpSection, key)) {
        out_.notes.push_back(where + *note);
      } else {
        refuse("unknown key");
      }
    }
  }

  // distributed_type FSDP (read as ZERO) takes its stage from the sharding strategy
  // (FULL_SHARD, the default: 3); NO_SHARD is DDP, on the GPUs unless use_cpu.
  void apply_fsdp() {
    auto type = out_.settings.find("distributed_type");
    if (!fsdp_type_) {
      if (fsdp_stage_ && (type == out_.settings.end() || type->second.value != "ZERO"))
        out_.notes.push_back(fsdp_stage_where_ +
                             ": key 'fsdp_config.fsdp_sharding_strategy': distributed_type is "
                             "not FSDP; ignored");
      return;
    }
    const int stage = fsdp_stage_.value_or(3);
    const std::string where = fsdp_stage_ ? fsdp_stage_where_ : type->second.where;
    if (stage == 0) {
      const auto cpu = out_.settings.find("use_cpu");
      const bool on_cpu = cpu != out_.settings.end() && cpu->second.value == "true";
      type->second.value = on_cpu ? "MULTI_CPU" : "MULTI_GPU";
      return;
    }
    if (const auto given = out_.settings.find("zero_stage"); given != out_.settings.end()) {
      if (given->second.value != std::to_string(stage))
        throw ConfigError(given->second.where + ": key 'zero_stage': " + given->second.value +
                          " contradicts FSDP's sharding strategy (stage " + std::to_string(stage) +
                          ", " + where + ")");
      return;
    }
    out_.settings["zero_stage"] = {std::to_string(stage), Source::config_file, where};
  }

  // `key` is the schema key; `shown` is how the file spells it (deepspeed_config.zero_stage).
  void add(const std::string& key, const std::string& shown, const YAML::Node& key_node,
           const YAML::Node& value) {
    const std::string where = at(key_node);
    if (const auto first = lines_.find(key); first != lines_.end())
      throw ConfigError(where + ": key '" + shown + "': given twice (first on line " +
                        std::to_string(first->second) + ")");
    lines_[key] = key_node.Mark().line + 1;
    if (value.IsNull()) {
      if (is_written_null(value)) return;  // Accelerate writes `main_process_ip: null`
      throw ConfigError(where + ": key '" + shown +
                        "': no value given (write one, or null to keep the default)");
    }
    std::string text;
    if (value.IsScalar()) {
      check_quote_closed(value, "key '" + shown + "'");
      text = value.Scalar();
    } else if (value.IsSequence() && key == "gpu_ids") {
      // gpu_ids: [0, 1] means the same as gpu_ids: 0,1
      for (const auto& item : value) {
        if (!item.IsScalar())
          throw ConfigError(where + ": key '" + shown + "': expects GPU ids, got a nested " +
                            kind_of(item));
        check_quote_closed(item, "key '" + shown + "'");
        text += (text.empty() ? "" : ",") + item.Scalar();
      }
    } else {
      throw ConfigError(where + ": key '" + shown + "': expects a single value, got " +
                        kind_of(value));
    }
    auto parsed = parse_value(key, text);
    if (!parsed.value) throw ConfigError(where + ": key '" + shown + "': " + parsed.problem);
    if (key == "distributed_type") {
      std::string l;
      for (char c : text) l += char(std::tolower(static_cast<unsigned char>(c)));
      fsdp_type_ = l == "fsdp";
    }
    out_.settings[key] = {*parsed.value, Source::config_file, where};
  }

  std::string path_;
  std::string text_;  // the whole file, for what yaml-cpp's nodes do not tell (quotes, null)
  detail::FileSettings out_;
  std::map<std::string, int> lines_;
  bool fsdp_type_ = false;         // distributed_type: FSDP
  std::optional<int> fsdp_stage_;  // from fsdp_config (0: NO_SHARD)
  std::string fsdp_stage_where_;
};

// A string as a YAML scalar that YAML 1.1 readers (PyYAML, so Accelerate) read back as the
// same string: 'NO' and 'no' would otherwise be booleans, '0' a number.
std::string yaml_text(const std::string& s) {
  static const char* const kSpecial[] = {"y",     "n",  "yes", "no",   "true",
                                         "false", "on", "off", "null", "~"};
  std::string l;
  for (char c : s) l += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  bool quote = s.empty() || s.front() == '-';
  for (const char* w : kSpecial) quote = quote || l == w;
  bool numeric = !s.empty();
  int dots = 0;
  for (char c : s) {
    if (c == '.')
      ++dots;
    else if (!std::isdigit(static_cast<unsigned char>(c)))
      numeric = false;
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_' && c != '.' && c != ',' &&
        c != '/' && c != '-')
      quote = true;
  }
  if (numeric && dots <= 1) quote = true;
  if (!quote) return s;
  std::string out = "'";
  for (char c : s) out += (c == '\'') ? std::string("''") : std::string(1, c);
  return out + "'";
}

}  // namespace

namespace detail {
FileSettings read_config_file(const std::string& path) { return FileReader(path).read(); }
}  // namespace detail

std::string default_config_path() {
  if (const char* file = std::getenv("ACCEL_CONFIG_FILE"); file != nullptr && *file != '\0')
    return file;
  const std::string tail = "accelerate-cpp/default_config.yaml";
  // The XDG spec says a relative XDG_CONFIG_HOME is invalid and must be ignored.
  if (const char* xdg = std::getenv("XDG_CONFIG_HOME"); xdg != nullptr && xdg[0] == '/')
    return (fs::path(xdg) / tail).string();
  std::string home;
  if (const char* h = std::getenv("HOME"); h != nullptr && *h != '\0')
    home = h;
  else if (const passwd* pw = getpwuid(getuid()); pw != nullptr && pw->pw_dir != nullptr)
    home = pw->pw_dir;
  else
    home = ".";
  return (fs::path(home) / ".config" / tail).string();
}

ResolvedConfig load_config_file(const std::string& path) {
  auto read = detail::read_config_file(path);
  auto out = detail::build_config(read.settings, detect_hardware(), true);
  out.file = path;
  out.notes = std::move(read.notes);
  return out;
}

std::string to_yaml(const Config& c) {
  std::string out =
      "# accelerate-cpp configuration, written by `accel config`; Accelerate's key names.\n"
      "# `accel config show` lists every key, its value in effect and where it came from.\n";
  for (const auto& spec : schema()) {
    if (!is_written(c, spec.name)) continue;
    const std::string value = get_value(c, spec.name);
    const bool plain = spec.kind == ValueKind::integer || spec.kind == ValueKind::boolean;
    out += spec.name + ": " + (plain ? value : yaml_text(value)) + "\n";
  }
  return out;
}

void save_config(const std::string& path, const Config& config) {
  ResolvedConfig checked;
  checked.config = config;
  for (const auto& spec : schema()) {
    checked.sources[spec.name] = Source::default_value;
    checked.origins[spec.name] = "saving " + path;
  }
  detail::check_consistency(checked);
  write_file_atomically(path, to_yaml(config));
}

}  // namespace accel::config
