#include "accelerate/checkpointing/parameter_layout.hpp"

#include <algorithm>
#include <cstring>
#include <map>
#include <set>
#include <sstream>

#include "accelerate/checkpointing/checkpoint_manifest.hpp"
#include "backends/flat_layout.hpp"

namespace accel {
namespace {

std::string rank_blob(int rank) {
  return std::string(kParametersBlob) + ".rank" + std::to_string(rank);
}

std::size_t shape_count(const std::vector<std::int64_t>& shape) {
  std::size_t n = 1;
  for (const std::int64_t d : shape) n *= std::size_t(d);
  return n;
}

// "[37,13]" -> {37, 13}; "[]" -> {}. False on anything else.
bool parse_shape(const std::string& text, std::vector<std::int64_t>& out) {
  if (text.size() < 2 || text.front() != '[' || text.back() != ']') return false;
  out.clear();
  std::string inner = text.substr(1, text.size() - 2);
  if (inner.empty()) return true;
  std::istringstream in(inner);
  std::string part;
  while (std::getline(in, part, ',')) {
    if (part.empty() || part.find_first_not_of("0123456789") != std::string::npos) return false;
    out.push_back(std::stoll(part));
  }
  return true;
}

// The identity of a tensor for comparisons and messages, in the first format's words.
std::string identity(std::size_t i, DType dtype, std::size_t count, const std::string& name,
                     const std::vector<std::int64_t>& shape) {
  std::string s = "param " + std::to_string(i) + " " + std::string(dtype_name(dtype)) + " " +
                  std::to_string(count) + " " + name;
  if (shape != std::vector<std::int64_t>{std::int64_t(count)}) s += " shape " + format_shape(shape);
  return s;
}

std::string buffer_identity(std::size_t i, DType dtype, std::size_t count) {
  return "buffer " + std::to_string(i) + " " + std::string(dtype_name(dtype)) + " " +
         std::to_string(count);
}

}  // namespace

std::vector<std::int64_t> shape_of(const ParamRef& p) {
  if (p.shape.empty()) return {std::int64_t(p.data.count)};
  return p.shape;
}

std::string format_shape(const std::vector<std::int64_t>& shape) {
  std::string s = "[";
  for (std::size_t d = 0; d < shape.size(); ++d) s += (d ? "," : "") + std::to_string(shape[d]);
  return s + "]";
}

ParameterLayout describe_parameters(const std::vector<ParamRef>& params,
                                    const std::vector<Buffer>& buffers, std::string strategy,
                                    int world_size, bool sharded, const TensorNames& names) {
  ParameterLayout out;
  out.strategy = std::move(strategy);
  out.world_size = world_size;
  const FlatLayout flat(params, sharded ? world_size : 1, 0);
  for (const FlatGroup& g : flat.groups()) out.flats.push_back({g.group, g.dtype, g.count});
  for (std::size_t i = 0; i < params.size(); ++i) {
    const ParamRef& p = params[i];
    ACCEL_CHECK_ARG(shape_count(shape_of(p)) == p.data.count,
                    "parameter '" + p.name + "': shape " + format_shape(shape_of(p)) +
                        " does not hold its " + std::to_string(p.data.count) + " elements");
    out.params.push_back({p.data.dtype, p.data.count, p.group, flat.flat_of(i), flat.offset_of(i),
                          shape_of(p), p.name});
  }
  for (std::size_t i = 0; i < buffers.size(); ++i) {
    SavedBuffer b{buffers[i].dtype, buffers[i].count, {}, {}};
    if (i < names.buffers.size()) {
      b.shape = names.buffers[i].shape;
      b.name = names.buffers[i].name;
      ACCEL_CHECK_ARG(shape_count(b.shape) == b.count,
                      "buffer '" + b.name + "': shape " + format_shape(b.shape) +
                          " does not hold its " + std::to_string(b.count) + " elements");
    }
    out.buffers.push_back(std::move(b));
  }
  out.aliases = names.aliases;
  out.modules = names.modules;
  if (!sharded) {
    for (std::size_t f = 0; f < out.flats.size(); ++f)
      if (out.flats[f].count > 0) out.slices.push_back({kParametersBlob, f, 0, out.flats[f].count});
    return out;
  }
  for (int r = 0; r < world_size; ++r)
    for (std::size_t f = 0; f < out.flats.size(); ++f) {
      const Shard own = flat.owned(f, r);  // of the padded buffer: the padding is not saved
      const std::size_t end = std::min(own.offset + own.count, out.flats[f].count);
      if (end > own.offset) out.slices.push_back({rank_blob(r), f, own.offset, end - own.offset});
    }
  return out;
}

std::string format_layout(const ParameterLayout& layout) {
  std::ostringstream out;
  out << "layout 2\nstrategy " << layout.strategy << "\nworld_size " << layout.world_size << "\n";
  for (std::size_t f = 0; f < layout.flats.size(); ++f) {
    const SavedFlat& g = layout.flats[f];
    out << "flat " << f << " " << g.group << " " << dtype_name(g.dtype) << " " << g.count << "\n";
  }
  for (std::size_t i = 0; i < layout.params.size(); ++i) {
    const SavedParam& p = layout.params[i];
    out << "param " << i << " " << dtype_name(p.dtype) << " " << p.count << " " << p.group << " "
        << p.flat << " " << p.offset << " " << format_shape(p.shape) << " " << p.name << "\n";
  }
  for (std::size_t i = 0; i < layout.buffers.size(); ++i) {
    const SavedBuffer& b = layout.buffers[i];
    out << "buffer " << i << " " << dtype_name(b.dtype) << " " << b.count
        << (b.name.empty() ? "" : " " + format_shape(b.shape) + " " + b.name) << "\n";
  }
  for (const SavedAlias& a : layout.aliases) out << "alias " << a.param << " " << a.name << "\n";
  for (const std::string& m : layout.modules) out << "module " << m << "\n";
  for (const SavedSlice& s : layout.slices)
    out << "slice " << s.blob << " " << s.flat << " " << s.offset << " " << s.count << "\n";
  return out.str();
}

// Over 60 lines on purpose: one branch per record kind, each a few lines, all sharing the
// line's error context (fail) and the format version (legacy) set by the first line; split per
// record, each helper would need both passed in.
ParameterLayout parse_layout(std::string_view text, const std::string& where) {
  ParameterLayout out;
  std::istringstream lines{std::string(text)};
  std::string line;
  int number = 0;
  bool legacy = true;
  auto fail = [&](const std::string& what) -> void {
    throw CheckpointError(where + ": line " + std::to_string(number) + " ('" + line +
                          "'): " + what);
  };
  // The rest of the line after the stream's position, without the separating space.
  auto rest = [](std::istringstream& in) {
    std::string s;
    std::getline(in, s);
    return s.empty() ? s : s.substr(1);
  };
  auto dtype_of = [&](const std::string& name) {
    try {
      return parse_dtype(name);
    } catch (const std::exception&) {
      fail("unknown dtype '" + name + "'");
    }
    return DType::f32;
  };
  while (std::getline(lines, line)) {
    ++number;
    if (line.empty()) continue;
    std::istringstream in(line);
    std::string kind, dtype;
    in >> kind;
    std::size_t index = 0;
    if (number == 1 && kind == "layout") {
      int version = 0;
      if (!(in >> version) || version != 2) fail("unknown layout version");
      legacy = false;
    } else if (!legacy && kind == "strategy") {
      if (!(in >> out.strategy)) fail("no strategy name");
    } else if (!legacy && kind == "world_size") {
      if (!(in >> out.world_size) || out.world_size < 1) fail("not a world size");
    } else if (!legacy && kind == "flat") {
      SavedFlat g;
      if (!(in >> index >> g.group >> dtype >> g.count) || index != out.flats.size())
        fail("expected 'flat F GROUP DTYPE COUNT', flats in order");
      g.dtype = dtype_of(dtype);
      out.flats.push_back(g);
    } else if (kind == "param") {
      SavedParam p;
      std::string shape;
      const bool ok =
          legacy ? bool(in >> index >> dtype >> p.count)
                 : bool(in >> index >> dtype >> p.count >> p.group >> p.flat >> p.offset >> shape);
      if (!ok || index != out.params.size()) fail("expected a parameter record, in order");
      p.dtype = dtype_of(dtype);
      p.name = rest(in);
      if (legacy) {
        // The first format: every parameter whole in "parameters", in parameter order.
        p.flat = out.flats.size();
        p.shape = {std::int64_t(p.count)};
        out.flats.push_back({0, p.dtype, p.count});
        out.slices.push_back({kParametersBlob, p.flat, 0, p.count});
      } else {
        if (!parse_shape(shape, p.shape)) fail("shape '" + shape + "' is not like [37,13]");
        if (shape_count(p.shape) != p.count) fail("the shape does not hold the count");
        if (p.flat >= out.flats.size() || out.flats[p.flat].dtype != p.dtype ||
            p.offset + p.count > out.flats[p.flat].count)
          fail("not inside its flat buffer");
      }
      out.params.push_back(std::move(p));
    } else if (kind == "buffer") {
      SavedBuffer b;
      if (!(in >> index >> dtype >> b.count) || index != out.buffers.size())
        fail("expected 'buffer I DTYPE COUNT', in order");
      b.dtype = dtype_of(dtype);
      std::string shape;
      if (in >> shape) {
        if (!parse_shape(shape, b.shape) || shape_count(b.shape) != b.count)
          fail("expected 'buffer I DTYPE COUNT SHAPE NAME', the shape holding the count");
        b.name = rest(in);
        if (b.name.empty()) fail("a buffer shape without a name");
      }
      out.buffers.push_back(b);
    } else if (!legacy && kind == "alias") {
      SavedAlias a;
      if (!(in >> a.param) || a.param >= out.params.size())
        fail("expected 'alias I NAME' after parameter I");
      a.name = rest(in);
      if (a.name.empty()) fail("an alias without a name");
      out.aliases.push_back(std::move(a));
    } else if (!legacy && kind == "module") {
      std::string name = rest(in);
      if (name.empty()) fail("a module without a name");
      out.modules.push_back(std::move(name));
    } else if (!legacy && kind == "slice") {
      SavedSlice s;
      if (!(in >> s.blob >> s.flat >> s.offset >> s.count))
        fail("expected 'slice BLOB F OFFSET COUNT'");
      if (s.blob != kParametersBlob && s.blob.rfind(std::string(kParametersBlob) + ".rank", 0) != 0)
        fail("a slice in blob '" + s.blob + "', which is not a parameters blob");
      if (s.flat >= out.flats.size() || s.offset + s.count > out.flats[s.flat].count)
        fail("outside its flat buffer");
      out.slices.push_back(std::move(s));
    } else {
      fail("unknown record '" + kind + "'");
    }
  }
  if (legacy) out.version = 1;
  return out;
}

std::string layout_difference(const ParameterLayout& saved, const std::vector<ParamRef>& params,
                              const std::vector<Buffer>& buffers) {
  std::vector<std::string> a, b;
  for (std::size_t i = 0; i < saved.params.size(); ++i) {
    const SavedParam& p = saved.params[i];
    a.push_back(identity(i, p.dtype, p.count, p.name, p.shape));
  }
  // The first format recorded no shapes: compare counts only.
  const bool shapes = saved.version >= 2;
  for (std::size_t i = 0; i < saved.buffers.size(); ++i)
    a.push_back(buffer_identity(i, saved.buffers[i].dtype, saved.buffers[i].count));
  for (std::size_t i = 0; i < params.size(); ++i)
    b.push_back(identity(i, params[i].data.dtype, params[i].data.count, params[i].name,
                         shapes ? shape_of(params[i])
                                : std::vector<std::int64_t>{std::int64_t(params[i].data.count)}));
  for (std::size_t i = 0; i < buffers.size(); ++i)
    b.push_back(buffer_identity(i, buffers[i].dtype, buffers[i].count));
  for (std::size_t k = 0; k < std::max(a.size(), b.size()); ++k) {
    if (k >= a.size()) return "this job has '" + b[k] + "', the checkpoint has nothing more";
    if (k >= b.size()) return "the checkpoint has '" + a[k] + "', this job has nothing more";
    if (a[k] != b[k]) return "the checkpoint has '" + a[k] + "', this job has '" + b[k] + "'";
  }
  return "";
}

std::vector<std::string> layout_blobs(const ParameterLayout& layout) {
  std::vector<std::string> out = {kParametersBlob};
  for (const SavedSlice& s : layout.slices)
    if (std::find(out.begin(), out.end(), s.blob) == out.end()) out.push_back(s.blob);
  return out;
}

std::vector<std::span<const char>> blob_pieces(const ParameterLayout& layout,
                                               const std::string& blob,
                                               const std::vector<ParamRef>& params,
                                               const std::vector<Buffer>& buffers) {
  // Each flat buffer's parameters by offset, to cut a slice into views of their values.
  std::vector<std::vector<std::size_t>> members(layout.flats.size());
  for (std::size_t i = 0; i < layout.params.size(); ++i)
    members[layout.params[i].flat].push_back(i);
  std::vector<std::span<const char>> out;
  for (const SavedSlice& s : layout.slices) {
    if (s.blob != blob) continue;
    const std::size_t size = element_size(layout.flats[s.flat].dtype);
    for (const std::size_t i : members[s.flat]) {
      const SavedParam& p = layout.params[i];
      const std::size_t lo = std::max(s.offset, p.offset);
      const std::size_t hi = std::min(s.offset + s.count, p.offset + p.count);
      if (hi <= lo) continue;
      const char* data = static_cast<const char*>(params[i].data.data);
      out.emplace_back(data + (lo - p.offset) * size, (hi - lo) * size);
    }
  }
  if (blob == kParametersBlob)
    for (const Buffer& b : buffers) out.emplace_back(static_cast<const char*>(b.data), b.bytes());
  return out;
}

namespace {

// The bytes `blob` must hold by the layout: its slices, then (in "parameters") the buffers.
void check_blob_size(const ParameterLayout& layout, const std::string& blob,
                     const std::string& bytes, const std::string& where) {
  std::size_t expected = 0;
  for (const SavedSlice& s : layout.slices)
    if (s.blob == blob) expected += s.count * element_size(layout.flats[s.flat].dtype);
  if (blob == kParametersBlob)
    for (const SavedBuffer& b : layout.buffers) expected += b.count * element_size(b.dtype);
  if (bytes.size() != expected)
    throw CheckpointError(where + "/" + blob + ": " + std::to_string(bytes.size()) + " bytes, " +
                          kParametersLayoutBlob + " describes " + std::to_string(expected));
}

}  // namespace

FullParameters reassemble_parameters(const ParameterLayout& layout,
                                     const std::function<std::string(const std::string&)>& read,
                                     const std::string& where) {
  std::vector<std::string> flats;
  std::vector<std::size_t> covered(layout.flats.size(), 0);
  for (const SavedFlat& g : layout.flats) flats.emplace_back(g.count * element_size(g.dtype), '\0');
  FullParameters out;
  for (const std::string& blob : layout_blobs(layout)) {
    const std::string bytes = read(blob);
    check_blob_size(layout, blob, bytes, where);
    std::size_t at = 0;
    for (const SavedSlice& s : layout.slices) {
      if (s.blob != blob) continue;
      const std::size_t size = element_size(layout.flats[s.flat].dtype);
      std::memcpy(flats[s.flat].data() + s.offset * size, bytes.data() + at, s.count * size);
      at += s.count * size;
      covered[s.flat] += s.count;
    }
    if (blob == kParametersBlob)
      for (const SavedBuffer& b : layout.buffers) {
        out.buffers.push_back(bytes.substr(at, b.count * element_size(b.dtype)));
        at += b.count * element_size(b.dtype);
      }
  }
  for (std::size_t f = 0; f < layout.flats.size(); ++f)
    if (covered[f] != layout.flats[f].count)
      throw CheckpointError(where + "/" + kParametersLayoutBlob + ": the slices cover " +
                            std::to_string(covered[f]) + " of the " +
                            std::to_string(layout.flats[f].count) + " elements of flat buffer " +
                            std::to_string(f));
  for (const SavedParam& p : layout.params) {
    const std::size_t size = element_size(p.dtype);
    out.params.push_back(flats[p.flat].substr(p.offset * size, p.count * size));
  }
  return out;
}

FullParameters read_parameters_of(const ParameterLayout& layout,
                                  const std::function<std::string(const std::string&)>& read,
                                  const std::vector<std::size_t>& wanted,
                                  const std::string& where) {
  FullParameters out;
  std::map<std::string, std::string> blobs;  // those read so far
  const auto bytes_of_blob = [&](const std::string& blob) -> const std::string& {
    auto it = blobs.find(blob);
    if (it != blobs.end()) return it->second;
    std::string bytes = read(blob);
    check_blob_size(layout, blob, bytes, where);
    return blobs.emplace(blob, std::move(bytes)).first->second;
  };
  // Where each slice starts in its blob.
  std::vector<std::size_t> starts;
  std::map<std::string, std::size_t> ends;
  for (const SavedSlice& s : layout.slices) {
    std::size_t& end = ends[s.blob];
    starts.push_back(end);
    end += s.count * element_size(layout.flats[s.flat].dtype);
  }
  for (const std::size_t i : wanted) {
    ACCEL_CHECK_ARG(i < layout.params.size(),
                    "read_parameters_of: no parameter " + std::to_string(i) + " in the layout");
    const SavedParam& p = layout.params[i];
    const std::size_t size = element_size(p.dtype);
    std::string values(p.count * size, '\0');
    std::size_t covered = 0;
    for (std::size_t k = 0; k < layout.slices.size(); ++k) {
      const SavedSlice& s = layout.slices[k];
      const std::size_t lo = std::max(s.offset, p.offset);
      const std::size_t hi = std::min(s.offset + s.count, p.offset + p.count);
      if (s.flat != p.flat || hi <= lo) continue;
      const std::string& bytes = bytes_of_blob(s.blob);
      std::memcpy(values.data() + (lo - p.offset) * size,
                  bytes.data() + starts[k] + (lo - s.offset) * size, (hi - lo) * size);
      covered += hi - lo;
    }
    if (covered != p.count)
      throw CheckpointError(where + "/" + kParametersLayoutBlob + ": the slices cover " +
                            std::to_string(covered) + " of the " + std::to_string(p.count) +
                            " elements of parameter '" + p.name + "'");
    out.params.push_back(std::move(values));
  }
  const std::string& whole = bytes_of_blob(kParametersBlob);
  std::size_t at = ends.count(kParametersBlob) ? ends[kParametersBlob] : 0;
  for (const SavedBuffer& b : layout.buffers) {
    out.buffers.push_back(whole.substr(at, b.count * element_size(b.dtype)));
    at += b.count * element_size(b.dtype);
  }
  return out;
}

}  // namespace accel
