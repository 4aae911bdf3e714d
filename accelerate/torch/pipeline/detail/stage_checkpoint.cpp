#include "accelerate/torch/pipeline/detail/stage_checkpoint.hpp"

#include <algorithm>
#include <cstring>
#include <deque>
#include <map>
#include <sstream>
#include <unordered_map>

#include "accelerate/checkpointing/optimizer_state.hpp"
#include "accelerate/torch/checkpointing/torch_optimizer_state.hpp"
#include "accelerate/torch/checkpointing/torch_state.hpp"
#include "accelerate/torch/detail/tensor_buffer.hpp"
#include "backends/comm/host_collectives.hpp"
#include "foundation/error.hpp"

namespace accel::pipeline::detail {
namespace {

constexpr const char* kOptimizer = "optimizer";
constexpr const char* kOptimizerOptions = "state.optimizer";

std::string rank_blob(const std::string& name, int rank) {
  return name + ".rank" + std::to_string(rank);
}

std::span<const char> bytes_of(const std::string& s) { return {s.data(), s.size()}; }

std::span<const char> bytes_of(const at::Tensor& t) {
  return {static_cast<const char*>(t.data_ptr()), std::size_t(t.numel()) * t.element_size()};
}

// One line per tensor and submodule a piece holds, for the all-gather:
//   param PIECE GROUP DTYPE NDIM D... NAME
//   buffer PIECE DTYPE NDIM D... NAME
//   module PIECE NAME
void describe(std::ostringstream& out, const char* kind, int piece, const at::Tensor& t,
              const std::string& name, std::size_t group) {
  const std::optional<DType> dtype = to_dtype(t.scalar_type());
  ACCEL_CHECK_ARG(dtype.has_value(), "pipeline checkpoint: tensor '" + name + "' has type " +
                                         std::string(c10::toString(t.scalar_type())) +
                                         ", which checkpoints do not hold");
  out << kind << ' ' << piece;
  if (std::string(kind) == "param") out << ' ' << group;
  out << ' ' << dtype_name(*dtype) << ' ' << t.dim();
  for (const std::int64_t d : t.sizes()) out << ' ' << d;
  out << ' ' << name << '\n';
}

// The param group holding each tensor (groups.size() for none, as the LibTorch adapter).
std::size_t group_of(const torch::optim::Optimizer& optimizer, const at::Tensor& t) {
  const auto& groups = optimizer.param_groups();
  for (std::size_t g = 0; g < groups.size(); ++g)
    for (const at::Tensor& p : groups[g].params())
      if (p.unsafeGetTensorImpl() == t.unsafeGetTensorImpl()) return g;
  return groups.size();
}

struct Described {
  int piece = 0;
  std::size_t group = 0;
  DType dtype = DType::f32;
  std::vector<std::int64_t> shape;
  std::string name;
  std::size_t count() const {
    std::size_t n = 1;
    for (const std::int64_t d : shape) n *= std::size_t(d);
    return n;
  }
};

}  // namespace

StageCheckpoint::StageCheckpoint(Communicator& world, std::vector<StagePiece> pieces, int stages,
                                 int stage, int replica, torch::optim::Optimizer& optimizer)
    : world_(world),
      pieces_(std::move(pieces)),
      stages_(stages),
      stage_(stage),
      replica_(replica),
      optimizer_(optimizer),
      flat_state_unsupported_(torch_optimizer_state::unsupported_reason(optimizer)) {
  std::ostringstream mine;
  for (const StagePiece& p : pieces_) {
    for (const auto& item : p.layers->named_parameters(/*recurse=*/true))
      describe(mine, "param", p.piece, item.value(), item.key(), group_of(optimizer, item.value()));
    for (const auto& item : p.layers->named_buffers(/*recurse=*/true))
      describe(mine, "buffer", p.piece, item.value(), item.key(), 0);
    for (const auto& item : p.layers->named_modules("", /*include_self=*/false))
      mine << "module " << p.piece << ' ' << item.key() << '\n';
  }
  // Replica 0's stages (ranks 0 .. P - 1) describe the whole model; the others hold copies.
  const std::vector<std::string> all = all_gather_strings(world, mine.str());
  std::map<int, std::vector<Described>> params, buffers;
  std::map<int, std::vector<std::string>> modules;
  for (int r = 0; r < stages; ++r) {
    std::istringstream in(all[std::size_t(r)]);
    for (std::string line; std::getline(in, line);) {
      std::istringstream fields(line);
      std::string kind, dtype;
      Described d;
      fields >> kind >> d.piece;
      if (kind == "module") {
        fields >> d.name;
        modules[d.piece].push_back(d.name);
        continue;
      }
      if (kind == "param") fields >> d.group;
      std::size_t dims = 0;
      fields >> dtype >> dims;
      d.dtype = parse_dtype(dtype);
      d.shape.resize(dims);
      for (std::int64_t& n : d.shape) fields >> n;
      fields >> d.name;
      (kind == "param" ? params : buffers)[d.piece].push_back(std::move(d));
    }
  }
  // This rank's tensors in the same order, to tie them to the whole model's indices.
  std::unordered_map<std::string, at::Tensor> own_params, own_buffers;
  std::unordered_map<std::string, int> own_piece;
  for (const StagePiece& p : pieces_) {
    for (const auto& item : p.layers->named_parameters(true)) own_params[item.key()] = item.value();
    for (const auto& item : p.layers->named_buffers(true)) own_buffers[item.key()] = item.value();
    for (const auto& item : p.layers->named_parameters(true)) own_piece[item.key()] = p.piece;
    for (const auto& item : p.layers->named_buffers(true)) own_piece[item.key()] = p.piece;
  }
  TensorNames names;
  for (const auto& [piece, list] : params)
    for (const Described& d : list) {
      ParamRef ref;
      ref.name = d.name;
      ref.group = d.group;
      ref.shape = d.shape;
      ref.data = Buffer{nullptr, d.count(), d.dtype, DeviceKind::cpu};
      const auto it = own_params.find(d.name);
      if (it != own_params.end() && own_piece.at(d.name) == piece) {
        ACCEL_CHECK_ARG(
            it->second.is_contiguous() && it->second.device().is_cpu(),
            "pipeline checkpoint: parameter '" + d.name + "' is not a contiguous CPU tensor");
        ref.data = tensor_buffer(it->second, d.name);
        mine_.push_back(params_.size());
        my_params_.push_back(it->second);
      }
      params_.push_back(std::move(ref));
    }
  for (const auto& [piece, list] : buffers)
    for (const Described& d : list) {
      const auto it = own_buffers.find(d.name);
      if (it != own_buffers.end() && own_piece.at(d.name) == piece) {
        my_buffer_at_.push_back(buffers_.size());
        my_buffers_.push_back(it->second);
      }
      buffers_.push_back(Buffer{nullptr, d.count(), d.dtype, DeviceKind::cpu});
      buffer_piece_.push_back(piece);
      names.buffers.push_back({d.name, d.shape});
    }
  for (const auto& [piece, list] : modules)
    names.modules.insert(names.modules.end(), list.begin(), list.end());

  // The layout: every flat buffer cut into its pieces' runs, each in its stage's blob.
  layout_ = describe_parameters(params_, buffers_, "pipeline", stages, /*sharded=*/false, names);
  layout_.slices.clear();
  std::size_t first = 0;
  for (const auto& [piece, list] : params) {
    const std::string blob = rank_blob(kParametersBlob, piece % stages);
    std::map<std::size_t, SavedSlice> runs;  // by flat buffer
    for (std::size_t i = first; i < first + list.size(); ++i) {
      const SavedParam& p = layout_.params[i];
      auto [it, fresh] = runs.try_emplace(p.flat, SavedSlice{blob, p.flat, p.offset, 0});
      it->second.count = p.offset + p.count - it->second.offset;
    }
    for (const auto& [flat, slice] : runs) layout_.slices.push_back(slice);
    first += list.size();
  }
}

Accelerator::CheckpointPart StageCheckpoint::part() {
  return {.shared_blobs = {kParametersBlob, kParametersLayoutBlob, kOptimizerOptions},
          .save = [this] { return save(); },
          .load = [this](const LoadedCheckpoint& ck) { return load(ck); }};
}

std::vector<ParamSegment> StageCheckpoint::segments() const {
  // Each parameter's place among its group's parameters laid end to end: its flat offset
  // (a group of one dtype has one flat buffer; unsupported_reason refuses the others).
  std::vector<ParamSegment> out;
  for (const std::size_t i : mine_)
    out.push_back({.group = params_[i].group,
                   .values = params_[i].data,
                   .grad = {},
                   .offset = layout_.params[i].offset});
  return out;
}

Accelerator::CheckpointPartBlobs StageCheckpoint::save() {
  auto kept = std::make_shared<std::deque<std::string>>();  // the views point into them
  Accelerator::CheckpointPartBlobs out;
  const auto keep = [&](std::string s) -> const std::string& {
    kept->push_back(std::move(s));
    return kept->back();
  };

  // The buffers travel to every rank (they are small: norms' statistics); rank 0 writes them.
  std::string my_buffers;
  if (replica_ == 0)
    for (const at::Tensor& b : my_buffers_) {
      const at::Tensor c = b.detach().contiguous();
      my_buffers.append(bytes_of(c).data(), bytes_of(c).size());
    }
  const std::vector<std::string> gathered = all_gather_strings(world_, my_buffers);
  std::vector<std::size_t> read_at(std::size_t(stages_), 0);
  std::vector<std::span<const char>> whole;
  for (std::size_t b = 0; b < buffers_.size(); ++b) {
    const int stage = buffer_piece_[b] % stages_;
    const std::string& from = gathered[std::size_t(stage)];
    std::size_t& at = read_at[std::size_t(stage)];
    const std::size_t n = buffers_[b].bytes();
    ACCEL_CHECK_ARG(at + n <= from.size(), "pipeline checkpoint: stage " + std::to_string(stage) +
                                               " sent fewer buffer bytes than it described");
    whole.emplace_back(from.data() + at, n);
    at += n;
  }
  std::string all_buffers;
  for (const auto& piece : whole) all_buffers.append(piece.data(), piece.size());
  out.shared.push_back({kParametersBlob, {bytes_of(keep(std::move(all_buffers)))}});
  out.shared.push_back({kParametersLayoutBlob, {bytes_of(keep(format_layout(layout_)))}});

  if (replica_ == 0)
    out.per_rank.push_back(
        {kParametersBlob,
         blob_pieces(layout_, rank_blob(kParametersBlob, stage_), params_, buffers_)});
  if (flat_state_unsupported_.empty()) {
    const std::vector<ParamSegment> segs = segments();
    const std::string state = torch_optimizer_state::save(optimizer_, segs, my_params_);
    out.per_rank.push_back({kOptimizer, {bytes_of(keep(pack_optimizer_state(state, segs)))}});
    out.shared.push_back(
        {kOptimizerOptions, {bytes_of(keep(torch_state::save_optimizer_options(optimizer_)))}});
  } else {
    out.per_rank.push_back(
        {kOptimizerOptions, {bytes_of(keep(torch_state::save_optimizer(optimizer_)))}});
  }
  out.keep = kept;
  return out;
}

std::function<void()> StageCheckpoint::load(const LoadedCheckpoint& ck) const {
  const auto fail = [&](const std::string& what) { throw CheckpointError(ck.dir + ": " + what); };
  if (!ck.shared.count(kParametersLayoutBlob))
    fail(
        "has no parameters.layout: saved with state_dict_type FULL_STATE_DICT (a LibTorch "
        "archive of the whole model), which a pipeline does not cut into stages; save with "
        "state_dict_type SHARDED_STATE_DICT, or from a pipeline");
  const std::string where = ck.dir + "/" + kParametersLayoutBlob;
  const ParameterLayout saved = parse_layout(ck.shared_blob(kParametersLayoutBlob), where);
  const std::string difference = layout_difference(saved, params_, buffers_);
  if (!difference.empty())
    fail("the pipeline's model differs from the checkpoint's (" +
         std::string(kParametersLayoutBlob) + "): " + difference);
  const int rank = world_.rank();
  const std::string own = rank_blob(kParametersBlob, rank);
  const FullParameters values = read_parameters_of(
      saved,
      [&](const std::string& blob) {
        if (blob == kParametersBlob) return ck.shared_blob(kParametersBlob);
        if (ck.per_rank_loaded && blob == own && ck.per_rank.count(kParametersBlob))
          return ck.per_rank.at(kParametersBlob);
        return read_blob(ck, blob);
      },
      mine_, ck.dir);

  // The optimizer: resharded from the flat state of the ranks that wrote slices (every rank of
  // a DDP checkpoint wrote one shared blob), or this rank's own archive.
  std::function<void()> apply_state, apply_options;
  if (flat_state_unsupported_.empty()) {
    const std::vector<ParamSegment> segs = segments();
    std::string bytes;
    const auto own_state = ck.per_rank.find(kOptimizer);
    if (ck.shared.count(kOptimizer)) {
      bytes = reshard_optimizer_state({ck.shared_blob(kOptimizer)}, segs, ck.dir);
    } else if (own_state != ck.per_rank.end() && same_segments(own_state->second, segs)) {
      bytes = optimizer_bytes(own_state->second, ck.dir);
    } else {
      std::vector<std::string> blobs;
      for (int r = 0; r < saved.world_size; ++r)
        blobs.push_back(read_blob(ck, rank_blob(kOptimizer, r)));
      bytes = reshard_optimizer_state(blobs, segs, ck.dir);
    }
    apply_state = torch_optimizer_state::load(optimizer_, segs, my_params_, bytes, ck.dir);
    const std::string& options = ck.shared_blob(kOptimizerOptions);
    apply_options = [this, options] { torch_state::load_optimizer_options(optimizer_, options); };
  } else {
    const bool same_pipeline =
        ck.per_rank_loaded && saved.strategy == "pipeline" && saved.world_size == stages_;
    if (!same_pipeline || !ck.per_rank.count(kOptimizerOptions))
      fail("the optimizer state was saved as each rank's LibTorch archive (" +
           flat_state_unsupported_ +
           "), which loads only into the same stages and replicas: resume with the pipeline "
           "that saved it (" +
           std::to_string(saved.world_size) + " stages, " + std::to_string(ck.meta.world_size) +
           " processes)");
    const std::string archive = ck.per_rank.at(kOptimizerOptions);
    apply_state = [this, archive] { torch_state::load_optimizer(optimizer_, archive); };
  }

  return [this, values, apply_state, apply_options] {
    torch::NoGradGuard no_grad;
    for (std::size_t k = 0; k < my_params_.size(); ++k) {
      const at::Tensor& t = my_params_[k];
      std::memcpy(t.data_ptr(), values.params[k].data(), values.params[k].size());
    }
    for (std::size_t k = 0; k < my_buffers_.size(); ++k) {
      const std::string& bytes = values.buffers[my_buffer_at_[k]];
      my_buffers_[k].copy_(torch::from_blob(const_cast<char*>(bytes.data()), my_buffers_[k].sizes(),
                                            my_buffers_[k].options().device(torch::kCPU)));
    }
    if (apply_options) apply_options();
    apply_state();
  };
}

}  // namespace accel::pipeline::detail
