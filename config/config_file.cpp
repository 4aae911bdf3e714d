#include "config/config_file.hpp"

#include <fcntl.h>
#include <pwd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <yaml-cpp/yaml.h>

#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "backends/comm/error.hpp"
#include "config/detect.hpp"
#include "config/layers.hpp"

namespace accel::config {
namespace {

namespace fs = std::filesystem;

// Accelerate nests its DeepSpeed settings; these three mean the same as our top-level keys.
constexpr const char* kDeepspeedSection = "deepspeed_config";
bool is_deepspeed_mapped(const std::string& key) {
  return key == "zero_stage" || key == "offload_optimizer_device" ||
         key == "gradient_accumulation_steps";
}

std::string kind_of(const YAML::Node& node) {
  if (node.IsSequence()) return "a list";
  if (node.IsMap()) return "a map";
  return "nothing";
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
      } else if (find_key(key) != nullptr) {
        add(key, key, it->first, it->second);
      } else if (auto note = ignored_key_note("", key)) {
        out_.notes.push_back(at(it->first) + ": key '" + key + "': " + *note);
      } else {
        throw ConfigError(at(it->first) + ": key '" + key + "': " + unknown_key_problem(key));
      }
    }
    return std::move(out_);
  }

 private:
  YAML::Node parse() {
    std::error_code ec;
    if (fs::is_directory(path_, ec))
      throw ConfigError(path_ + ": cannot read config file: it is a directory");
    std::ifstream in(path_);
    if (!in) throw ConfigError(path_ + ": cannot read config file: " + errno_text(errno));
    std::stringstream text;
    text << in.rdbuf();
    try {
      return YAML::Load(text.str());
    } catch (const YAML::ParserException& e) {
      throw ConfigError(path_ + ":" + std::to_string(e.mark.line + 1) + ": invalid YAML: " + e.msg);
    }
  }

  std::string at(const YAML::Node& node) const {
    return path_ + ":" + std::to_string(node.Mark().line + 1);
  }

  std::string key_name(const YAML::Node& key) const {
    if (!key.IsScalar())
      throw ConfigError(at(key) + ": keys must be plain names, got " + kind_of(key));
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
      } else if (auto note = ignored_key_note(kDeepspeedSection, key)) {
        out_.notes.push_back(at(it->first) + ": key '" + shown + "': " + *note);
      } else {
        throw ConfigError(at(it->first) + ": key '" + shown + "': unknown key");
      }
    }
  }

  // `key` is the schema key; `shown` is how the file spells it (deepspeed_config.zero_stage).
  void add(const std::string& key, const std::string& shown, const YAML::Node& key_node,
           const YAML::Node& value) {
    const std::string where = at(key_node);
    if (const auto first = lines_.find(key); first != lines_.end())
      throw ConfigError(where + ": key '" + shown + "': given twice (first on line " +
                        std::to_string(first->second) + ")");
    lines_[key] = key_node.Mark().line + 1;
    if (value.IsNull()) return;  // Accelerate writes `main_process_ip: null` for "not set"
    std::string text;
    if (value.IsScalar()) {
      text = value.Scalar();
    } else if (value.IsSequence() && key == "gpu_ids") {
      // gpu_ids: [0, 1] means the same as gpu_ids: 0,1
      for (const auto& item : value) {
        if (!item.IsScalar())
          throw ConfigError(where + ": key '" + shown + "': expects GPU ids, got a nested " +
                            kind_of(item));
        text += (text.empty() ? "" : ",") + item.Scalar();
      }
    } else {
      throw ConfigError(where + ": key '" + shown + "': expects a single value, got " +
                        kind_of(value));
    }
    auto parsed = parse_value(key, text);
    if (!parsed.value) throw ConfigError(where + ": key '" + shown + "': " + parsed.problem);
    out_.settings[key] = {*parsed.value, Source::config_file, where};
  }

  std::string path_;
  detail::FileSettings out_;
  std::map<std::string, int> lines_;
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

void write_all(int fd, std::string_view data, const std::string& tmp) {
  while (!data.empty()) {
    const ssize_t n = ::write(fd, data.data(), data.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      throw Error(tmp + ": cannot write: " + errno_text(errno));
    }
    data.remove_prefix(static_cast<std::size_t>(n));
  }
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

void write_file_atomically(const std::string& path, std::string_view content,
                           const std::function<void()>& before_rename) {
  const fs::path target(path);
  const fs::path dir = target.has_parent_path() ? target.parent_path() : fs::path(".");
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw Error(path + ": cannot create directory " + dir.string() + ": " + ec.message());

  // Same directory, so the rename stays on one filesystem and is atomic.
  std::string tmp = (dir / ("." + target.filename().string() + ".tmp.XXXXXX")).string();
  const int fd = ::mkstemp(tmp.data());
  if (fd < 0)
    throw Error(path + ": cannot create a temporary file in " + dir.string() + ": " +
                errno_text(errno));
  bool renamed = false;
  bool open = true;
  try {
    // mkstemp makes the file 0600; a config is not a secret, so keep the old file's mode or
    // give a new one 0644.
    struct stat st {};
    const mode_t mode = ::stat(path.c_str(), &st) == 0 ? (st.st_mode & 07777) : 0644;
    ::fchmod(fd, mode);
    write_all(fd, content, tmp);
    if (::fsync(fd) != 0) throw Error(tmp + ": cannot sync: " + errno_text(errno));
    open = false;
    if (::close(fd) != 0) throw Error(tmp + ": cannot close: " + errno_text(errno));
    if (before_rename) before_rename();
    if (::rename(tmp.c_str(), path.c_str()) != 0)
      throw Error(path + ": cannot replace with " + tmp + ": " + errno_text(errno));
    renamed = true;
  } catch (...) {
    if (open) ::close(fd);
    if (!renamed) ::unlink(tmp.c_str());
    throw;
  }
  // The rename is durable once the directory entry is; a failure here loses nothing already
  // visible, so it is not reported.
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

}  // namespace accel::config
