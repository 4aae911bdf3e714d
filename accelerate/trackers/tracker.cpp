#include "accelerate/trackers/tracker.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <random>
#include <system_error>

#include <yaml-cpp/yaml.h>

#include "accelerate/trackers/tensorboard_events.hpp"
#include "foundation/error.hpp"
#include "foundation/file_io.hpp"
#include "foundation/unique_fd.hpp"

namespace accel {
namespace {

// A file that takes whole lines, each with one write(): in the file when append returns.
class LineFile {
 public:
  explicit LineFile(std::string path)
      : path_(std::move(path)),
        fd_(::open(path_.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644)) {
    if (!fd_) throw Error("tracker: cannot open " + path_ + ": " + errno_text(errno));
  }
  std::size_t size() const {
    std::error_code ec;
    const auto n = std::filesystem::file_size(path_, ec);
    return ec ? 0 : std::size_t(n);
  }
  void append(const std::string& text) { write_all(fd_.get(), text, "tracker: " + path_); }

 private:
  std::string path_;
  UniqueFd fd_;
};

// A value as the shortest text that reads back to the same double (NaN and infinities as
// JSON cannot hold them: null in JSONL, nan/inf in CSV).
std::string number_text(double v) {
  char text[32];
  for (int digits = 1; digits <= 17; ++digits) {
    std::snprintf(text, sizeof text, "%.*g", digits, v);
    if (std::strtod(text, nullptr) == v) break;
  }
  return text;
}

std::string csv_field(const std::string& s) {
  if (s.find_first_of(",\"\n") == std::string::npos) return s;
  std::string out = "\"";
  for (char c : s) out += c == '"' ? std::string("\"\"") : std::string(1, c);
  return out + "\"";
}

std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (const unsigned char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += char(c);
    } else if (c < 0x20) {
      char esc[8];
      std::snprintf(esc, sizeof esc, "\\u%04x", c);
      out += esc;
    } else {
      out += char(c);
    }
  }
  return out + "\"";
}

class CsvTracker final : public GeneralTracker {
 public:
  explicit CsvTracker(const std::string& dir) : dir_(dir), metrics_(dir + "/metrics.csv") {
    if (metrics_.size() == 0) metrics_.append("step,name,value\n");
  }
  std::string name() const override { return "csv"; }
  void store_init_configuration(const TrackerConfig& config) override {
    LineFile file(dir_ + "/config.csv");
    std::string text = file.size() == 0 ? "name,value\n" : "";
    for (const auto& [key, value] : config) text += csv_field(key) + "," + csv_field(value) + "\n";
    file.append(text);
  }
  void log(const TrackerValues& values, std::int64_t step) override {
    std::string text;
    for (const auto& [key, value] : values)
      text += std::to_string(step) + "," + csv_field(key) + "," + number_text(value) + "\n";
    metrics_.append(text);
  }

 private:
  std::string dir_;
  LineFile metrics_;
};

class JsonlTracker final : public GeneralTracker {
 public:
  explicit JsonlTracker(const std::string& dir) : dir_(dir), metrics_(dir + "/metrics.jsonl") {}
  std::string name() const override { return "jsonl"; }
  void store_init_configuration(const TrackerConfig& config) override {
    std::string text = "{";
    for (std::size_t i = 0; i < config.size(); ++i)
      text += (i ? ", " : "") + json_string(config[i].first) + ": " + json_string(config[i].second);
    LineFile(dir_ + "/config.json").append(text + "}\n");
  }
  void log(const TrackerValues& values, std::int64_t step) override {
    std::string text = "{\"step\": " + std::to_string(step);
    for (const auto& [key, value] : values)
      text += ", " + json_string(key) + ": " + (std::isfinite(value) ? number_text(value) : "null");
    metrics_.append(text + "}\n");
  }

 private:
  std::string dir_;
  LineFile metrics_;
};

class TensorBoardTracker final : public GeneralTracker {
 public:
  explicit TensorBoardTracker(const std::string& dir) : writer_(dir) {}
  std::string name() const override { return "tensorboard"; }
  // The configuration twice: the hparams plugin's session start (the HPARAMS tab, runs
  // compared by hyperparameter), and a Markdown table under the text tag "config" (the TEXT
  // tab). finish() writes the session's end.
  void store_init_configuration(const TrackerConfig& config) override {
    writer_.add_hparams_start(config);
    std::string table = "| name | value |\n|---|---|\n";
    for (const auto& [key, value] : config) table += "| " + key + " | " + value + " |\n";
    writer_.add_text("config", table, 0);
  }
  void finish() override { writer_.add_hparams_end(tensorboard::SessionStatus::kSuccess); }
  void log(const TrackerValues& values, std::int64_t step) override {
    for (const auto& [key, value] : values) writer_.add_scalar(key, float(value), step);
  }

 private:
  tensorboard::EventFileWriter writer_;
};

std::int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// A whole small file, replaced (MLflow's meta.yaml, params/<key>).
void write_small_file(const std::filesystem::path& path, const std::string& text) {
  std::error_code ec;
  std::filesystem::create_directories(path.parent_path(), ec);
  const UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (!fd) throw Error("tracker mlflow: cannot open " + path.string() + ": " + errno_text(errno));
  write_all(fd.get(), text, "tracker mlflow: " + path.string());
}

// The string at `key` of a meta.yaml, or "" when the file, the key or its parse is not there.
std::string yaml_field(const std::filesystem::path& path, const std::string& key) {
  try {
    const YAML::Node node = YAML::LoadFile(path.string())[key];
    return node && node.IsScalar() ? node.as<std::string>() : std::string();
  } catch (const YAML::Exception&) {
    return "";
  }
}

// One meta.yaml mapping as MLflow's FileStore reads it (yaml.safe_load): strings quoted, so a
// name such as "exp: 2" or a run name of digits stays the string it is; numbers as numbers.
class MetaYaml {
 public:
  MetaYaml() { out_ << YAML::BeginMap; }
  MetaYaml& text(const std::string& key, const std::string& value) {
    out_ << YAML::Key << key << YAML::Value << YAML::SingleQuoted << value;
    return *this;
  }
  MetaYaml& number(const std::string& key, std::int64_t value) {
    out_ << YAML::Key << key << YAML::Value << value;
    return *this;
  }
  MetaYaml& null(const std::string& key) {
    out_ << YAML::Key << key << YAML::Value << YAML::Null;
    return *this;
  }
  MetaYaml& empty_list(const std::string& key) {
    out_ << YAML::Key << key << YAML::Value << YAML::Flow << YAML::BeginSeq << YAML::EndSeq;
    return *this;
  }
  std::string str() {
    out_ << YAML::EndMap;
    return std::string(out_.c_str()) + "\n";
  }

 private:
  YAML::Emitter out_;
};

std::string random_hex(std::size_t digits) {
  std::random_device device;
  std::string out;
  while (out.size() < digits) {
    char part[9];
    std::snprintf(part, sizeof part, "%08x", unsigned(device()));
    out += part;
  }
  return out.substr(0, digits);
}

// MLflow's file store (what `mlflow ui --backend-store-uri DIR/mlruns` reads): the project is
// an experiment (mlruns/<id>/meta.yaml, reused by name), each tracker one run in it
// (mlruns/<id>/<run_id>/meta.yaml, status RUNNING until finish() makes it FINISHED), every
// configuration item a file params/<key>, every metric key a file metrics/<key> of
// "<timestamp ms> <value> <step>" lines.
class MlflowTracker final : public GeneralTracker {
 public:
  explicit MlflowTracker(const std::string& dir) {
    namespace fs = std::filesystem;
    const fs::path store = fs::absolute(fs::path(dir) / "mlruns");
    const std::string experiment = fs::path(dir).filename().string();
    // The experiment of this name if the store has one; else the next free id (0 is
    // MLflow's "Default", made with a new store).
    std::error_code ec;
    long next = 1;
    for (fs::directory_iterator it(store, ec), end; !ec && it != end; it.increment(ec)) {
      const std::string id = it->path().filename().string();
      if (id.empty() || id.find_first_not_of("0123456789") != std::string::npos) continue;
      if (yaml_field(it->path() / "meta.yaml", "name") == experiment) experiment_id_ = id;
      next = std::max(next, std::stol(id) + 1);
    }
    const std::int64_t now = now_ms();
    if (!fs::exists(store / "0" / "meta.yaml")) write_experiment(store, "0", "Default", now);
    if (experiment_id_.empty()) {
      experiment_id_ = std::to_string(next);
      write_experiment(store, experiment_id_, experiment, now);
    }
    run_id_ = random_hex(32);
    run_dir_ = store / experiment_id_ / run_id_;
    start_ms_ = now;
    write_meta(1, -1);  // RUNNING, no end time
    write_small_file(run_dir_ / "tags" / "mlflow.runName", run_id_.substr(0, 8));
    fs::create_directories(run_dir_ / "artifacts", ec);
  }
  std::string name() const override { return "mlflow"; }
  void store_init_configuration(const TrackerConfig& config) override {
    for (const auto& [key, value] : config) write_small_file(run_dir_ / "params" / key, value);
  }
  void log(const TrackerValues& values, std::int64_t step) override {
    const std::string stamp = std::to_string(now_ms());
    for (const auto& [key, value] : values) {
      auto& file = metrics_[key];
      if (!file) {
        std::error_code ec;
        std::filesystem::create_directories((run_dir_ / "metrics" / key).parent_path(), ec);
        file = std::make_unique<LineFile>((run_dir_ / "metrics" / key).string());
      }
      file->append(stamp + " " + number_text(value) + " " + std::to_string(step) + "\n");
    }
  }
  void finish() override { write_meta(3, now_ms()); }  // FINISHED

 private:
  static void write_experiment(const std::filesystem::path& store, const std::string& id,
                               const std::string& name, std::int64_t now) {
    write_small_file(store / id / "meta.yaml",
                     MetaYaml()
                         .text("artifact_location", "file://" + (store / id).string())
                         .number("creation_time", now)
                         .text("experiment_id", id)
                         .number("last_update_time", now)
                         .text("lifecycle_stage", "active")
                         .text("name", name)
                         .str());
  }
  void write_meta(int status, std::int64_t end_time) {
    const char* user = std::getenv("USER");
    MetaYaml meta;
    meta.text("artifact_uri", "file://" + (run_dir_ / "artifacts").string());
    if (end_time < 0)
      meta.null("end_time");
    else
      meta.number("end_time", end_time);
    meta.text("entry_point_name", "")
        .text("experiment_id", experiment_id_)
        .text("lifecycle_stage", "active")
        .text("run_id", run_id_)
        .text("run_name", run_id_.substr(0, 8))
        .text("run_uuid", run_id_)
        .text("source_name", "")
        .number("source_type", 4)
        .text("source_version", "")
        .number("start_time", start_ms_)
        .number("status", status)
        .empty_list("tags")
        .text("user_id", user ? user : "unknown");
    write_small_file(run_dir_ / "meta.yaml", meta.str());
  }
  std::string experiment_id_, run_id_;
  std::filesystem::path run_dir_;
  std::int64_t start_ms_ = 0;
  std::map<std::string, std::unique_ptr<LineFile>> metrics_;
};

}  // namespace

const std::vector<std::string>& builtin_trackers() {
  static const std::vector<std::string> names = {"tensorboard", "csv", "jsonl", "mlflow"};
  return names;
}

std::unique_ptr<GeneralTracker> make_tracker(const std::string& name, const std::string& run_dir) {
  std::error_code ec;
  std::filesystem::create_directories(run_dir, ec);
  if (ec) throw Error("tracker " + name + ": cannot create " + run_dir + ": " + ec.message());
  if (name == "tensorboard") return std::make_unique<TensorBoardTracker>(run_dir);
  if (name == "csv") return std::make_unique<CsvTracker>(run_dir);
  if (name == "jsonl") return std::make_unique<JsonlTracker>(run_dir);
  if (name == "mlflow") return std::make_unique<MlflowTracker>(run_dir);
  std::string known;
  for (const std::string& n : builtin_trackers()) known += (known.empty() ? "" : ", ") + n;
  throw InvalidArgument("log_with: unknown tracker '" + name + "' (known: " + known + ", all)");
}

}  // namespace accel
