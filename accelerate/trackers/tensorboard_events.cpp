#include "accelerate/trackers/tensorboard_events.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <system_error>

#include "foundation/error.hpp"
#include "foundation/file_io.hpp"

namespace accel::tensorboard {
namespace {

constexpr std::uint32_t kMaskDelta = 0xa282ead8u;

std::array<std::uint32_t, 256> crc32c_table() {
  std::array<std::uint32_t, 256> table{};
  for (std::uint32_t i = 0; i < 256; ++i) {
    std::uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    table[i] = c;
  }
  return table;
}

// ---- the protobuf wire format, as much as Event needs

enum Wire : std::uint32_t { kVarint = 0, kFixed64 = 1, kLength = 2, kFixed32 = 5 };

void put_varint(std::string& out, std::uint64_t v) {
  for (; v >= 0x80; v >>= 7) out.push_back(char((v & 0x7f) | 0x80));
  out.push_back(char(v));
}
void put_key(std::string& out, std::uint32_t field, Wire wire) {
  put_varint(out, (std::uint64_t(field) << 3) | wire);
}
template <typename T>
void put_fixed(std::string& out, T value) {  // little-endian, as x86-64 stores it
  char bytes[sizeof(T)];
  std::memcpy(bytes, &value, sizeof(T));
  out.append(bytes, sizeof(T));
}
void put_bytes(std::string& out, std::uint32_t field, std::string_view bytes) {
  put_key(out, field, kLength);
  put_varint(out, bytes.size());
  out.append(bytes);
}

// Reads fields of one message; fails naming `what` when the bytes end early.
class Fields {
 public:
  Fields(std::string_view bytes, std::string what) : rest_(bytes), what_(std::move(what)) {}
  bool next(std::uint32_t& field, std::uint32_t& wire) {
    if (rest_.empty()) return false;
    const std::uint64_t key = varint();
    field = std::uint32_t(key >> 3);
    wire = std::uint32_t(key & 7);
    return true;
  }
  std::uint64_t varint() {
    std::uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      need(1);
      const auto byte = std::uint8_t(rest_[0]);
      rest_.remove_prefix(1);
      v |= std::uint64_t(byte & 0x7f) << shift;
      if ((byte & 0x80) == 0) return v;
    }
    throw Error(what_ + ": a varint longer than 10 bytes");
  }
  template <typename T>
  T fixed() {
    need(sizeof(T));
    T value;
    std::memcpy(&value, rest_.data(), sizeof(T));
    rest_.remove_prefix(sizeof(T));
    return value;
  }
  std::string_view bytes() {
    const std::uint64_t n = varint();
    need(n);
    const std::string_view out = rest_.substr(0, n);
    rest_.remove_prefix(n);
    return out;
  }
  void skip(std::uint32_t wire) {
    if (wire == kVarint)
      varint();
    else if (wire == kFixed64)
      fixed<std::uint64_t>();
    else if (wire == kLength)
      bytes();
    else if (wire == kFixed32)
      fixed<std::uint32_t>();
    else
      throw Error(what_ + ": unknown wire type " + std::to_string(wire));
  }

 private:
  void need(std::uint64_t n) const {
    if (rest_.size() < n) throw Error(what_ + ": the message ends inside a field");
  }
  std::string_view rest_;
  std::string what_;
};

// The next length-delimited field numbered `want` of `fields` (others skipped), or false at
// the message's end.
bool next_message(Fields& fields, std::uint32_t want, std::string_view& bytes) {
  std::uint32_t field = 0, wire = 0;
  while (fields.next(field, wire)) {
    if (field == want && wire == kLength) {
      bytes = fields.bytes();
      return true;
    }
    fields.skip(wire);
  }
  return false;
}

// Summary.Value {tag = 1, simple_value = 2}: the scalars; other values are skipped.
// The first string_val of a TensorProto (field 8), or nothing.
std::string tensor_string(std::string_view tensor, const std::string& where) {
  Fields fields(tensor, where + ": TensorProto");
  std::string_view bytes;
  return next_message(fields, 8, bytes) ? std::string(bytes) : std::string();
}

struct PluginData {
  std::string name;          // plugin_name = 1
  std::string_view content;  // content = 2
};

// SummaryMetadata's plugin_data (field 1), or an empty one.
PluginData plugin_data(std::string_view metadata, const std::string& where) {
  Fields fields(metadata, where + ": SummaryMetadata");
  PluginData out;
  std::uint32_t field = 0, wire = 0;
  for (std::string_view bytes; next_message(fields, 1, bytes);) {
    Fields plugin(bytes, where + ": PluginData");
    while (plugin.next(field, wire)) {
      if (field == 1 && wire == kLength)
        out.name = std::string(plugin.bytes());
      else if (field == 2 && wire == kLength)
        out.content = plugin.bytes();
      else
        plugin.skip(wire);
    }
  }
  return out;
}

// google.protobuf.Value {number_value = 2, string_value = 3, bool_value = 4} as text.
std::string value_text(std::string_view value, const std::string& where) {
  Fields fields(value, where + ": google.protobuf.Value");
  std::string out;
  std::uint32_t field = 0, wire = 0;
  while (fields.next(field, wire)) {
    if (field == 2 && wire == kFixed64) {
      char text[32];
      const double v = fields.fixed<double>();
      out.assign(text, std::to_chars(text, text + sizeof text, v).ptr);
    } else if (field == 3 && wire == kLength) {
      out = std::string(fields.bytes());
    } else if (field == 4 && wire == kVarint) {
      out = fields.varint() ? "true" : "false";
    } else {
      fields.skip(wire);
    }
  }
  return out;
}

// HParamsPluginData's session_start_info (3) hparams and session_end_info (4) status.
void read_hparams(std::string_view content, const std::string& where, EventFileContents& out) {
  Fields fields(content, where + ": HParamsPluginData");
  std::uint32_t field = 0, wire = 0;
  while (fields.next(field, wire)) {
    if ((field != 3 && field != 4) || wire != kLength) {
      fields.skip(wire);
      continue;
    }
    const bool start = field == 3;
    Fields info(fields.bytes(), where + (start ? ": SessionStartInfo" : ": SessionEndInfo"));
    while (info.next(field, wire)) {
      if (start && field == 1 && wire == kLength) {
        Fields entry(info.bytes(), where + ": hparams entry");
        std::string key, text;
        while (entry.next(field, wire)) {
          if (field == 1 && wire == kLength)
            key = std::string(entry.bytes());
          else if (field == 2 && wire == kLength)
            text = value_text(entry.bytes(), where);
          else
            entry.skip(wire);
        }
        out.hparams.emplace_back(std::move(key), std::move(text));
      } else if (!start && field == 1 && wire == kVarint) {
        out.session_end_status = int(info.varint());
      } else {
        info.skip(wire);
      }
    }
  }
}

void read_summary(std::string_view summary, double wall_time, std::int64_t step,
                  const std::string& where, EventFileContents& out) {
  Fields fields(summary, where + ": Summary");
  std::uint32_t field = 0, wire = 0;
  for (std::string_view bytes; next_message(fields, 1, bytes);) {
    Fields value(bytes, where + ": Summary.Value");
    ScalarRecord record{wall_time, step, {}, 0};
    bool scalar = false;
    PluginData plugin;
    std::string text;
    while (value.next(field, wire)) {
      if (field == 1 && wire == kLength) {
        record.tag = std::string(value.bytes());
      } else if (field == 2 && wire == kFixed32) {
        record.value = value.fixed<float>();
        scalar = true;
      } else if (field == 9 && wire == kLength) {
        plugin = plugin_data(value.bytes(), where);
      } else if (field == 8 && wire == kLength) {
        text = tensor_string(value.bytes(), where);
      } else {
        value.skip(wire);
      }
    }
    if (scalar) out.scalars.push_back(std::move(record));
    if (plugin.name == "text")
      out.texts.push_back({wall_time, step, std::move(record.tag), std::move(text)});
    if (plugin.name == "hparams") read_hparams(plugin.content, where, out);
  }
}

std::string host_name() {
  char name[256] = {};
  if (::gethostname(name, sizeof name - 1) != 0) return "localhost";
  return name;
}

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

std::uint32_t crc32c(std::string_view bytes) {
  static const std::array<std::uint32_t, 256> table = crc32c_table();
  std::uint32_t c = 0xFFFFFFFFu;
  for (const char b : bytes) c = table[(c ^ std::uint8_t(b)) & 0xff] ^ (c >> 8);
  return c ^ 0xFFFFFFFFu;
}

std::uint32_t masked_crc32c(std::string_view bytes) {
  const std::uint32_t c = crc32c(bytes);
  return ((c >> 15) | (c << 17)) + kMaskDelta;
}

std::string frame_record(std::string_view event) {
  std::string out;
  put_fixed(out, std::uint64_t(event.size()));
  put_fixed(out, masked_crc32c(out));
  out.append(event);
  put_fixed(out, masked_crc32c(event));
  return out;
}

std::string version_event(double wall_time) {
  std::string out;
  put_key(out, 1, kFixed64);
  put_fixed(out, wall_time);
  put_bytes(out, 3, "brain.Event:2");
  return out;
}

namespace {
// An Event {wall_time = 1, step = 2, summary = 5 {value = 1 {value}}} around one Summary.Value.
std::string summary_event(double wall_time, std::int64_t step, std::string_view value) {
  std::string summary;
  put_bytes(summary, 1, value);
  std::string out;
  put_key(out, 1, kFixed64);
  put_fixed(out, wall_time);
  put_key(out, 2, kVarint);
  put_varint(out, std::uint64_t(step));
  put_bytes(out, 5, summary);
  return out;
}
}  // namespace

std::string scalar_event(double wall_time, std::int64_t step, std::string_view tag, float value) {
  std::string v;
  put_bytes(v, 1, tag);
  put_key(v, 2, kFixed32);
  put_fixed(v, value);
  return summary_event(wall_time, step, v);
}

std::string text_event(double wall_time, std::int64_t step, std::string_view tag,
                       std::string_view text) {
  // Summary.Value {tag = 1, metadata = 9 {plugin_data = 1 {plugin_name = 1 "text"}},
  // tensor = 8 {dtype = 1 DT_STRING (7), tensor_shape = 2 {} (a scalar), string_val = 8}}
  std::string plugin_data, metadata, tensor, shape, v;
  put_bytes(plugin_data, 1, "text");
  put_bytes(metadata, 1, plugin_data);
  put_key(tensor, 1, kVarint);
  put_varint(tensor, 7);
  put_bytes(tensor, 2, shape);
  put_bytes(tensor, 8, text);
  put_bytes(v, 1, tag);
  put_bytes(v, 9, metadata);
  put_bytes(v, 8, tensor);
  return summary_event(wall_time, step, v);
}

namespace {
// A Summary.Value {tag = 1, metadata = 9 {plugin_data = 1 {plugin_name "hparams", content = 2
// HParamsPluginData {version = 1: 0, field = info}}}}.
std::string hparams_event(double wall_time, std::string_view tag, std::uint32_t field,
                          std::string_view info) {
  std::string content, plugin_data, metadata, v;
  put_key(content, 1, kVarint);
  put_varint(content, 0);  // PLUGIN_DATA_VERSION
  put_bytes(content, field, info);
  put_bytes(plugin_data, 1, "hparams");
  put_bytes(plugin_data, 2, content);
  put_bytes(metadata, 1, plugin_data);
  put_bytes(v, 1, tag);
  put_bytes(v, 9, metadata);
  return summary_event(wall_time, 0, v);
}

bool finite_number(const std::string& text, double& v) {
  const char* end = text.data() + text.size();
  const auto result = std::from_chars(text.data(), end, v);
  return !text.empty() && result.ec == std::errc() && result.ptr == end && std::isfinite(v);
}
}  // namespace

std::string hparams_start_event(double wall_time, const HParams& hparams) {
  std::string info;
  for (const auto& [name, text] : hparams) {
    std::string value, entry;
    double number = 0;
    if (finite_number(text, number)) {
      put_key(value, 2, kFixed64);
      put_fixed(value, number);
    } else if (text == "true" || text == "false") {
      put_key(value, 4, kVarint);
      put_varint(value, text == "true");
    } else {
      put_bytes(value, 3, text);
    }
    put_bytes(entry, 1, name);
    put_bytes(entry, 2, value);
    put_bytes(info, 1, entry);
  }
  put_key(info, 5, kFixed64);
  put_fixed(info, wall_time);
  return hparams_event(wall_time, "_hparams_/session_start_info", 3, info);
}

std::string hparams_end_event(double wall_time, SessionStatus status) {
  std::string info;
  put_key(info, 1, kVarint);
  put_varint(info, std::uint64_t(status));
  put_key(info, 2, kFixed64);
  put_fixed(info, wall_time);
  return hparams_event(wall_time, "_hparams_/session_end_info", 4, info);
}

EventFileWriter::EventFileWriter(const std::string& dir) {
  static std::atomic<int> count{0};
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) throw Error("TensorBoard: cannot create " + dir + ": " + ec.message());
  const double now = now_seconds();
  path_ = (std::filesystem::path(dir) /
           ("events.out.tfevents." + std::to_string(std::int64_t(now)) + "." + host_name() + "." +
            std::to_string(::getpid()) + "." + std::to_string(count++)))
              .string();
  fd_.reset(::open(path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_APPEND | O_CLOEXEC, 0644));
  if (!fd_) throw Error("TensorBoard: cannot create " + path_ + ": " + errno_text(errno));
  write_record(version_event(now));
}

EventFileWriter::~EventFileWriter() = default;

void EventFileWriter::add_scalar(std::string_view tag, float value, std::int64_t step) {
  write_record(scalar_event(now_seconds(), step, tag, value));
}

void EventFileWriter::add_text(std::string_view tag, std::string_view text, std::int64_t step) {
  write_record(text_event(now_seconds(), step, tag, text));
}

void EventFileWriter::add_hparams_start(const HParams& hparams) {
  write_record(hparams_start_event(now_seconds(), hparams));
}

void EventFileWriter::add_hparams_end(SessionStatus status) {
  write_record(hparams_end_event(now_seconds(), status));
}

void EventFileWriter::write_record(std::string_view event) {
  write_all(fd_.get(), frame_record(event), "TensorBoard: " + path_);
}

EventFileContents read_event_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error("TensorBoard: cannot read " + path);
  const std::string file((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EventFileContents out;
  std::size_t at = 0;
  while (at < file.size()) {
    const std::string where = path + " at byte " + std::to_string(at);
    if (file.size() - at < 12) {
      out.truncated_tail = true;
      break;
    }
    const std::string_view header(file.data() + at, 8);
    std::uint64_t length = 0;
    std::uint32_t header_crc = 0;
    std::memcpy(&length, header.data(), 8);
    std::memcpy(&header_crc, file.data() + at + 8, 4);
    if (header_crc != masked_crc32c(header))
      throw Error("TensorBoard: " + where + ": the record length's CRC-32C does not match");
    if (file.size() - at - 12 < length + 4) {
      out.truncated_tail = true;
      break;
    }
    const std::string_view event(file.data() + at + 12, length);
    std::uint32_t event_crc = 0;
    std::memcpy(&event_crc, file.data() + at + 12 + length, 4);
    if (event_crc != masked_crc32c(event))
      throw Error("TensorBoard: " + where + ": the event's CRC-32C does not match");
    Fields fields(event, "TensorBoard: " + where + ": Event");
    double wall_time = 0;
    std::int64_t step = 0;
    std::string_view summary;
    std::uint32_t field = 0, wire = 0;
    while (fields.next(field, wire)) {
      if (field == 1 && wire == kFixed64)
        wall_time = fields.fixed<double>();
      else if (field == 2 && wire == kVarint)
        step = std::int64_t(fields.varint());
      else if (field == 3 && wire == kLength)
        out.file_version = std::string(fields.bytes());
      else if (field == 5 && wire == kLength)
        summary = fields.bytes();
      else
        fields.skip(wire);
    }
    if (!summary.empty()) read_summary(summary, wall_time, step, "TensorBoard: " + where, out);
    at += 12 + length + 4;
  }
  return out;
}

}  // namespace accel::tensorboard
