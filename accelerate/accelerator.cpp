#include "accelerate/accelerator.hpp"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "accelerate/prepared_parameters.hpp"
#include "accelerate/process/malloc_tuning.hpp"
#include "accelerate/process/process_group.hpp"
#include "accelerate/process/uncaught_error.hpp"
#include "backends/comm/host_collectives.hpp"
#include "backends/comm/local_communicator.hpp"
#include "backends/optim/clip.hpp"
#include "backends/optim/elementwise.hpp"
#include "backends/strategy_factory.hpp"
#include "config/detect.hpp"
#include "config/resolve.hpp"
#include "foundation/error.hpp"

namespace accel {
namespace {

// A code argument as the config's text for it.
std::string config_text(int v) { return std::to_string(v); }
std::string config_text(bool v) { return v ? "true" : "false"; }
std::string config_text(const std::string& v) { return v; }

// The settings the Accelerator takes from the config, with code arguments as the top layer.
config::ResolvedConfig resolve_settings(const AcceleratorOptions& options) {
  config::Overrides from_code;
#define ACCEL_FROM_CODE(type, key) \
  if (options.key) from_code[#key] = config_text(*options.key);
  ACCEL_CONFIG_KEYS_IN_CODE(ACCEL_FROM_CODE)
#undef ACCEL_FROM_CODE
  return config::resolve_config(options.config_file, from_code);
}

// Each rank its own stream, reproducible from (seed, rank).
std::mt19937_64 rank_rng(std::uint64_t seed, int rank) {
  std::seed_seq seq{std::uint32_t(seed), std::uint32_t(seed >> 32), std::uint32_t(rank)};
  return std::mt19937_64(seq);
}

template <typename T>
std::vector<T> gather_values(Communicator& comm, const std::vector<T>& local) {
  std::vector<T> out(local.size() * std::size_t(comm.world_size()));
  all_gather_values(comm, buffer_of(std::span(local)), buffer_of(std::span(out)));
  return out;
}

// The global order of a gathered batch is rank after rank; the sampler's padding sits at the
// very end of the epoch, i.e. at the end of the last batch's concatenation.
template <typename T>
std::vector<T> drop_padding(std::vector<T> gathered, const ShardedSampler& sampler,
                            std::size_t batch_index) {
  if (batch_index + 1 == sampler.num_batches() && sampler.padding() <= gathered.size())
    gathered.resize(gathered.size() - sampler.padding());
  return gathered;
}

// DATA_PARALLEL on GPUs: a replica per GPU of gpu_ids. Under `accel launch` the launcher has
// narrowed CUDA_VISIBLE_DEVICES to gpu_ids, so whenever that variable is set the replicas are
// every visible GPU, 0 .. n-1; a program run without it takes gpu_ids as CUDA's indices.
std::vector<int> data_parallel_gpus(const config::ResolvedConfig& settings) {
  const config::Config& c = settings.config;
  const std::string what = settings.origins.at("distributed_type") +
                           ": DATA_PARALLEL on GPUs (use_cpu false, from " +
                           settings.origins.at("use_cpu") + ")";
  const std::string instead =
      "; set use_cpu true for replicas on CPU threads (data_parallel_replicas)";
  if (!cuda_runtime_built())
    throw ConfigError(what + ": this build of accelerate-cpp has no CUDA runtime" + instead);
  const int visible = config::detect_hardware().gpus;
  if (visible == 0) throw ConfigError(what + ": no CUDA device is visible" + instead);
  std::vector<int> ids;
  if (c.gpu_ids == "all" || std::getenv("CUDA_VISIBLE_DEVICES") != nullptr)
    for (int i = 0; i < visible; ++i) ids.push_back(i);
  else
    ids = config::gpu_id_list(c);
  for (int id : ids)
    if (id >= visible)
      throw ConfigError(settings.origins.at("gpu_ids") + ": gpu_ids " + c.gpu_ids + " names GPU " +
                        std::to_string(id) + ", but " + std::to_string(visible) +
                        " GPU(s) are visible");
  return ids;
}

// The one place the config's distributed_type picks a StrategyKind and its options (code
// arguments' DdpOptions and ZeroOptions under the config's stage, offload and replicas).
StrategyOptions strategy_options_for(const config::ResolvedConfig& settings,
                                     const AcceleratorOptions& options) {
  StrategyOptions out;
  out.ddp = options.ddp;
  out.zero = options.zero;
  const config::Config& c = settings.config;
  if (c.distributed_type == config::DistributedType::ZERO) {
    out.kind = StrategyKind::zero;
    out.zero.stage = c.zero_stage;  // the schema's range: 1-3
    if (c.offload_optimizer_device == "cpu") out.zero.offload_optimizer = OffloadDevice::cpu;
    out.zero.param_persistence_threshold = std::size_t(c.zero3_param_persistence_threshold);
    out.zero.reshard_after_forward = c.reshard_after_forward;
  }
  if (c.distributed_type == config::DistributedType::DATA_PARALLEL) {
    out.kind = StrategyKind::data_parallel;
    DataParallelOptions& dp = out.data_parallel;
    if (config::uses_gpu(c)) {
      dp.cuda_devices = data_parallel_gpus(settings);
      dp.replicas = int(dp.cuda_devices.size());
    } else {
      dp.replicas = c.data_parallel_replicas > 0 ? c.data_parallel_replicas
                                                 : config::detect_hardware().cpu_cores;
    }
  }
  return out;
}

// What every rank must have the same of before prepare's first collective (the parameters'
// broadcast, whose size they set): the strategy and what shapes its collectives, accumulation
// and mixed precision (which decide when ranks communicate), the parameters and buffers.
std::vector<AgreedValue> prepare_agreement(const StrategyOptions& strategy, int accumulation,
                                           config::MixedPrecision mixed_precision,
                                           const std::vector<ParamRef>& params,
                                           const std::vector<Buffer>& buffers) {
  std::vector<AgreedValue> v = {
      {"strategy", "'" + strategy_description(strategy) + "'"},
      {"gradient_accumulation_steps", std::to_string(accumulation)},
      {"mixed_precision", "'" + config::to_string(mixed_precision) + "'"},
  };
  for (auto& [what, value] : strategy_settings(strategy)) v.push_back({what, value});
  v.push_back({"number of parameters", std::to_string(params.size())});
  for (std::size_t i = 0; i < params.size(); ++i) {
    const ParamRef& p = params[i];
    const std::string name = "parameter '" + p.name + "'";
    v.push_back({"parameter " + std::to_string(i) + "'s name", "'" + p.name + "'"});
    v.push_back({name + " dtype", std::string(dtype_name(p.data.dtype))});
    v.push_back({name + " shape",
                 shape_text(p.shape.empty() ? std::vector<std::int64_t>{std::int64_t(p.data.count)}
                                            : p.shape)});
    v.push_back({name + " elements", std::to_string(p.data.count)});
    v.push_back({name + " device", p.data.device == DeviceKind::cuda ? "'cuda'" : "'cpu'"});
    v.push_back({name + " param group", std::to_string(p.group)});
  }
  v.push_back({"number of buffers", std::to_string(buffers.size())});
  for (std::size_t i = 0; i < buffers.size(); ++i) {
    const std::string name = "buffer " + std::to_string(i);
    v.push_back({name + " dtype", std::string(dtype_name(buffers[i].dtype))});
    v.push_back({name + " elements", std::to_string(buffers[i].count)});
  }
  return v;
}

// A built-in optimizer's type, param groups and their hyperparameters.
std::vector<AgreedValue> optimizer_agreement(const Optimizer& optimizer) {
  std::vector<AgreedValue> v = {{"optimizer", "'" + std::string(optimizer.name()) + "'"},
                                {"optimizer param groups", std::to_string(optimizer.num_groups())}};
  for (std::size_t g = 0; g < optimizer.num_groups(); ++g)
    for (const auto& [key, value] : optimizer.options(g))
      v.push_back({std::string(optimizer.name()) + " param group " + std::to_string(g) + " " + key,
                   exact_text(value)});
  return v;
}

}  // namespace

void Accelerator::make_hybrid_groups(const std::string& origin) {
  if (env_.world_size == 1) return;  // one shard group of one
  const int per_machine = env_.local_world_size, machines = env_.world_size / per_machine;
  const std::string where = origin + ": hybrid_shard: rank " + std::to_string(env_.rank) + ": ";
  if (env_.world_size % per_machine != 0 ||
      env_.rank != env_.node_rank * per_machine + env_.local_rank)
    throw ConfigError(where + "the ranks must be numbered machine by machine (RANK = NODE_RANK x " +
                      "LOCAL_WORLD_SIZE + LOCAL_RANK, as accel launch and torchrun do); here " +
                      "NODE_RANK " + std::to_string(env_.node_rank) + ", LOCAL_RANK " +
                      std::to_string(env_.local_rank) + ", LOCAL_WORLD_SIZE " +
                      std::to_string(per_machine) + ", WORLD_SIZE " +
                      std::to_string(env_.world_size));
  const std::string backend(comm().backend_name());
  if (backend == "nccl" || backend == "mpi")
    throw ConfigError(where + "runs over the CPU communicators with a rendezvous store (gloo, " +
                      "shm, hierarchical) for now, not " + backend);
  // Inside a machine shared memory where the world uses it; between machines Gloo.
  const std::string inside = backend == "hierarchical" ? "shm" : backend;
  const std::string across = backend == "hierarchical" ? "gloo" : backend;
  hybrid_shard_group_ = group_->subgroup(inside, env_.local_rank, per_machine,
                                         "hybrid_shard_machine" + std::to_string(env_.node_rank));
  hybrid_replica_group_ = group_->subgroup(
      across, env_.node_rank, machines, "hybrid_replicate_local" + std::to_string(env_.local_rank));
  strategy_options_.zero.shard_group = hybrid_shard_group_.get();
  strategy_options_.zero.replica_group = hybrid_replica_group_.get();
}

std::string prepared_name(const std::string& base, std::size_t model) {
  return model == 0 ? base : base + "_" + std::to_string(model);
}

Accelerator::Accelerator(AcceleratorOptions options) : options_(std::move(options)) {
  exit_cleanly_on_uncaught_errors(-1);  // a refusal below already ends the program cleanly
  const config::ResolvedConfig settings = resolve_settings(options_);
  // Before the loop's first step allocates; for CPU work, as `accel launch` does.
  if (!config::uses_gpu(settings.config)) tune_malloc_for_training();
  auto resolved = std::make_unique<config::Config>(settings.config);
  if (resolved->logging_dir.empty()) resolved->logging_dir = resolved->project_dir;
  config_ = std::move(resolved);
  own_trackers_ = options_.trackers;
  strategy_options_ = strategy_options_for(settings, options_);

  ProcessGroupOptions pg;
  if (options_.communicator) pg.backend = *options_.communicator;
  pg.timeout = options_.timeout;
  group_ = init_process_group(pg);
  env_ = group_->env();
  exit_cleanly_on_uncaught_errors(env_.rank);
  rng_ = rank_rng(seed_, env_.rank);
  if (settings.config.hybrid_shard) make_hybrid_groups(settings.origins.at("hybrid_shard"));
  if (config_->global_batch_size % env_.world_size != 0)
    throw ConfigError(settings.origins.at("global_batch_size") + ": global_batch_size " +
                      std::to_string(config_->global_batch_size) + " does not divide over " +
                      std::to_string(env_.world_size) +
                      " processes (each would draw a fraction of a sample per step); choose a "
                      "multiple of every number of processes the job may run at");
  if (config_->mixed_precision == config::MixedPrecision::fp16) {
    scaler_ = std::make_unique<DynamicLossScaler>(options_.loss_scaler);
    register_state(
        "scaler", [this] { return scaler_->save(); },
        [this](const std::string& bytes) { scaler_->load(bytes); });
  }
}

Accelerator::~Accelerator() {
  try {
    trackers_.finish();  // no wait for the other ranks here: they may be gone
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: ending the trackers: %s\n", e.what());
  }
}

void Accelerator::init_trackers(const std::string& project_name, const TrackerConfig& config) {
  ACCEL_CHECK_ARG(!project_name.empty() && project_name.find('/') == std::string::npos,
                  "init_trackers: the project name '" + project_name +
                      "' must be a non-empty file name (no '/')");
  trackers_.init(is_main_process(), config::log_with_names(config_->log_with),
                 config_->logging_dir + "/" + project_name, own_trackers_, config);
}

void Accelerator::log(const TrackerValues& values, std::int64_t step) {
  trackers_.log(values, step);
  // The open progress bar shows the last logged loss.
  if (const auto bar = progress_.lock())
    for (const auto& [name, value] : values)
      if (name.size() >= 4 && name.compare(name.size() - 4, 4, "loss") == 0) {
        char text[64];
        std::snprintf(text, sizeof text, " %.4g", value);
        bar->set_postfix(name + text);
      }
}

ProgressBarOptions Accelerator::progress_bar_options() const {
  ProgressBarOptions options;
  options.enabled = is_main_process() && !config_->disable_progress_bar;
  return options;
}

void Accelerator::end_training() {
  trackers_.finish();
  wait_for_everyone();
}

// The config's values, read where they are kept.
int Accelerator::gradient_accumulation_steps() const {
  return config_->gradient_accumulation_steps;
}
std::string Accelerator::mixed_precision() const {
  return config::to_string(config_->mixed_precision);
}
config::MixedPrecision Accelerator::precision() const { return config_->mixed_precision; }
bool Accelerator::activation_checkpointing() const { return config_->activation_checkpointing; }
config::AutoWrapPolicy Accelerator::auto_wrap_policy() const { return config_->auto_wrap_policy; }
config::StateDictType Accelerator::state_dict_type() const { return config_->state_dict_type; }
pipeline::PipelineOptions Accelerator::pipeline_options() const {
  return {.pipeline_parallel_size = config_->pipeline_parallel_size,
          .num_microbatches = config_->num_microbatches,
          .pipeline_schedule = pipeline::parse_schedule(config_->pipeline_schedule),
          .pipeline_chunks = config_->pipeline_chunks,
          .partition_method = pipeline::parse_partition_method(config_->partition_method)};
}
const std::string& Accelerator::project_dir() const { return config_->project_dir; }
const std::string& Accelerator::logging_dir() const { return config_->logging_dir; }
std::size_t Accelerator::batch_size_for(std::size_t requested) const {
  const auto global = std::size_t(config_->global_batch_size);
  return global > 0 ? global / std::size_t(num_processes()) : requested;
}

DeviceKind Accelerator::device() const {
  return replica_cuda_device(0) >= 0 ? DeviceKind::cuda : group_->comm().device();
}

int Accelerator::cuda_device() const {
  if (replica_cuda_device(0) >= 0) return replica_cuda_device(0);
  const Communicator& c = group_->comm();
  if (c.device() == DeviceKind::cuda) return c.cuda_device();
  return config::uses_gpu(*config_) ? env_.local_rank
                                    : -1;  // the world of one before prepare: LOCAL_RANK's GPU
}

int Accelerator::replica_cuda_device(int replica) const {
  // Set only under DATA_PARALLEL on GPUs.
  const DataParallelOptions& dp = strategy_options_.data_parallel;
  if (dp.cuda_devices.empty()) return -1;
  return dp.cuda_devices[std::size_t(replica)];
}

Communicator& Accelerator::comm() { return group_->comm(); }

CommunicatorPtr Accelerator::new_group(const std::vector<int>& ranks, const std::string& name) {
  const auto mine = std::find(ranks.begin(), ranks.end(), env_.rank);
  ACCEL_CHECK_ARG(mine != ranks.end(), "new_group '" + name + "': rank " +
                                           std::to_string(env_.rank) + " is not one of its ranks");
  const std::string backend(comm().backend_name());
  ACCEL_CHECK_ARG(backend != "nccl" && backend != "mpi",
                  "new_group '" + name +
                      "': groups of some ranks run over the CPU communicators "
                      "with a rendezvous store (gloo, shm, hierarchical) for now, not " +
                      backend);
  return group_->subgroup(backend == "hierarchical" ? "gloo" : backend, int(mine - ranks.begin()),
                          int(ranks.size()), name);
}

namespace {
constexpr const char* kFirstFailureKey = "accel/first_failure";
}

void Accelerator::post_failure(const std::string& what) noexcept {
  const StorePtr& store = group_->store();
  if (!store) return;
  try {
    store->compare_set(kFirstFailureKey, "", what);
  } catch (const std::exception&) {
    // The store's host may be gone with the failure; the caller's own error still stands.
  }
}

std::string Accelerator::first_failure() noexcept {
  const StorePtr& store = group_->store();
  if (!store) return "";
  try {
    if (store->check({kFirstFailureKey})) return store->get(kFirstFailureKey);
  } catch (const std::exception&) {
  }
  return "";
}

void Accelerator::set_cuda_stream(DeviceStream stream) { comm().set_compute_stream(stream); }

void Accelerator::check_can_prepare_another() const {
  ACCEL_CHECK_ARG(config_->pipeline_parallel_size == 1,
                  "prepare: the config asks for a pipeline (pipeline_parallel_size " +
                      std::to_string(config_->pipeline_parallel_size) +
                      "); build an accel::TorchPipeline from the model instead of preparing it");
  ACCEL_CHECK_ARG(models_.empty() || strategy_options_.kind != StrategyKind::data_parallel,
                  "prepare: DATA_PARALLEL replicates one model per accelerator, and one is "
                  "prepared already; for several models (a GAN) use MULTI_CPU or ZERO");
}

std::size_t Accelerator::prepare_parameters(std::vector<ParamRef> params,
                                            std::vector<Buffer> buffers) {
  check_can_prepare_another();
  ACCEL_CHECK_ARG(int(strategy_options_.data_parallel.replica_params.size()) + 1 ==
                      strategy_options_.data_parallel.replicas,
                  "prepare: DATA_PARALLEL with " +
                      std::to_string(strategy_options_.data_parallel.replicas) +
                      " replicas needs copies of the model: prepare(model, params_of, optimizer) "
                      "(raw API) or the LibTorch adapter's prepare(model, optimizer), not "
                      "prepare(params, ...)");
  const std::size_t index = models_.size();
  // Before any collective shaped by these values (a rank that differs would pair a broadcast
  // of other sizes): every rank learns the verdict.
  std::vector<AgreedValue> agree =
      prepare_agreement(strategy_options_, config_->gradient_accumulation_steps,
                        config_->mixed_precision, params, buffers);
  agree.insert(agree.end(), prepare_agreement_.begin(), prepare_agreement_.end());
  prepare_agreement_.clear();
  if (index > 0)
    for (AgreedValue& v : agree) v.what = prepared_name("model", index) + ": " + v.what;
  check_ranks_agree(comm(), agree, "prepare: ranks differ");
  auto model = std::make_unique<PreparedParameters>();
  model->index = index;
  model->params = params;  // views, kept for save_state / load_state
  model->buffers = buffers;
  // The world of one works where the parameters are (replica 0's GPU under DataParallel).
  if (auto* local = dynamic_cast<LocalCommunicator*>(&comm());
      local != nullptr && !params.empty() && params[0].data.device == DeviceKind::cuda)
    local->use_cuda_device(replica_cuda_device(0) >= 0 ? replica_cuda_device(0)
                                                       : current_cuda_device());
  model->strategy = make_strategy(comm(), std::move(params), std::move(buffers), strategy_options_);
  model->strategy->prepare();
  models_.push_back(std::move(model));
  apply_sync_state();
  return index;
}

std::size_t Accelerator::prepare(std::vector<ParamRef> params, Optimizer& optimizer,
                                 std::vector<Buffer> buffers) {
  for (const ParamRef& p : params)
    ACCEL_CHECK_ARG(p.group < optimizer.num_groups(),
                    "prepare: parameter '" + p.name + "' is in param group " +
                        std::to_string(p.group) + ", the " + std::string(optimizer.name()) +
                        " optimizer has " + std::to_string(optimizer.num_groups()));
  agree_at_prepare(optimizer_agreement(optimizer));
  const std::size_t index = prepare_parameters(std::move(params), std::move(buffers));
  models_[index]->optimizer = &optimizer;
  // save_state / load_state keep its state (optimizer_state.hpp)
  register_optimizer_state(
      index, [&optimizer] { return optimizer.save_state(); },
      [&optimizer](const std::string& bytes, const std::string&) -> std::function<void()> {
        return [&optimizer, bytes] { optimizer.load_state(bytes); };  // sizes: resharded to fit
      });
  return index;
}

void Accelerator::keep_replicas(std::size_t model, std::unique_ptr<ReplicatedModel> replicas) {
  models_.at(model)->replicas = std::move(replicas);
}

ReplicatedModel* Accelerator::replicas_of(std::size_t model) const {
  return model < models_.size() ? models_[model]->replicas.get() : nullptr;
}

std::size_t Accelerator::model_index_of(const void* model) const {
  for (const auto& m : models_)
    if (m->replicas != nullptr && m->replicas->model() == model) return m->index;
  ACCEL_CHECK_ARG(models_.size() <= 1,
                  "forward_backward: with several prepared models the model must be one given "
                  "to prepare(model, params_of, optimizer)");
  return 0;
}

void Accelerator::optimizer_step() {
  const bool any = std::any_of(models_.begin(), models_.end(),
                               [](const auto& m) { return m->optimizer != nullptr; });
  ACCEL_CHECK_ARG(any, "optimizer_step: no optimizer prepared (prepare(params, optimizer))");
  for (std::size_t m = 0; m < models_.size(); ++m)
    if (models_[m]->optimizer != nullptr) optimizer_step(m);
}

void Accelerator::optimizer_step(std::size_t model) {
  Strategy& s = strategy(model);
  Optimizer* optimizer = models_[model]->optimizer;
  ACCEL_CHECK_ARG(optimizer != nullptr, "optimizer_step: " + prepared_name("model", model) +
                                            " has no optimizer (prepare(params, optimizer))");
  optimizer->step(s.segments(), compute_context(comm()));  // kernels on the compute stream
  s.after_optimizer_step();
}

int Accelerator::data_parallel_replicas() const {
  return strategy_options_.data_parallel.replicas;  // 1 unless DATA_PARALLEL set it
}

Strategy& Accelerator::strategy(std::size_t model) {
  ACCEL_CHECK_ARG(!models_.empty(), "no parameters prepared yet (prepare_parameters)");
  ACCEL_CHECK_ARG(model < models_.size(), "no model " + std::to_string(model) + " prepared (" +
                                              std::to_string(models_.size()) + " are)");
  return *models_[model]->strategy;
}

bool Accelerator::is_accumulation_boundary() const {
  return last_batch_ || micro_since_sync_ + 1 >= config_->gradient_accumulation_steps;
}

void Accelerator::begin_batch(std::size_t batch_index, std::size_t num_batches) {
  last_batch_ = batch_index + 1 >= num_batches;
  batch_in_flight_ = {batch_index, num_batches};
  in_batch_again_ = false;
  batch_boundary_ = is_accumulation_boundary();
  apply_sync_state();
}

bool Accelerator::next_micro_batch_syncs() const {
  return in_batch_again_ ? batch_boundary_ : is_accumulation_boundary();
}

void Accelerator::apply_sync_state() {
  const bool sync = next_micro_batch_syncs();
  for (auto& m : models_) m->strategy->set_sync_enabled(sync && !m->no_sync);
}

Accelerator::NoSync::NoSync(Accelerator& accelerator, std::size_t model)
    : accelerator_(accelerator), model_(model) {
  accelerator_.strategy(model_);  // throws naming a model that is not there
  PreparedParameters& m = *accelerator_.models_[model_];
  ACCEL_CHECK_ARG(!m.no_sync,
                  "no_sync: " + prepared_name("model", model_) + " is under no_sync already");
  m.no_sync = true;
  accelerator_.apply_sync_state();
}

Accelerator::NoSync::~NoSync() {
  accelerator_.models_[model_]->no_sync = false;
  accelerator_.apply_sync_state();
}

Accelerator::NoSync Accelerator::no_sync(std::size_t model) { return NoSync(*this, model); }

Accelerator::GatheredParameters::GatheredParameters(Strategy& strategy, std::size_t unit,
                                                    UnitPass pass)
    : strategy_(&strategy), unit_(unit), pass_(pass) {
  strategy_->gather_unit(unit_, pass_);
}

Accelerator::GatheredParameters::GatheredParameters(GatheredParameters&& other) noexcept
    : strategy_(std::exchange(other.strategy_, nullptr)), unit_(other.unit_), pass_(other.pass_) {}

// Releasing what this guard gathered cannot fail (release_unit throws only for a unit that is
// not gathered); a destructor must not throw.
Accelerator::GatheredParameters::~GatheredParameters() {
  if (strategy_ == nullptr) return;
  try {
    strategy_->release_unit(unit_, pass_);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
  }
}

Accelerator::GatheredParameters Accelerator::gather_parameters(std::size_t unit, UnitPass pass,
                                                               std::size_t model) {
  return GatheredParameters(strategy(model), unit, pass);
}

void Accelerator::grad_ready(std::size_t model, std::size_t index) {
  strategy(model).grad_ready(index);
  models_[model]->reported = true;
}

float Accelerator::loss_scale() const {
  const double scale = scaler_ ? scaler_->scale() : 1.0;
  return float(scale / double(config_->gradient_accumulation_steps));
}

std::vector<std::size_t> Accelerator::models_to_sync() const {
  std::vector<std::size_t> out;
  for (const auto& m : models_)
    if (m->reported && !m->no_sync) out.push_back(m->index);
  const bool any_reported =
      std::any_of(models_.begin(), models_.end(), [](const auto& m) { return m->reported; });
  if (!any_reported)
    for (const auto& m : models_)
      if (!m->no_sync) out.push_back(m->index);
  return out;
}

bool Accelerator::sync_gradients() {
  ACCEL_CHECK_ARG(!models_.empty(), "sync_gradients: no parameters prepared yet");
  // A further backward of begin_batch's batch (a GAN's second loss) belongs to the same
  // micro-batch: it syncs as the first did and advances nothing.
  const bool again = in_batch_again_;
  const bool boundary = again ? batch_boundary_ : is_accumulation_boundary();
  step_skipped_ = false;
  const std::vector<std::size_t> models = models_to_sync();
  // Every micro-batch: the strategies do nothing while sync is off.
  for (std::size_t m : models) models_[m]->strategy->sync_gradients();
  for (auto& m : models_) m->reported = false;
  if (boundary && scaler_) {
    const double scale = scaler_->scale();  // the one this step's losses were scaled by
    step_skipped_ = !scaler_->update(comm(), unscale_gradients(scale, models));
    if (step_skipped_) discard_gradients(models);
  }
  if (!again) {
    if (boundary && !step_skipped_) ++optimizer_steps_;
    micro_since_sync_ = boundary ? 0 : micro_since_sync_ + 1;
    last_batch_ = false;
  }
  if (batch_in_flight_) {  // this batch is done: a checkpoint now resumes at the next one
    const auto [index, count] = *batch_in_flight_;
    batch_in_flight_.reset();
    in_batch_again_ = true;
    next_batch_ = index + 1;
    if (next_batch_ >= count) {
      ++epoch_;
      next_batch_ = 0;
    }
  }
  apply_sync_state();  // for the next micro-batch's hooks (the same batch's syncs alike)
  return boundary && !step_skipped_;
}

bool Accelerator::unscale_gradients(double scale, const std::vector<std::size_t>& models) {
  // What the optimizer reads: every full gradient under DDP, this rank's slices under ZeRO
  // (each rank checks its own; the scaler agrees across ranks).
  std::vector<Buffer> grads;
  for (std::size_t m : models)
    for (const ParamSegment& seg : strategy(m).segments()) grads.push_back(seg.grad);
  // CPU loops or CUDA kernels (on the compute stream), per buffer
  return accel::unscale_gradients(grads, scale, compute_context(comm()));
}

void Accelerator::discard_gradients(const std::vector<std::size_t>& models) {
  // The synchronised gradients and the loop's own buffers (where ZeRO's differ from them).
  const DeviceContext ctx = compute_context(comm());
  for (std::size_t m : models) {
    for (const ParamSegment& seg : strategy(m).segments()) fill_zero(seg.grad, ctx);
    for (const ParamRef& p : strategy(m).params()) fill_zero(p.grad, ctx);
  }
}

double Accelerator::clip_grad_norm(double max_norm) {
  ACCEL_CHECK_ARG(models_.size() <= 1,
                  "clip_grad_norm(max_norm): " + std::to_string(models_.size()) +
                      " models are prepared; name the one to clip: clip_grad_norm(model, "
                      "max_norm)");
  return clip_grad_norm(0, max_norm);
}

double Accelerator::clip_grad_norm(std::size_t model, double max_norm) {
  return accel::clip_grad_norm(strategy(model), comm(), max_norm);
}

ShardedSampler Accelerator::make_sampler(std::size_t size, SamplerOptions options) {
  if (options.seed == 0) options.seed = seed_;
  options.batch_size = batch_size_for(options.batch_size);
  // Ranks that disagree here would deal overlapping shards or different batch counts (and
  // wait in a collective for a batch another rank lacks).
  check_ranks_agree(comm(),
                    {{"the sampler's dataset size", std::to_string(size)},
                     {"the sampler's batch_size", std::to_string(options.batch_size)},
                     {"the sampler's seed", std::to_string(options.seed)},
                     {"the sampler's shuffle", options.shuffle ? "true" : "false"},
                     {"the sampler's drop_last", options.drop_last ? "true" : "false"},
                     {"the sampler's even_batches", options.even_batches ? "true" : "false"}},
                    "make_sampler: ranks differ");
  return ShardedSampler(size, num_processes(), process_index(), options);
}

void Accelerator::reduce(Buffer data, ReduceOp op) { all_reduce_values(comm(), data, op); }

void Accelerator::broadcast(Buffer data, int root) { broadcast_values(comm(), data, root); }

std::vector<float> Accelerator::gather(const std::vector<float>& local) {
  return gather_values(comm(), local);
}
std::vector<std::int64_t> Accelerator::gather(const std::vector<std::int64_t>& local) {
  return gather_values(comm(), local);
}

std::vector<float> Accelerator::gather_for_metrics(const std::vector<float>& local,
                                                   const ShardedSampler& sampler,
                                                   std::size_t batch_index) {
  return drop_padding(gather(local), sampler, batch_index);
}
std::vector<std::int64_t> Accelerator::gather_for_metrics(const std::vector<std::int64_t>& local,
                                                          const ShardedSampler& sampler,
                                                          std::size_t batch_index) {
  return drop_padding(gather(local), sampler, batch_index);
}

std::vector<float> Accelerator::pad_across_processes(std::vector<float> local, float pad) {
  std::int64_t longest = std::int64_t(local.size());
  all_reduce_values(comm(), buffer_of(std::span(&longest, 1)), ReduceOp::max);
  local.resize(std::size_t(longest), pad);
  return local;
}

void Accelerator::wait_for_everyone() { comm().barrier()->wait(); }

void Accelerator::main_process_first(const std::function<void()>& fn) {
  if (is_main_process()) fn();
  wait_for_everyone();
  if (!is_main_process()) fn();
}

std::pair<std::size_t, std::size_t> Accelerator::split_between_processes(std::size_t n) const {
  const Shard s = shard_of(n, num_processes(), process_index());
  return {s.offset, s.offset + s.count};
}

void Accelerator::set_seed(std::uint64_t seed, bool device_specific) {
  // Rank 0's seed is everyone's: a seed drawn from a clock on each rank would diverge.
  std::uint64_t value = seed;
  broadcast(Buffer{&value, 1, DType::i64, DeviceKind::cpu});
  seed_ = value;
  rng_ = rank_rng(seed_, process_index());
  seed_generators(device_specific ? seed_ + std::uint64_t(process_index()) : seed_);
}

bool Accelerator::check_trigger() {
  // max over ranks: 1 as soon as any rank set it, the same answer everywhere.
  std::int64_t flag = trigger_ ? 1 : 0;
  all_reduce_values(comm(), buffer_of(std::span(&flag, 1)), ReduceOp::max);
  if (flag == 0) return false;
  trigger_ = false;
  return true;
}

void Accelerator::set_epoch(std::uint64_t epoch) {
  if (epoch == epoch_) return;  // keeps a resumed mid-epoch position
  epoch_ = epoch;
  next_batch_ = 0;
}

}  // namespace accel
