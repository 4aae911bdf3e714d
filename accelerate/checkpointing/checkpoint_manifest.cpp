#include "accelerate/checkpointing/checkpoint_manifest.hpp"

#include <zlib.h>

#include <algorithm>
#include <charconv>
#include <cstdio>

namespace accel {
namespace {

constexpr std::string_view kMagicLine = "accelerate-cpp checkpoint";

std::string hex32(std::uint32_t v) {
  char buf[9];
  std::snprintf(buf, sizeof buf, "%08x", v);
  return buf;
}

template <typename T>
bool parse_number(std::string_view text, T& out, int base = 10) {
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, out, base);
  return ec == std::errc() && ptr == end && !text.empty();
}

std::vector<std::string_view> split_words(std::string_view s) {
  std::vector<std::string_view> out;
  std::size_t i = 0;
  while (i < s.size()) {
    while (i < s.size() && s[i] == ' ') ++i;
    const std::size_t start = i;
    while (i < s.size() && s[i] != ' ') ++i;
    if (i > start) out.push_back(s.substr(start, i - start));
  }
  return out;
}

}  // namespace

std::uint32_t crc32(std::span<const char> bytes, std::uint32_t crc) {
  // zlib's (slicing tables, several GB/s): a large model's checkpoint is checksummed twice.
  return std::uint32_t(
      ::crc32_z(crc, reinterpret_cast<const Bytef*>(bytes.data()), z_size_t(bytes.size())));
}

void check_blob_name(std::string_view name) {
  bool ok = !name.empty() && name.size() <= 200 && name.front() != '.';
  for (char c : name)
    ok = ok && ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                c == '.' || c == '_' || c == '-');
  ACCEL_CHECK_ARG(ok, "checkpoint blob name '" + std::string(name) +
                          "' is not a plain file name (letters, digits, '.', '_', '-'; not "
                          "starting with '.')");
}

std::string format_manifest(const Manifest& m) {
  std::string out;
  out += kMagicLine;
  out += "\nformat_version: " + std::to_string(m.format_version);
  out += "\nworld_size: " + std::to_string(m.meta.world_size);
  out += "\nrank_files: " + std::to_string(m.meta.rank_files);
  out += "\nstep: " + std::to_string(m.meta.step);
  out += "\nepoch: " + std::to_string(m.meta.epoch);
  out += "\nbatch: " + std::to_string(m.meta.batch);
  out += "\nseed: " + std::to_string(m.meta.seed);
  if (m.meta.global_batch_size != 0)
    out += "\nglobal_batch_size: " + std::to_string(m.meta.global_batch_size);
  if (!m.node_ranks.empty()) {
    out += "\nnode_ranks: ";
    for (std::size_t i = 0; i < m.node_ranks.size(); ++i)
      out += (i ? "," : "") + std::to_string(m.node_ranks[i]);
    out += "\nsave_id: " + m.save_id;
  }
  out += "\n";
  for (const BlobEntry& b : m.blobs)
    out += "blob: " + b.name + " " + std::to_string(b.size) + " " + hex32(b.crc32) + "\n";
  out += "end: " + hex32(crc32(out)) + "\n";
  return out;
}

namespace {

// An error at `line` of the manifest `path` (0: the whole file).
CheckpointError manifest_error(const std::string& path, int line, const std::string& what) {
  return CheckpointError(path + (line > 0 ? ":" + std::to_string(line) : "") + ": " + what);
}

// The manifest without its end line, once that line is there and its checksum matches: without
// it nothing else can be trusted.
std::string_view verified_body(std::string_view text, const std::string& path) {
  auto fail = [&](int line, const std::string& what) { return manifest_error(path, line, what); };
  const std::size_t end_at = text.rfind("end: ");
  if (end_at == std::string_view::npos || (end_at > 0 && text[end_at - 1] != '\n'))
    throw fail(0,
               "truncated manifest (no 'end:' line; the save did not finish or the file was cut)");
  std::string_view end_value = text.substr(end_at + 5);
  if (!end_value.empty() && end_value.back() == '\n') end_value.remove_suffix(1);
  std::uint32_t expected = 0;
  if (!parse_number(end_value, expected, 16))
    throw fail(0, "truncated manifest (bad 'end:' line '" + std::string(end_value) + "')");
  const std::uint32_t actual = crc32(text.substr(0, end_at));
  if (actual != expected)
    throw fail(0, "manifest checksum mismatch (crc32 " + hex32(actual) + ", its end line says " +
                      hex32(expected) + "): the file was changed or damaged");
  return text.substr(0, end_at);
}

}  // namespace

// A little over 60 lines: one branch per key, each a line or two, sharing the line's error
// context.
Manifest parse_manifest(std::string_view text, const std::string& path) {
  auto fail = [&](int line, const std::string& what) { return manifest_error(path, line, what); };
  Manifest m;
  bool have_version = false, have_world = false;
  int line_no = 0;
  std::string_view body = verified_body(text, path);
  while (!body.empty()) {
    const std::size_t nl = body.find('\n');
    const std::string_view line = body.substr(0, nl);
    body = nl == std::string_view::npos ? std::string_view() : body.substr(nl + 1);
    ++line_no;
    if (line_no == 1) {
      if (line != kMagicLine) throw fail(1, "not an accelerate-cpp checkpoint manifest");
      continue;
    }
    if (line.empty()) continue;
    const std::size_t colon = line.find(": ");
    if (colon == std::string_view::npos) throw fail(line_no, "expected 'key: value'");
    const std::string key(line.substr(0, colon));
    const std::string_view value = line.substr(colon + 2);
    auto number = [&](auto& out) {
      if (!parse_number(value, out))
        throw fail(line_no, key + ": not a number: '" + std::string(value) + "'");
    };
    if (key == "format_version") {
      number(m.format_version);
      have_version = true;
      if (m.format_version != kCheckpointFormatVersion)
        throw fail(line_no, "format version " + std::to_string(m.format_version) +
                                " is not supported (this build reads version " +
                                std::to_string(kCheckpointFormatVersion) + ")");
    } else if (key == "world_size") {
      number(m.meta.world_size);
      have_world = m.meta.world_size >= 1;
    } else if (key == "rank_files") {
      number(m.meta.rank_files);
    } else if (key == "step") {
      number(m.meta.step);
    } else if (key == "epoch") {
      number(m.meta.epoch);
    } else if (key == "batch") {
      number(m.meta.batch);
    } else if (key == "seed") {
      number(m.meta.seed);
    } else if (key == "global_batch_size") {
      number(m.meta.global_batch_size);
    } else if (key == "node_ranks") {
      for (std::size_t at = 0; at <= value.size();) {
        const std::size_t comma = std::min(value.find(',', at), value.size());
        int r = -1;
        if (!parse_number(value.substr(at, comma - at), r) || r < 0)
          throw fail(line_no, "node_ranks: not a list of ranks: '" + std::string(value) + "'");
        m.node_ranks.push_back(r);
        at = comma + 1;
      }
    } else if (key == "save_id") {
      m.save_id = std::string(value);
    } else if (key == "blob") {
      const auto words = split_words(value);
      BlobEntry b;
      if (words.size() != 3 || !parse_number(words[1], b.size) ||
          !parse_number(words[2], b.crc32, 16))
        throw fail(line_no, "expected 'blob: NAME SIZE CRC32'");
      b.name = std::string(words[0]);
      try {
        check_blob_name(b.name);
      } catch (const InvalidArgument&) {
        throw fail(line_no, "bad blob name '" + b.name + "'");
      }
      m.blobs.push_back(std::move(b));
    } else {
      throw fail(line_no, "unknown key '" + key + "'");
    }
  }
  if (!have_version) throw fail(0, "no format_version");
  if (!have_world) throw fail(0, "no valid world_size");
  return m;
}

}  // namespace accel
