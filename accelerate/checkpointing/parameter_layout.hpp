#pragma once
// Where a checkpoint's parameter values are, and what they are: blob "parameters.layout", one
// description for every strategy and world size, so a checkpoint saved by ZeRO at 4 ranks
// loads into ZeRO at 2, into DDP, into one process, and into `accel merge-weights`.
//
// The values live in "flat" coordinates: the parameters of each (param group, dtype) laid end
// to end in parameter order (ZeRO's flat buffers without the padding, backends/zero/
// flat_layout.hpp; they do not depend on the world size). Blobs hold runs ("slices") of those
// flat buffers, in the order the layout lists them:
//   DDP / one process: "parameters" holds every flat buffer whole (rank 0 writes it);
//   ZeRO: "parameters.rankR" holds rank R's slice of each flat buffer (each rank writes its
//         own; padding is not saved), "parameters" only the buffers.
// The non-trainable buffers follow the slices in "parameters", in buffer order.
//
// Text, one record per line:
//   layout 2
//   strategy zero2                 the strategy that saved it (ddp, zero1, zero2, ...)
//   world_size 4
//   flat F GROUP DTYPE COUNT       flat buffer F: its param group, dtype, elements
//   param I DTYPE COUNT GROUP F OFFSET SHAPE NAME     e.g. shape [37,13]; [] for a scalar
//   buffer I DTYPE COUNT [SHAPE NAME]   shape and name where the front end knows them (LibTorch)
//   alias I NAME                   another name of parameter I (a tied weight, LibTorch)
//   module NAME                    a submodule (LibTorch: loading wants one even without tensors)
//   slice BLOB F OFFSET COUNT      the next COUNT elements of BLOB are F[OFFSET, OFFSET+COUNT)
// A layout without the "layout 2" line is the first format (lines "param I DTYPE COUNT NAME"
// and "buffer I DTYPE COUNT", values in "parameters" in that order); it still loads.

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "backends/backend.hpp"

namespace accel {

struct SavedFlat {
  std::size_t group = 0;
  DType dtype = DType::f32;
  std::size_t count = 0;
};

struct SavedParam {
  DType dtype = DType::f32;
  std::size_t count = 0;
  std::size_t group = 0;
  std::size_t flat = 0;    // index into ParameterLayout::flats
  std::size_t offset = 0;  // elements into that flat buffer
  std::vector<std::int64_t> shape;
  std::string name;
};

struct SavedBuffer {
  DType dtype = DType::f32;
  std::size_t count = 0;
  std::vector<std::int64_t> shape;  // with a name only
  std::string name;                 // "" under the raw API
};

struct SavedAlias {
  std::size_t param = 0;  // index into ParameterLayout::params
  std::string name;
};

// What only a front end with a module tree knows (LibTorch): its buffers' names and the other
// names of tied parameters, so accel merge-weights writes an archive the module loads.
struct NamedBuffer {
  std::string name;
  std::vector<std::int64_t> shape;
};
struct TensorNames {
  std::vector<NamedBuffer> buffers;  // empty, or one per buffer
  std::vector<SavedAlias> aliases;
  std::vector<std::string> modules;  // every submodule's dotted name
};

struct SavedSlice {
  std::string blob;
  std::size_t flat = 0, offset = 0, count = 0;
};

struct ParameterLayout {
  int version = 2;  // 1: the first format (no shapes, groups or slices recorded)
  std::string strategy = "ddp";
  int world_size = 1;
  std::vector<SavedFlat> flats;
  std::vector<SavedParam> params;
  std::vector<SavedBuffer> buffers;
  std::vector<SavedAlias> aliases;
  std::vector<std::string> modules;
  std::vector<SavedSlice> slices;
};

inline constexpr const char* kParametersBlob = "parameters";
inline constexpr const char* kParametersLayoutBlob = "parameters.layout";

// The layout a job with these parameters writes: sharded (ZeRO) splits every flat buffer into
// world_size slices (shard_of of the padded size, as FlatLayout), one blob per rank.
ParameterLayout describe_parameters(const std::vector<ParamRef>& params,
                                    const std::vector<Buffer>& buffers, std::string strategy,
                                    int world_size, bool sharded, const TensorNames& names = {});

std::string format_layout(const ParameterLayout& layout);
// Throws CheckpointError "WHERE: line N: ..." on a line that does not parse or does not fit.
ParameterLayout parse_layout(std::string_view text, const std::string& where);

// The shape a parameter is saved with ([count] when the ParamRef has none).
std::vector<std::int64_t> shape_of(const ParamRef& p);
std::string format_shape(const std::vector<std::int64_t>& shape);

// "" when this job's parameters and buffers are the checkpoint's (same names, dtypes, counts,
// shapes, in order), else the first difference in words, for the error message.
std::string layout_difference(const ParameterLayout& saved, const std::vector<ParamRef>& params,
                              const std::vector<Buffer>& buffers);

// The bytes of blob `blob` as views of the parameters' (and, for "parameters", the buffers')
// values: what save_state writes. `params` must be the ones the layout describes.
std::vector<std::span<const char>> blob_pieces(const ParameterLayout& layout,
                                               const std::string& blob,
                                               const std::vector<ParamRef>& params,
                                               const std::vector<Buffer>& buffers);

// Every blob the layout names, in first-mention order ("parameters" always among them).
std::vector<std::string> layout_blobs(const ParameterLayout& layout);

struct FullParameters {
  std::vector<std::string> params;   // each parameter's values (raw bytes), in layout order
  std::vector<std::string> buffers;  // each buffer's
};

// Reassembles every parameter from the slices; `read(blob)` returns a blob's bytes (verified).
// Throws CheckpointError naming `where` and the blob whose size does not match the layout, or
// a flat buffer the slices do not cover.
FullParameters reassemble_parameters(const ParameterLayout& layout,
                                     const std::function<std::string(const std::string&)>& read,
                                     const std::string& where);

// The values of the parameters `wanted` (indices into layout.params; out.params[k] is
// wanted[k]'s) and every buffer, reading only the blobs whose slices hold them (and
// "parameters"): a pipeline stage loads its layers without the others'. Each blob read is
// checked against the layout's size; CheckpointError naming `where` and the parameter the
// slices do not cover.
FullParameters read_parameters_of(const ParameterLayout& layout,
                                  const std::function<std::string(const std::string&)>& read,
                                  const std::vector<std::size_t>& wanted, const std::string& where);

}  // namespace accel
