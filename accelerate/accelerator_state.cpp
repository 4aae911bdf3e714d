// Accelerator::save_state / load_state / register_state: what the Accelerator puts into a
// checkpoint (accelerate/checkpointing/checkpoint.hpp does the directory, atomicity and
// verification).
//
// Blobs: the prepared parameters' values as accelerate/checkpointing/parameter_layout.hpp describes
// them
// ("parameters": under DDP every value, under ZeRO the buffers only; "parameters.rankR": rank
// R's slices under ZeRO) with "parameters.layout" (names, dtypes, shapes, flat offsets and
// every blob's slices, so any strategy and world size reassembles them and a model that
// changed is reported by name); "state.NAME" per registered
// shared state, "state.NAME.rankR" per per-rank one; "rng.rankR", each rank's rng() in the
// standard library's text form (register_rng's generators are per-rank states that a
// checkpoint of another world size reseeds instead of failing). Step, epoch, batch position
// and seed are MANIFEST fields. Model k > 0 of several has the same blobs under
// prepared_name ("parameters_1", "parameters_1.rankR", "parameters_1.layout", "optimizer_1"),
// its layout naming the blobs as model 0's does.

#include <algorithm>
#include <cstring>
#include <deque>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <vector>

#include "accelerate/accelerator.hpp"
#include "accelerate/checkpointing/checkpoint.hpp"
#include "accelerate/checkpointing/optimizer_state.hpp"
#include "accelerate/checkpointing/parameter_layout.hpp"
#include "accelerate/prepared_parameters.hpp"
#include "backends/comm/host_collectives.hpp"
#include "config/config.hpp"
#include "foundation/device_memory.hpp"
#include "foundation/error.hpp"

namespace accel {
namespace {

constexpr const char* kParameters = kParametersBlob;
constexpr const char* kLayout = kParametersLayoutBlob;
constexpr const char* kRng = "rng";
// prepare()'s built-in optimizer: shared under DDP, per rank (its slices) under ZeRO.
constexpr const char* kOptimizer = "optimizer";

std::string state_blob(const std::string& name) { return "state." + name; }

// Where model `model`'s blob `name` ("parameters", "parameters.rank1", "parameters.layout" as
// its layout names them; "optimizer") is stored: model 0's as named, "parameters_1..." else.
std::string model_blob(const std::string& name, std::size_t model) {
  for (const std::string base : {kParameters, kOptimizer})
    if (name.rfind(base, 0) == 0) return prepared_name(base, model) + name.substr(base.size());
  return name;
}

std::span<const char> bytes_of(const Buffer& b) {
  return {static_cast<const char*>(b.data), b.bytes()};
}

std::span<const char> bytes_of(const std::string& s) { return {s.data(), s.size()}; }

// Host copies of the prepared parameters and buffers that live on a GPU: a checkpoint's bytes
// are read and written on the host. Views of host memory for every one (CPU ones as they are).
struct HostParameters {
  std::vector<ParamRef> params;
  std::vector<Buffer> buffers;
  std::vector<DeviceBuffer> owned;  // the host copies of GPU values

  Buffer on_host(const Buffer& b) {
    if (b.device == DeviceKind::cpu) return b;
    owned.emplace_back(b.count, b.dtype, MemoryKind::host);
    return owned.back().view();
  }
};

// The parameters' and buffers' values in host memory: copied from the GPU on the compute
// stream after waiting for it (bounded), so save_state reads what the last step wrote.
HostParameters host_parameters(const std::vector<ParamRef>& params,
                               const std::vector<Buffer>& buffers, const DeviceContext& ctx,
                               const std::string& who) {
  HostParameters out;
  out.owned.reserve(params.size() + buffers.size());  // the views stay valid
  bool on_gpu = false;
  for (const ParamRef& p : params) on_gpu = on_gpu || p.data.device == DeviceKind::cuda;
  for (const Buffer& b : buffers) on_gpu = on_gpu || b.device == DeviceKind::cuda;
  if (on_gpu) synchronize_stream(ctx, who);  // the copies below then find the stream idle
  for (const ParamRef& p : params) {
    ParamRef copy = p;
    copy.data = out.on_host(p.data);
    copy_buffer(copy.data, p.data, ctx.stream);
    out.params.push_back(std::move(copy));
  }
  for (const Buffer& b : buffers) {
    out.buffers.push_back(out.on_host(b));
    copy_buffer(out.buffers.back(), b, ctx.stream);
  }
  return out;
}

// ZeRO-3's blob of this rank's slices: the layout's slices of `blob` are flat F's owned slice
// without its padding, which segment F holds (one per flat buffer, in the same order).
std::vector<std::span<const char>> slice_pieces(const ParameterLayout& layout,
                                                const std::string& blob,
                                                const std::vector<ParamSegment>& segments,
                                                HostParameters& host, const DeviceContext& ctx,
                                                const std::string& who) {
  std::vector<std::span<const char>> out;
  bool waited = false;
  for (const SavedSlice& s : layout.slices) {
    if (s.blob != blob) continue;
    ACCEL_CHECK_ARG(s.flat < segments.size() && s.count <= segments[s.flat].values.count,
                    blob + ": the layout's slice of flat buffer " + std::to_string(s.flat) +
                        " does not match this rank's segments");
    const Buffer values = segments[s.flat].values.slice(0, s.count);
    if (values.device == DeviceKind::cuda && !waited) {
      synchronize_stream(ctx, who);
      waited = true;
    }
    const Buffer on_host = host.on_host(values);
    if (on_host.data != values.data) copy_buffer(on_host, values, ctx.stream);
    out.push_back(bytes_of(on_host));
  }
  return out;
}

// A generator's seed for a rank that has no saved stream of its own (a checkpoint of another
// world size): reproducible from the run's seed, the rank, the step and the generator's name.
std::uint64_t fresh_seed(std::uint64_t seed, int rank, std::uint64_t step,
                         const std::string& name) {
  std::vector<std::uint32_t> words = {std::uint32_t(seed), std::uint32_t(seed >> 32),
                                      std::uint32_t(rank), std::uint32_t(step),
                                      std::uint32_t(step >> 32)};
  for (const char c : name) words.push_back(std::uint8_t(c));
  std::seed_seq seq(words.begin(), words.end());
  std::uint32_t out[2];
  seq.generate(out, out + 2);
  return std::uint64_t(out[0]) | std::uint64_t(out[1]) << 32;
}

// K for a blob of model K > 0 ("parameters_K", "parameters_K.layout", "optimizer_K").
std::optional<std::size_t> model_of_blob(const std::string& name) {
  for (const std::string base : {kParameters, kOptimizer}) {
    if (name.rfind(base + "_", 0) != 0) continue;
    const std::string rest = name.substr(base.size() + 1);
    const std::size_t digits = rest.find_first_not_of("0123456789");
    if (digits == 0) continue;
    return std::stoul(rest.substr(0, digits));
  }
  return std::nullopt;
}

[[noreturn]] void fail(const LoadedCheckpoint& ck, const std::string& what) {
  throw CheckpointError(ck.dir + ": " + what);
}

// Every prepared parameter's and buffer's saved bytes, checked against the prepared layout.
// Whatever strategy and world size saved them: this rank's own blobs are loaded, the other
// ranks' slices are read here (the raw loop's buffers hold every parameter, at stage 3 too).
FullParameters read_parameters(const LoadedCheckpoint& ck, const PreparedParameters& model,
                               int rank) {
  const std::string layout_blob = model_blob(kLayout, model.index);
  const ParameterLayout layout =
      parse_layout(ck.shared_blob(layout_blob), ck.dir + "/" + layout_blob);
  const std::string difference = layout_difference(layout, model.params, model.buffers);
  if (!difference.empty())
    fail(ck, "the parameters differ from the checkpoint's (" + layout_blob + "): " + difference);
  const std::string whole = model_blob(kParameters, model.index);
  return reassemble_parameters(
      layout,
      [&](const std::string& blob) {
        if (blob == kParameters) return ck.shared_blob(whole);
        const std::string own = std::string(kParameters) + ".rank" + std::to_string(rank);
        if (ck.per_rank_loaded && blob == own && ck.per_rank.count(whole))
          return ck.per_rank.at(whole);
        return read_blob(ck, model_blob(blob, model.index));
      },
      ck.dir);
}

// The optimizer state in Optimizer::save_state's format for this rank's segments `mine`. DDP
// saved one blob; ZeRO one per rank. Another strategy or world size rebuilds this rank's
// segments from all of them.
std::string read_optimizer_state(const LoadedCheckpoint& ck, const std::string& name,
                                 const std::vector<ParamSegment>& mine) {
  const auto own = ck.per_rank.find(name);
  const bool any = std::any_of(ck.blobs.begin(), ck.blobs.end(), [&](const BlobEntry& b) {
    return b.name == name || b.name.rfind(name + ".rank", 0) == 0;
  });
  if (!any)
    fail(ck, "has no optimizer state ('" + name + "' or '" + name +
                 ".rankR') for the prepared optimizer: saved without one (or with fewer "
                 "models), or (a LibTorch checkpoint) by a version that kept it only in "
                 "state.optimizer[.rankR]");
  if (ck.shared.count(name)) {
    const std::string& blob = ck.shared_blob(name);
    return same_segments(blob, mine) ? optimizer_bytes(blob, ck.dir)
                                     : reshard_optimizer_state({blob}, mine, ck.dir);
  }
  if (own != ck.per_rank.end() && same_segments(own->second, mine))
    return optimizer_bytes(own->second, ck.dir);
  std::vector<std::string> blobs;
  const int world = int(ck.meta.world_size);
  for (int r = 0; r < world; ++r) {
    LoadedCheckpoint other = read_checkpoint(ck.dir, r, world);
    const auto it = other.per_rank.find(name);
    if (it == other.per_rank.end())
      fail(ck, "no optimizer state (" + name + ".rank" + std::to_string(r) +
                   ") for the prepared optimizer");
    blobs.push_back(std::move(it->second));
  }
  return reshard_optimizer_state(blobs, mine, ck.dir);
}

// This rank's saved rng(), or, from another number of processes where no saved stream belongs
// to this rank, a fresh one that is still reproducible.
std::mt19937_64 read_rng(const LoadedCheckpoint& ck, int rank) {
  std::mt19937_64 rng;
  if (!ck.per_rank_loaded) {
    rng.seed(fresh_seed(ck.meta.seed, rank, ck.meta.step, kRng));
    return rng;
  }
  const auto it = ck.per_rank.find(kRng);
  if (it == ck.per_rank.end()) fail(ck, "no RNG state for rank " + std::to_string(rank));
  std::istringstream in(it->second);
  in >> rng;
  if (!in) fail(ck, "the RNG state of rank " + std::to_string(rank) + " does not parse");
  return rng;
}

}  // namespace

void Accelerator::register_state(std::string name, std::function<std::string()> save,
                                 std::function<void(const std::string&)> load, StateScope scope) {
  ACCEL_CHECK_ARG(save && load, "register_state('" + name + "'): save and load must be set");
  check_blob_name(state_blob(name));
  for (const RegisteredState& s : states_)
    ACCEL_CHECK_ARG(s.name != name, "register_state: '" + name + "' is already registered");
  states_.push_back({std::move(name), std::move(save), std::move(load), scope, {}});
}

void Accelerator::register_optimizer_state(std::size_t model, std::function<std::string()> save,
                                           OptimizerStateLoader load) {
  ACCEL_CHECK_ARG(save && load, "register_optimizer_state: save and load must be set");
  ACCEL_CHECK_ARG(model < models_.size(),
                  "register_optimizer_state: no model " + std::to_string(model) + " prepared");
  PreparedParameters& m = *models_[model];
  ACCEL_CHECK_ARG(!m.save_optimizer, "register_optimizer_state: " + prepared_name("model", model) +
                                         "'s optimizer state is already registered (one "
                                         "optimizer per model)");
  m.save_optimizer = std::move(save);
  m.load_optimizer = std::move(load);
}

void Accelerator::register_checkpoint_part(std::string name, CheckpointPart part) {
  ACCEL_CHECK_ARG(part.save && part.load,
                  "register_checkpoint_part('" + name + "'): save and load must be set");
  for (const auto& [other, _] : parts_)
    ACCEL_CHECK_ARG(other != name,
                    "register_checkpoint_part: '" + name + "' is already registered");
  parts_.emplace_back(std::move(name), std::move(part));
}

void Accelerator::unregister_checkpoint_part(const std::string& name) {
  std::erase_if(parts_, [&](const auto& p) { return p.first == name; });
}

void Accelerator::register_rng(std::string name, std::function<std::string()> save,
                               std::function<void(const std::string&)> load,
                               std::function<void(std::uint64_t)> reseed) {
  ACCEL_CHECK_ARG(reseed, "register_rng('" + name + "'): reseed must be set");
  register_state(std::move(name), std::move(save), std::move(load), StateScope::per_rank);
  states_.back().reseed = std::move(reseed);
}

const CheckpointPlacement& Accelerator::checkpoint_placement() {
  if (placement_) return *placement_;
  CheckpointPlacement placement;
  if (config_->save_on_each_node) {
    std::vector<std::int64_t> nodes(static_cast<std::size_t>(num_processes()));
    const std::int64_t mine = env_.node_rank;
    all_gather_values(comm(), buffer_of(std::span(&mine, 1)), buffer_of(std::span(nodes)));
    for (int r = 0; r < num_processes(); ++r)
      if (nodes[std::size_t(r)] == mine) placement.node_ranks.push_back(r);
  }
  placement_ = std::move(placement);
  return *placement_;
}

bool Accelerator::writes_shared_checkpoint_files() {
  const CheckpointPlacement& p = checkpoint_placement();
  return p.node_ranks.empty() ? is_main_process() : p.node_ranks.front() == process_index();
}

void Accelerator::save_state(const std::string& dir) {
  ACCEL_CHECK_ARG(micro_since_sync_ == 0,
                  "save_state between accumulation steps would lose the gradients accumulated "
                  "so far; save after an optimizer step (sync_gradients() returned true)");

  const bool writer = writes_shared_checkpoint_files();  // every rank, before any other step
  before_save_state();
  struct After {
    Accelerator& a;
    ~After() { a.after_save_state(); }
  } after{*this};
  CheckpointContents contents;
  contents.meta.step = optimizer_steps_;
  contents.meta.epoch = epoch_;
  contents.meta.batch = next_batch_;
  contents.meta.global_batch_size = std::size_t(config_->global_batch_size);
  contents.meta.seed = seed_;

  // Strings the blob views point into; a deque would do too, but the count is known.
  // Strings and host copies the blob views point into (a deque keeps them in place).
  std::deque<std::string> owned;
  std::deque<HostParameters> staged;  // the parameters' values in host memory
  for (const auto& model : models_) {
    if (!checkpoint_parameters_) break;
    Strategy& strategy = *model->strategy;
    // ZeRO: each rank writes its slice of the flat buffers (stages 1 and 2 replicate the
    // parameters, but a rank's slice is what it updated and all that stage 3 holds). Saved on
    // each node, stages 1 and 2 write the whole parameters instead, so each machine's copy
    // holds them without the other machines' slices.
    const bool values_sharded = strategy.parameters_sharded();
    const bool sharded =
        strategy.gradients_sharded() && !(config_->save_on_each_node && !values_sharded);
    // GPU values are copied to host memory first (CPU ones are written from where they are);
    // under stage 3 the parameters' buffers are not current, its slices (segments) are. The
    // strategy's ParamRefs say where the values live now (a front end may have moved them
    // into its flat buffers: use_param_slots).
    const std::string who = "save_state: rank " + std::to_string(process_index()) +
                            " copying the parameters from the GPU";
    HostParameters& host = staged.emplace_back(
        host_parameters(values_sharded ? std::vector<ParamRef>{} : strategy.params(),
                        model->buffers, compute_context(comm()), who));
    // HYBRID_SHARD: the slices are 1/shard_world each, the same on every machine; the layout
    // names the first machine's ranks' blobs (ranks 0 .. shard_world - 1) and only they write.
    const int shard_world = num_processes() / strategy.gradient_replicas();
    const ParameterLayout layout =
        describe_parameters(model->params, model->buffers, std::string(strategy.name()),
                            shard_world, sharded, model->names);
    if (writer) {
      contents.shared.push_back({model_blob(kParameters, model->index),
                                 blob_pieces(layout, kParameters, host.params, host.buffers)});
      owned.push_back(format_layout(layout));
      contents.shared.push_back({model_blob(kLayout, model->index), {bytes_of(owned.back())}});
    }
    const std::string own_blob =
        std::string(kParameters) + ".rank" + std::to_string(process_index());
    if (process_index() >= shard_world) continue;  // another machine's copy of the slices
    if (values_sharded)
      contents.per_rank.push_back({model_blob(kParameters, model->index),
                                   slice_pieces(layout, own_blob, strategy.segments(), host,
                                                compute_context(comm()), who)});
    else if (sharded)
      contents.per_rank.push_back({model_blob(kParameters, model->index),
                                   blob_pieces(layout, own_blob, host.params, host.buffers)});
  }
  std::deque<CheckpointPartBlobs> part_blobs;  // kept until the save ends
  for (const auto& [name, part] : parts_) {
    CheckpointPartBlobs& blobs = part_blobs.emplace_back(part.save());
    if (writer)
      contents.shared.insert(contents.shared.end(), blobs.shared.begin(), blobs.shared.end());
    contents.per_rank.insert(contents.per_rank.end(), blobs.per_rank.begin(), blobs.per_rank.end());
  }
  for (const RegisteredState& s : states_) {
    const bool mine = s.scope == StateScope::per_rank;
    if (!mine && !writer) continue;  // rank 0's copy is the one kept (each machine's first's)
    owned.push_back(s.save());
    (mine ? contents.per_rank : contents.shared)
        .push_back({state_blob(s.name), {bytes_of(owned.back())}});
  }
  for (const auto& model : models_) {
    if (!model->save_optimizer) continue;
    const bool sharded = model->strategy->gradients_sharded();
    if (!sharded && !writer) continue;
    owned.push_back(pack_optimizer_state(model->save_optimizer(), model->strategy->segments()));
    (sharded ? contents.per_rank : contents.shared)
        .push_back({model_blob(kOptimizer, model->index), {bytes_of(owned.back())}});
  }
  std::ostringstream rng_text;
  rng_text << rng_;
  owned.push_back(rng_text.str());
  contents.per_rank.push_back({kRng, {bytes_of(owned.back())}});

  save_checkpoint(comm(), dir, contents, checkpoint_placement());
}

void Accelerator::load_state(const std::string& dir) {
  const LoadedCheckpoint ck = load_checkpoint(comm(), dir, checkpoint_placement());
  const CheckpointMeta& meta = ck.meta;
  const bool same_world = ck.per_rank_loaded;

  // Everything checked (and parsed) before anything is applied; the ranks agree on it.
  std::string error;
  std::mt19937_64 restored_rng;
  std::vector<std::function<void()>> apply_optimizer_states, apply_parts;
  std::vector<FullParameters> values;  // every model's parameters' and buffers' saved bytes
  try {
    for (const auto& model : models_) {
      if (checkpoint_parameters_) values.push_back(read_parameters(ck, *model, process_index()));
      if (model->load_optimizer)
        apply_optimizer_states.push_back(
            model->load_optimizer(read_optimizer_state(ck, model_blob(kOptimizer, model->index),
                                                       model->strategy->segments()),
                                  ck.dir));
    }
    for (const auto& [name, part] : parts_) apply_parts.push_back(part.load(ck));
    const bool part_reads_parameters = std::any_of(parts_.begin(), parts_.end(), [](const auto& p) {
      const auto& names = p.second.shared_blobs;
      return std::find(names.begin(), names.end(), kParameters) != names.end();
    });
    if (checkpoint_parameters_ && models_.empty() && !part_reads_parameters &&
        ck.shared.count(kParameters))
      fail(ck, "has parameters but none were prepared: call prepare_parameters before load_state");
    check_registered_states(ck);
    // With the same global_batch_size, batch b holds the same samples at any world size.
    const bool same_batches = meta.global_batch_size != 0 &&
                              meta.global_batch_size == std::size_t(config_->global_batch_size);
    if (!same_world && meta.batch != 0 && !same_batches)
      fail(ck, "saved mid-epoch (epoch " + std::to_string(meta.epoch) + ", batch " +
                   std::to_string(meta.batch) + ") by " + std::to_string(meta.world_size) +
                   " processes; with " + std::to_string(num_processes()) +
                   " the batches hold other samples: resume with " +
                   std::to_string(meta.world_size) +
                   " processes, from an end-of-epoch checkpoint, or with the same "
                   "global_batch_size at both sizes");
    restored_rng = read_rng(ck, process_index());
  } catch (const std::exception& e) {
    error = e.what();
  }
  const int failed = first_failed_rank(comm(), error.empty());
  if (failed >= 0) {
    if (!error.empty()) throw CheckpointError(error);
    throw CheckpointError(ck.dir + ": rank " + std::to_string(failed) +
                          " cannot use this checkpoint (see its error)");
  }

  // Apply: registered states first (user code that may throw), then what cannot fail.
  load_registered_states(ck);
  for (std::size_t m = 0; m < values.size(); ++m)
    load_parameter_values(*models_[m], values[m]);  // sizes checked above
  // Parameters changed from outside (the blob above, or a front end's registered model
  // state): ZeRO's flat copy follows.
  for (const auto& model : models_) model->strategy->reload_parameters();
  for (const auto& apply : apply_optimizer_states) apply();
  for (const auto& apply : apply_parts) apply();
  optimizer_steps_ = meta.step;
  micro_since_sync_ = 0;
  last_batch_ = false;
  batch_in_flight_.reset();
  in_batch_again_ = false;
  epoch_ = resume_epoch_ = meta.epoch;
  next_batch_ = resume_batch_ = meta.batch;
  seed_ = meta.seed;
  rng_ = restored_rng;
  apply_sync_state();
}

void Accelerator::check_registered_states(const LoadedCheckpoint& ck) const {
  const bool same_world = ck.per_rank_loaded;
  std::set<std::string> known;
  for (std::size_t m = 0; m < std::max<std::size_t>(models_.size(), 1); ++m)
    for (const std::string name : {kParameters, kLayout, kOptimizer})
      known.insert(model_blob(name, m));
  for (const auto& [name, part] : parts_)
    known.insert(part.shared_blobs.begin(), part.shared_blobs.end());
  for (const RegisteredState& s : states_) {
    known.insert(state_blob(s.name));
    if (s.scope == StateScope::shared) {
      ck.shared_blob(state_blob(s.name));  // throws naming the file when absent
    } else if (!same_world && !s.reseed) {
      fail(ck, "saved by " + std::to_string(ck.meta.world_size) + " processes, this job has " +
                   std::to_string(num_processes()) + ": per-rank state '" + s.name +
                   "' cannot be matched to ranks");
    } else if (same_world && !ck.per_rank.count(state_blob(s.name))) {
      fail(ck, "no per-rank state '" + s.name + "' for rank " + std::to_string(process_index()));
    }
  }
  for (const auto& [name, bytes] : ck.shared) {
    if (known.count(name)) continue;
    if (const auto model = model_of_blob(name))
      fail(ck, "has '" + name + "', model " + std::to_string(*model) +
                   "'s, but this job prepared " + std::to_string(models_.size()) +
                   " model(s): prepare every model the checkpoint holds before load_state");
    fail(ck, "has '" + name + "', which nothing registered (register_state before load_state)");
  }
}

void Accelerator::load_registered_states(const LoadedCheckpoint& ck) {
  for (const RegisteredState& s : states_) {
    if (s.scope == StateScope::shared)
      s.load(ck.shared_blob(state_blob(s.name)));
    else if (ck.per_rank_loaded)
      s.load(ck.per_rank.at(state_blob(s.name)));
    else
      s.reseed(fresh_seed(ck.meta.seed, process_index(), ck.meta.step, s.name));
  }
}

void Accelerator::copy_parameters_in(const PreparedParameters& model,
                                     const FullParameters& values) {
  // Into CPU or GPU memory; GPU copies are queued on the compute stream (from pageable
  // memory CUDA stages them before returning), ahead of the strategy's reload.
  const DeviceStream stream = comm().compute_stream();
  auto host = [](const std::string& bytes, const Buffer& like) {
    return Buffer{const_cast<char*>(bytes.data()), like.count, like.dtype, DeviceKind::cpu};
  };
  // Where the values live now (the strategy's ParamRefs: a front end may have moved them).
  const std::vector<ParamRef>& params = model.strategy->params();
  for (std::size_t i = 0; i < params.size(); ++i)
    copy_buffer(params[i].data, host(values.params[i], params[i].data), stream);
  copy_buffers_in(model, values);
}

void Accelerator::name_tensors(std::size_t model, TensorNames names) {
  models_.at(model)->names = std::move(names);
}

void Accelerator::copy_buffers_in(const PreparedParameters& model, const FullParameters& values) {
  for (std::size_t i = 0; i < model.buffers.size(); ++i) {
    const Buffer& b = model.buffers[i];
    const Buffer saved{const_cast<char*>(values.buffers[i].data()), b.count, b.dtype,
                       DeviceKind::cpu};
    copy_buffer(b, saved, comm().compute_stream());
  }
}

}  // namespace accel
