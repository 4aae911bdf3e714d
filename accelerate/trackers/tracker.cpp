#include "accelerate/trackers/tracker.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <system_error>

#include "accelerate/trackers/tensorboard_events.hpp"
#include "core/error.hpp"
#include "core/file_io.hpp"

namespace accel {
namespace {

// A file that takes whole lines, each with one write(): in the file when append returns.
class LineFile {
 public:
  explicit LineFile(std::string path) : path_(std::move(path)) {
    fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd_ < 0) throw Error("tracker: cannot open " + path_ + ": " + errno_text(errno));
  }
  ~LineFile() { ::close(fd_); }
  LineFile(const LineFile&) = delete;
  LineFile& operator=(const LineFile&) = delete;
  std::size_t size() const {
    std::error_code ec;
    const auto n = std::filesystem::file_size(path_, ec);
    return ec ? 0 : std::size_t(n);
  }
  void append(const std::string& text) { write_all(fd_, text, "tracker: " + path_); }

 private:
  std::string path_;
  int fd_ = -1;
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
  // Hyperparameters (TensorBoard's hparams plugin) are not written yet: the CSV and JSONL
  // trackers keep them.
  void store_init_configuration(const TrackerConfig&) override {}
  void log(const TrackerValues& values, std::int64_t step) override {
    for (const auto& [key, value] : values) writer_.add_scalar(key, float(value), step);
  }

 private:
  tensorboard::EventFileWriter writer_;
};

}  // namespace

const std::vector<std::string>& builtin_trackers() {
  static const std::vector<std::string> names = {"tensorboard", "csv", "jsonl"};
  return names;
}

std::unique_ptr<GeneralTracker> make_tracker(const std::string& name, const std::string& run_dir) {
  std::error_code ec;
  std::filesystem::create_directories(run_dir, ec);
  if (ec) throw Error("tracker " + name + ": cannot create " + run_dir + ": " + ec.message());
  if (name == "tensorboard") return std::make_unique<TensorBoardTracker>(run_dir);
  if (name == "csv") return std::make_unique<CsvTracker>(run_dir);
  if (name == "jsonl") return std::make_unique<JsonlTracker>(run_dir);
  std::string known;
  for (const std::string& n : builtin_trackers()) known += (known.empty() ? "" : ", ") + n;
  throw InvalidArgument("log_with: unknown tracker '" + name + "' (known: " + known + ", all)");
}

}  // namespace accel
