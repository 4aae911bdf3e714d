#pragma once
// TensorBoard's event files (what tf.summary writes and TensorBoard reads), written and read
// without protobuf. A file is a sequence of TFRecord records:
//   uint64 length (little-endian) | uint32 masked CRC-32C of those 8 bytes |
//   length bytes: one serialized tensorflow.Event | uint32 masked CRC-32C of them
// where masked(c) = ((c >> 15) | (c << 17)) + 0xa282ead8. The first Event holds file_version
// "brain.Event:2"; each scalar is an Event {wall_time = 1 (double), step = 2 (int64),
// summary = 5 { value = 1 { tag = 1 (string), simple_value = 2 (float) } } } (the field
// numbers of tensorflow/core/util/event.proto and framework/summary.proto); a text (the text
// plugin's, Markdown) is a Summary.Value with metadata = 9 naming plugin "text" and a scalar
// DT_STRING tensor = 8 (framework/tensor.proto) holding it. The run's hyperparameters (the
// hparams plugin, tensorboard/plugins/hparams/plugin_data.proto) are a Summary.Value tagged
// "_hparams_/session_start_info" with no value, whose metadata's plugin_data is {plugin_name
// "hparams", content = 2: HParamsPluginData {version = 1: 0, session_start_info = 3 {hparams
// = 1: map<string, google.protobuf.Value>, start_time_secs = 5}}}; the run's end is
// "_hparams_/session_end_info" {session_end_info = 4 {status = 1, end_time_secs = 2}}. The
// plugin infers the experiment (each hyperparameter's domain, the metrics from the run's
// scalars) from these, so no "_hparams_/experiment" is written.

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "foundation/unique_fd.hpp"

namespace accel::tensorboard {

// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78): crc32c("123456789") = 0xE3069283.
std::uint32_t crc32c(std::string_view bytes);
std::uint32_t masked_crc32c(std::string_view bytes);

// One record around `event` (a serialized Event), as the file holds it.
std::string frame_record(std::string_view event);
// The serialized Events this writer emits.
std::string version_event(double wall_time);
std::string scalar_event(double wall_time, std::int64_t step, std::string_view tag, float value);
std::string text_event(double wall_time, std::int64_t step, std::string_view tag,
                       std::string_view text);
// A value that reads wholly as a finite number becomes number_value, "true"/"false"
// bool_value, anything else string_value.
using HParams = std::vector<std::pair<std::string, std::string>>;  // name, value as text
std::string hparams_start_event(double wall_time, const HParams& hparams);
enum class SessionStatus { kUnknown = 0, kSuccess = 1, kFailure = 2, kRunning = 3 };
std::string hparams_end_event(double wall_time, SessionStatus status);

// Appends records to a new event file, each with one write() of the whole record: a writer
// killed at any moment leaves a file readable up to its last complete record, and each
// add_scalar is in the file (the kernel's page cache) when it returns.
class EventFileWriter {
 public:
  // Creates `dir` (and its parents) and events.out.tfevents.<seconds>.<host>.<pid>.<n> in it
  // (n counts this process's writers), then writes the version event. Throws Error naming the
  // path when it cannot.
  explicit EventFileWriter(const std::string& dir);
  ~EventFileWriter();
  EventFileWriter(const EventFileWriter&) = delete;
  EventFileWriter& operator=(const EventFileWriter&) = delete;

  void add_scalar(std::string_view tag, float value, std::int64_t step);
  void add_text(std::string_view tag, std::string_view text, std::int64_t step);
  void add_hparams_start(const HParams& hparams);
  void add_hparams_end(SessionStatus status);
  const std::string& path() const { return path_; }

 private:
  void write_record(std::string_view event);
  UniqueFd fd_;
  std::string path_;
};

struct ScalarRecord {
  double wall_time = 0;
  std::int64_t step = 0;
  std::string tag;
  float value = 0;
};

struct TextRecord {
  double wall_time = 0;
  std::int64_t step = 0;
  std::string tag, text;
};

struct EventFileContents {
  std::string file_version;           // the first event's
  std::vector<ScalarRecord> scalars;  // in file order
  std::vector<TextRecord> texts;      // the text plugin's, in file order
  // The hparams plugin's session start: each value as text (a number in its shortest exact
  // form, true/false, or the string), in file order; the end's status, or -1 without one.
  HParams hparams;
  int session_end_status = -1;
  bool truncated_tail = false;  // the last record was incomplete (a writer killed)
};

// Every record's length and both CRCs checked: a damaged record is an Error naming the file
// and its byte offset; an incomplete last record ends the read (truncated_tail).
EventFileContents read_event_file(const std::string& path);

}  // namespace accel::tensorboard
