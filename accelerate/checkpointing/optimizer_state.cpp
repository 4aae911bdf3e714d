#include "accelerate/checkpointing/optimizer_state.hpp"

#include <cstring>
#include <map>

#include "accelerate/checkpointing/checkpoint_manifest.hpp"
#include "foundation/error.hpp"

namespace accel {
namespace {

struct Reader {
  const std::string& bytes;
  std::size_t at = 0;
  const std::string& where;
  std::uint64_t u64() {
    if (at + 8 > bytes.size()) throw CheckpointError(where + ": optimizer state truncated");
    std::uint64_t v = 0;
    std::memcpy(&v, bytes.data() + at, 8);
    at += 8;
    return v;
  }
};

void put_u64(std::string& out, std::uint64_t v) {
  out.append(reinterpret_cast<const char*>(&v), 8);
}

struct SegmentMapEntry {
  std::uint64_t group, offset, count;
};

std::vector<SegmentMapEntry> read_map(Reader& r) {
  std::vector<SegmentMapEntry> map(r.u64());
  for (auto& e : map) e = {r.u64(), r.u64(), r.u64()};
  return map;
}

}  // namespace

SavedOptimizerState read_optimizer_bytes(std::string_view bytes, const std::string& where) {
  try {
    return parse_optimizer_state(bytes, where + ": optimizer state");
  } catch (const InvalidArgument& e) {
    throw CheckpointError(e.what());
  }
}

std::string pack_optimizer_state(const std::string& optimizer_bytes,
                                 const std::vector<ParamSegment>& segments) {
  std::string out;
  put_u64(out, segments.size());
  for (const ParamSegment& s : segments) {
    put_u64(out, s.group);
    put_u64(out, s.offset);
    put_u64(out, s.values.count);
  }
  return out + optimizer_bytes;
}

std::string optimizer_bytes(const std::string& blob, const std::string& where) {
  Reader r{blob, 0, where};
  read_map(r);
  return blob.substr(r.at);
}

bool same_segments(const std::string& blob, const std::vector<ParamSegment>& segments) {
  const std::string where = "optimizer";
  Reader r{blob, 0, where};
  const auto map = read_map(r);
  if (map.size() != segments.size()) return false;
  for (std::size_t k = 0; k < map.size(); ++k)
    if (map[k].group != segments[k].group || map[k].offset != segments[k].offset ||
        map[k].count != segments[k].values.count)
      return false;
  return true;
}

std::string reshard_optimizer_state(const std::vector<std::string>& blobs,
                                    const std::vector<ParamSegment>& segments,
                                    const std::string& where) {
  // group -> slot -> values in the group's coordinates (grown as segments arrive)
  std::map<std::uint64_t, std::vector<std::vector<float>>> full;
  std::uint64_t steps = 0;
  bool first = true, any_state = false;
  for (const std::string& blob : blobs) {
    Reader r{blob, 0, where};
    const auto map = read_map(r);
    const SavedOptimizerState saved =
        read_optimizer_bytes(std::string_view(blob).substr(r.at), where);
    if (!first && saved.step != steps)
      throw CheckpointError(where + ": the ranks' optimizer states are at different steps (" +
                            std::to_string(steps) + " and " + std::to_string(saved.step) + ")");
    first = false;
    steps = saved.step;
    if (saved.segments.empty()) continue;  // not stepped yet: no state
    if (saved.segments.size() != map.size())
      throw CheckpointError(where + ": optimizer state for " +
                            std::to_string(saved.segments.size()) + " segments, its map names " +
                            std::to_string(map.size()));
    any_state = true;
    for (std::size_t k = 0; k < map.size(); ++k) {
      const SegmentMapEntry& e = map[k];
      const SavedOptimizerState::Segment& in = saved.segments[k];
      if (in.count != e.count) throw CheckpointError(where + ": optimizer segment sizes disagree");
      auto& group = full[e.group];
      if (group.size() < in.slots) group.resize(in.slots);
      for (std::uint64_t s = 0; s < in.slots; ++s) {
        std::vector<float>& values = group[s];
        if (values.size() < e.offset + in.count) values.resize(e.offset + in.count, 0.0f);
        std::memcpy(values.data() + e.offset, in.data + s * in.count * sizeof(float),
                    in.count * sizeof(float));
      }
    }
  }
  // Optimizer::save_state's format for this rank's segments.
  std::string out;
  put_u64(out, steps);
  put_u64(out, any_state ? segments.size() : 0);
  if (!any_state) return out;
  for (const ParamSegment& seg : segments) {
    const auto it = full.find(seg.group);
    const std::size_t slots = it == full.end() ? 0 : it->second.size();
    put_u64(out, seg.values.count);
    put_u64(out, slots);
    for (std::size_t s = 0; s < slots; ++s) {
      const std::vector<float>& values = it->second[s];
      std::vector<float> piece(seg.values.count, 0.0f);  // zeros past the end: padding
      for (std::size_t i = 0; i < piece.size() && seg.offset + i < values.size(); ++i)
        piece[i] = values[seg.offset + i];
      out.append(reinterpret_cast<const char*>(piece.data()), piece.size() * sizeof(float));
    }
  }
  return out;
}

}  // namespace accel
