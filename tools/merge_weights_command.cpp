// `accel merge-weights DIR OUT`: one full set of weights from a checkpoint of any strategy and
// world size, as a LibTorch archive that a plain LibTorch program loads with
// torch::load(model, OUT).
//
// - a checkpoint of the LibTorch adapter already holds the model as such an archive
//   (state.model): it is checked to open and copied;
// - a checkpoint of the raw API holds parameters.layout and the parameter blobs (one per rank
//   under ZeRO): the parameters are reassembled from the slices and written with their recorded
//   dtypes and shapes, nested the way torch::nn::Module::save nests child modules, so the
//   name "layers.0.weight" becomes tensor "weight" of archive "0" of archive "layers" (what
//   named_parameters() calls "layers.0.weight"). The raw API's buffers have no names and are
//   left out (a model with buffers would not load from OUT; the command says so).
//
// Every blob is checked against the MANIFEST's size and CRC-32 first; OUT is written to a
// temporary file beside it and renamed into place, so it is either complete or absent.

#include <cstdio>
#include <filesystem>
#include <map>
#include <string>

#include <unistd.h>

#include "accelerate/checkpointing/checkpoint.hpp"
#include "accelerate/checkpointing/parameter_layout.hpp"
#include "accelerate/progress_bar.hpp"
#include "foundation/error.hpp"
#include "foundation/file_io.hpp"
#include "tools/commands.hpp"

#include <fcntl.h>
#include <cstring>
#include <sstream>

#include <ATen/Functions.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

namespace accel::tools {
namespace {

constexpr const char* kUsage =
    "usage: accel merge-weights [--disable_progress_bar] DIR OUT\n"
    "  DIR  a checkpoint saved by save_state (DDP or ZeRO, any number of processes)\n"
    "  OUT  the LibTorch archive to write: torch::load(model, OUT) loads it\n"
    "A progress bar counts the parameter blobs read (also off with "
    "ACCEL_DISABLE_PROGRESS_BAR=1).\n";

at::ScalarType scalar_type(DType dtype) {
  switch (dtype) {
    case DType::f32:
      return at::kFloat;
    case DType::f64:
      return at::kDouble;
    case DType::f16:
      return at::kHalf;
    case DType::bf16:
      return at::kBFloat16;
    case DType::i32:
      return at::kInt;
    case DType::i64:
      return at::kLong;
  }
  return at::kFloat;
}

// The module tree the dotted names describe: tensors of this module, then child modules.
struct Node {
  std::map<std::string, at::Tensor> tensors;
  std::map<std::string, Node> children;
};

void add(Node& root, const std::string& name, at::Tensor tensor, const std::string& where) {
  Node* node = &root;
  std::size_t start = 0;
  for (std::size_t dot; (dot = name.find('.', start)) != std::string::npos; start = dot + 1) {
    const std::string part = name.substr(start, dot - start);
    if (part.empty())
      throw CheckpointError(where + ": parameter name '" + name + "' has an empty part");
    node = &node->children[part];
  }
  const std::string leaf = name.substr(start);
  if (leaf.empty() || !node->tensors.emplace(leaf, std::move(tensor)).second)
    throw CheckpointError(where + ": parameter name '" + name + "' is empty or appears twice");
}

// The node of module `name` (dotted), made with its parents when absent.
Node& module_node(Node& root, const std::string& name) {
  Node* node = &root;
  std::size_t start = 0;
  for (std::size_t dot = 0; dot != std::string::npos; start = dot + 1) {
    dot = name.find('.', start);
    node = &node->children[name.substr(start, dot == std::string::npos ? dot : dot - start)];
  }
  return *node;
}

void write(const Node& node, torch::serialize::OutputArchive& archive) {
  for (const auto& [key, tensor] : node.tensors) archive.write(key, tensor);
  for (const auto& [key, child] : node.children) {
    torch::serialize::OutputArchive nested(archive.compilation_unit());
    write(child, nested);
    archive.write(key, nested);
  }
}

// The archive bytes for a raw-API checkpoint; `progress` counts the parameter blobs read (one
// per rank under ZeRO: the long part for a big model).
std::string archive_from_parameters(const LoadedCheckpoint& ck, ProgressBarOptions progress) {
  const std::string layout_path = ck.dir + "/" + kParametersLayoutBlob;
  const ParameterLayout layout = parse_layout(ck.shared_blob(kParametersLayoutBlob), layout_path);
  std::size_t blobs = 0;
  for (const BlobEntry& b : ck.blobs)
    blobs +=
        b.name == kParametersBlob || b.name.rfind(std::string(kParametersBlob) + ".rank", 0) == 0;
  ProgressBar bar("accel merge-weights: parameter blobs", blobs, progress);
  const FullParameters values = reassemble_parameters(
      layout,
      [&](const std::string& blob) {
        std::string bytes = blob == kParametersBlob ? ck.shared_blob(blob) : read_blob(ck, blob);
        bar.update();
        return bytes;
      },
      ck.dir);
  bar.close();
  Node root;
  for (std::size_t i = 0; i < layout.params.size(); ++i) {
    const SavedParam& p = layout.params[i];
    at::Tensor t = at::empty(p.shape, at::TensorOptions().dtype(scalar_type(p.dtype)));
    std::memcpy(t.data_ptr(), values.params[i].data(), values.params[i].size());
    add(root, p.name, t, layout_path);
    // A tied weight under each of its names, as torch::nn::Module::save writes it.
    for (const SavedAlias& a : layout.aliases)
      if (a.param == i) add(root, a.name, t, layout_path);
  }
  // Submodules without tensors (a Dropout): torch::nn::Module::load reads an archive for each.
  for (const std::string& m : layout.modules) module_node(root, m);
  std::size_t unnamed = 0;
  for (std::size_t i = 0; i < layout.buffers.size(); ++i) {
    const SavedBuffer& b = layout.buffers[i];
    if (b.name.empty()) {
      ++unnamed;
      continue;
    }
    at::Tensor t = at::empty(b.shape, at::dtype(scalar_type(b.dtype)));
    std::memcpy(t.data_ptr(), values.buffers[i].data(), values.buffers[i].size());
    add(root, b.name, std::move(t), layout_path);
  }
  if (unnamed > 0)
    std::fprintf(stderr,
                 "accel merge-weights: %s: %zu buffer(s) left out (the raw API saves buffers "
                 "without names); a model with buffers will not load from the output\n",
                 layout_path.c_str(), unnamed);
  torch::serialize::OutputArchive archive;
  write(root, archive);
  std::ostringstream out;
  archive.save_to(out);
  return out.str();
}

}  // namespace

int run_merge_weights_command(int argc, char** argv) {
  if (argc == 1 && (std::string(argv[0]) == "-h" || std::string(argv[0]) == "--help")) {
    std::fputs(kUsage, stdout);
    return 0;
  }
  ProgressBarOptions progress;
  progress.enabled = !progress_bar_disabled_by_env();
  if (argc >= 1 && std::string(argv[0]) == "--disable_progress_bar") {
    progress.enabled = false;
    ++argv;
    --argc;
  }
  if (argc != 2)
    throw ConfigError(std::string("accel merge-weights: expected DIR and OUT\n") + kUsage);
  const std::string dir = argv[0], out = argv[1];
  // Verifies the MANIFEST and every shared blob; per-rank blobs are verified as they are read.
  const LoadedCheckpoint ck = read_checkpoint(dir, 0, 1);
  std::string bytes;
  const char* source = "";
  if (ck.shared.count("state.model")) {
    // The LibTorch adapter's model, already a module archive: check that it opens, copy it.
    bytes = ck.shared.at("state.model");
    try {
      torch::serialize::InputArchive archive;
      archive.load_from(bytes.data(), bytes.size());
    } catch (const std::exception& e) {
      throw CheckpointError(ck.dir + "/state.model: not a LibTorch archive: " + e.what());
    }
    source = "state.model";
  } else if (ck.shared.count(kParametersLayoutBlob)) {
    bytes = archive_from_parameters(ck, progress);
    source = kParametersLayoutBlob;
  } else {
    throw CheckpointError(ck.dir + ": holds no model weights (neither " + kParametersLayoutBlob +
                          " nor state.model)");
  }
  // OUT complete or absent; its directory must exist (nothing is created on a typo).
  write_file_atomically(out, bytes, {.create_directories = false});
  std::printf("accel merge-weights: %s (from %s, saved by %d process%s at step %llu) -> %s\n",
              ck.dir.c_str(), source, ck.meta.world_size, ck.meta.world_size == 1 ? "" : "es",
              static_cast<unsigned long long>(ck.meta.step), out.c_str());
  return 0;
}

}  // namespace accel::tools
