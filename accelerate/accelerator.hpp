#pragma once
// The front end a training loop talks to (Hugging Face Accelerate's Accelerator), framework-
// free: parameters and gradients are typed buffer views. The LibTorch adapter
// (accelerate/torch/) builds on it; a hand-written loop uses it directly (the raw API):
//
// A sketch (examples/raw_mlp/ is a whole program):
//   accel::Accelerator acc;                                // process state, config, comm
//   accel::AdamW optimizer({.lr = 1e-3});                  // built in: backends/optim/
//   acc.prepare(model, params_of, optimizer);              // strategy chosen by the config
//   for (each batch of acc's shard) {
//     acc.forward_backward(model, rows, [&](Model& m, size_t first, size_t n, auto ready) {
//       return m.forward_backward(rows first..first+n, acc.loss_scale(), ready);  // mean loss
//     });
//     if (acc.sync_gradients()) {                          // false between accumulation steps
//       acc.clip_grad_norm(1.0);
//       acc.optimizer_step(); zero_grad();
//     }
//   }
//
// The same loop runs under DDP, ZeRO (distributed_type ZERO, zero_stage 1, 2 or 3: at 3 with
// each unit's forward and backward inside acc.gather_parameters) and
// DataParallel (DATA_PARALLEL: replicas of the model on threads of this one process, each on
// its own GPU of gpu_ids or, with use_cpu, on the CPU; the batch split between them by
// forward_backward): the optimizer steps what the strategy hands
// it (every parameter, this rank's slices, or replica 0's) and the strategy finishes the step
// (ZeRO all-gathers, DataParallel copies replica 0 to the others).
//
// Checkpoints (save_state / load_state, see "Checkpoints" below): parameters, counters, the
// loop's position, the seed, the RNG and every registered state, written atomically.
//
// Settings: a value given in AcceleratorOptions wins over the environment (ACCEL_*, set by
// `accel launch`), which wins over the config file, which wins over the detected default.

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "accelerate/checkpointing/checkpoint.hpp"
#include "accelerate/checkpointing/optimizer_state.hpp"
#include "accelerate/data/sharded_sampler.hpp"
#include "accelerate/loss_scaler.hpp"
#include "accelerate/pipeline/pipeline_options.hpp"
#include "accelerate/print.hpp"
#include "accelerate/process/process_env.hpp"
#include "accelerate/process/rank_agreement.hpp"
#include "accelerate/progress_bar.hpp"
#include "accelerate/progress_range.hpp"
#include "accelerate/replicated_model.hpp"
#include "accelerate/trackers/tracker_set.hpp"
#include "backends/backend.hpp"
#include "backends/comm/communicator.hpp"
#include "backends/optim/optimizer.hpp"
#include "foundation/device_memory.hpp"
#include "foundation/error.hpp"
#include "foundation/reduce.hpp"

namespace accel::config {
struct Config;              // config/config.hpp
enum class MixedPrecision;  // config/config.hpp
enum class AutoWrapPolicy;  // config/config.hpp
enum class StateDictType;   // config/config.hpp
}  // namespace accel::config

namespace accel {

class ProcessGroup;
struct FullParameters;      // accelerate/checkpointing/parameter_layout.hpp
struct TensorNames;         // accelerate/checkpointing/parameter_layout.hpp
struct PreparedParameters;  // accelerate/prepared_parameters.hpp: one prepared model

// A checkpoint name of the model prepared `model`-th (0-based), as Accelerate numbers its
// files: the first keeps `base` ("model"), the next ones get "_1", "_2" ("model_1").
std::string prepared_name(const std::string& base, std::size_t model);

// Whose copy of a registered state a checkpoint keeps.
enum class StateScope {
  shared,    // equal on every rank (DDP's optimizer state): rank 0 saves it, every rank loads it
  per_rank,  // differs per rank (a shard, a per-rank RNG): each rank saves and loads its own
};

// The config keys a program may also set in code, as AcceleratorOptions fields of the key's
// name: the top layer over the config file, the flags and the environment
// (config/resolve.hpp). The schema (config/config.cpp's KeySpec) says what each key means and
// which values it takes; this list is the only other place a key is named.
#define ACCEL_CONFIG_KEYS_IN_CODE(X)                                                   \
  X(int, gradient_accumulation_steps)                                                  \
  X(std::string, mixed_precision)  /* "no", "fp16", "bf16" */                          \
  X(std::string, distributed_type) /* "MULTI_CPU", "ZERO", ... */                      \
  X(int, zero_stage)               /* 1, 2 or 3 with ZERO */                           \
  X(int, data_parallel_replicas)   /* DATA_PARALLEL on the CPU; 0 = cores */           \
  X(int, zero3_param_persistence_threshold)                                            \
  X(bool, reshard_after_forward)                                                       \
  X(bool, activation_checkpointing) /* LibTorch: Sequential children */                \
  X(std::string, auto_wrap_policy)  /* TRANSFORMER_BASED_WRAP, NO_WRAP */              \
  X(bool, hybrid_shard)             /* ZERO within each machine */                     \
  X(std::string, state_dict_type)   /* FULL_STATE_DICT, SHARDED_STATE_DICT */          \
  X(std::string, log_with)          /* "tensorboard,csv", "all", ... */                \
  X(std::string, project_dir)                                                          \
  X(std::string, logging_dir)                                                          \
  X(bool, automatic_checkpoint_naming) /* save_state() / load_state() without a dir */ \
  X(int, total_limit)                  /* the newest N named checkpoints (0: all) */   \
  X(bool, disable_progress_bar)        /* progress() draws nothing */                  \
  X(bool, save_on_each_node)           /* a checkpoint copy on every machine */        \
  X(int, global_batch_size)            /* samplers' batch = this / processes */

struct AcceleratorOptions {
#define ACCEL_OPTIONS_FIELD(type, key) std::optional<type> key;
  ACCEL_CONFIG_KEYS_IN_CODE(ACCEL_OPTIONS_FIELD)
#undef ACCEL_OPTIONS_FIELD
  std::optional<std::string> communicator;  // "auto", "gloo", "mpi", "nccl", "shm", "local", ...
  std::optional<Milliseconds> timeout;      // every collective, and joining
  std::optional<std::string> config_file;   // else ACCEL_CONFIG_FILE / default path
  // The loop's own sinks (Accelerate's GeneralTracker instances in log_with), started with the
  // named ones by init_trackers.
  std::vector<std::shared_ptr<GeneralTracker>> trackers;
  DdpOptions ddp;
  // Its stage, param_persistence_threshold and reshard_after_forward come from the config keys
  // (the fields above).
  ZeroOptions zero;
  LossScalerOptions loss_scaler;  // mixed_precision fp16 only
};

class Accelerator {
 public:
  explicit Accelerator(AcceleratorOptions options = {});
  virtual ~Accelerator();
  Accelerator(const Accelerator&) = delete;
  Accelerator& operator=(const Accelerator&) = delete;

  // ---- process state
  int process_index() const { return env_.rank; }
  int local_process_index() const { return env_.local_rank; }
  int num_processes() const { return env_.world_size; }
  bool is_main_process() const { return env_.rank == 0; }
  bool is_local_main_process() const { return env_.local_rank == 0; }
  // Where the prepared parameters must live: CPU memory, or CUDA memory under the NCCL
  // communicator and under DATA_PARALLEL on GPUs.
  DeviceKind device() const;
  // The GPU the loop's model goes on (make it current, cudaSetDevice(acc.cuda_device()), before
  // allocating the model): the NCCL communicator's (LOCAL_RANK's of the visible GPUs), or
  // under DATA_PARALLEL on GPUs replica 0's; -1 on the CPU.
  int cuda_device() const;
  const ProcessEnv& process_env() const { return env_; }
  int gradient_accumulation_steps() const;
  // The config's mixed_precision: "no", "fp16" or "bf16" as text, and as the enum
  // (config/config.hpp, not installed: for the front ends).
  std::string mixed_precision() const;
  config::MixedPrecision precision() const;
  // The config's activation_checkpointing (LibTorch: a prepared Sequential's children and
  // ShardedUnit blocks).
  bool activation_checkpointing() const;
  // The config's auto_wrap_policy (LibTorch under zero_stage 3: TRANSFORMER_BASED_WRAP, NO_WRAP).
  config::AutoWrapPolicy auto_wrap_policy() const;
  // The config's state_dict_type (LibTorch checkpoints: FULL_STATE_DICT, SHARDED_STATE_DICT).
  config::StateDictType state_dict_type() const;
  // The config's pipeline keys (pipeline_parallel_size, num_microbatches, pipeline_schedule,
  // pipeline_chunks, partition_method): what a TorchPipeline built without options runs.
  pipeline::PipelineOptions pipeline_options() const;
  Communicator& comm();
  // A communicator among some of the ranks (torch.distributed.new_group): `ranks` in the order
  // that numbers them in it (this rank must be one), made by every member under the same
  // `name` (collective among them, within the timeout). Over the world's CPU communicator
  // (gloo, shm; gloo for hierarchical); refused under mpi and nccl for now, naming them.
  // For a strategy of several axes (a pipeline's neighbours, a stage's replicas).
  CommunicatorPtr new_group(const std::vector<int>& ranks, const std::string& name);
  // The job's first failure as the rank that hit it worded it (torchrun's error file, kept in
  // the rendezvous store): a strategy whose ranks wait on each other posts what stopped it, so
  // a rank that then loses its peer can say why. The first post wins; first_failure() is ""
  // when none was posted or there is no store (mpi). Neither throws.
  void post_failure(const std::string& what) noexcept;
  std::string first_failure() noexcept;
  // The CUDA stream (a cudaStream_t) the loop computes on, when its buffers live on a GPU
  // (NCCL); default: the legacy default stream. The strategies copy gradients and order the
  // collectives against it, so the host does not wait for the GPU per bucket (the contract:
  // backends/comm/communicator.hpp, "Device buffers and streams"). Set it before
  // prepare_parameters; it is the communicator's setting.
  void set_cuda_stream(DeviceStream stream);

  // ---- the raw API: a loop's own parameter and gradient buffers
  // Chooses the strategy (the config's: DDP, or ZeRO with distributed_type ZERO; the world of
  // one runs the same code), makes every rank start from rank 0's parameters and buffers.
  // First every rank checks that all ranks have the same strategy, accumulation, mixed
  // precision, parameters (count, names, dtypes, shapes, groups), buffers and optimizer
  // options; if not, every rank throws RankMismatchError naming a rank and the value.
  // Several models (a GAN's generator and discriminator): each call prepares one more, with a
  // strategy (buckets, shards) of its own, and returns its index (0, 1, ...), the `model`
  // argument of the calls below; the calls without it mean model 0. DATA_PARALLEL takes one.
  std::size_t prepare_parameters(std::vector<ParamRef> params, std::vector<Buffer> buffers = {});
  // prepare_parameters plus a built-in optimizer (accel::Sgd, accel::AdamW; ParamRef::group
  // picks its param group): optimizer_step() then steps it on what this rank updates, and its
  // state is saved in checkpoints ("optimizer": one blob under DDP, each rank's slices under
  // ZeRO) and loads under another world size or strategy
  // (accelerate/checkpointing/optimizer_state.hpp).
  std::size_t prepare(std::vector<ParamRef> params, Optimizer& optimizer,
                      std::vector<Buffer> buffers = {});
  // At an accumulation boundary (sync_gradients() returned true), after any clipping: steps
  // every prepared optimizer (or the one of `model`), then lets its strategy finish the step
  // (ZeRO: all-gather).
  void optimizer_step();
  void optimizer_step(std::size_t model);
  Strategy& strategy(std::size_t model = 0);
  std::size_t num_models() const { return models_.size(); }
  // What the config chose: StrategyKind ddp, zero (with the ZeRO stage) or data_parallel
  // (with the replica count).
  const StrategyOptions& strategy_options() const { return strategy_options_; }

  // ---- a model the strategy may replicate (the raw API's way to run under DataParallel too)
  // Reports parameter i's gradient final during a backward: the Accelerator's grad_ready
  // (DDP/ZeRO start communicating), or nothing inside a DataParallel replica.
  class GradReady {
   public:
    void operator()(std::size_t index) const {
      if (accelerator_ != nullptr) accelerator_->grad_ready(model_, index);
    }

   private:
    friend class Accelerator;
    GradReady(Accelerator* accelerator, std::size_t model)
        : accelerator_(accelerator), model_(model) {}
    Accelerator* accelerator_;
    std::size_t model_;
  };
  // prepare(params_of(model), optimizer), and under DATA_PARALLEL also K-1 copies of the model
  // (copy-constructed now, kept in a ModelReplicas: accelerate/replicated_model.hpp) whose
  // parameters params_of gives the strategy. On GPUs copy k is constructed with replica k's device
  // current, so a copy constructor that allocates with cudaMalloc and copies with
  // cudaMemcpy(..., cudaMemcpyDefault) puts the replica on its GPU.
  // params_of(Model&) -> std::vector<ParamRef>, the same parameters in the same order for
  // every copy.
  template <typename Model, typename ParamsOf>
  requires std::copy_constructible<Model> &&
      std::is_invocable_r_v<std::vector<ParamRef>, ParamsOf&, Model&>
          std::size_t prepare(Model& model, ParamsOf params_of, Optimizer& optimizer) {
    check_can_prepare_another();  // before copying the model
    auto replicas =
        std::make_unique<ModelReplicas<Model>>(model, params_of, strategy_options_.data_parallel);
    const std::size_t index = prepare(params_of(model), optimizer);
    keep_replicas(index, std::move(replicas));
    return index;
  }
  // One micro-batch's forward and backward over `rows` rows, through
  //   fn(Model& replica, size_t first_row, size_t row_count, GradReady ready) -> float
  // which computes the mean loss over rows [first_row, first_row + row_count), ADDS the
  // gradients of (that mean loss x loss_scale()) to the replica's gradient buffers, calls
  // ready(i) when parameter i's gradient is final, and returns the mean loss. Under DDP, ZeRO
  // or one process fn runs once on `model` over all rows. Under DATA_PARALLEL the rows are
  // split in contiguous chunks (torch.chunk's rule: chunk_rows), fn runs on replica k in
  // worker thread k (with replica k's GPU current), and the reduction weights replica k's
  // gradient by its share of the rows, so sync_gradients() leaves the gradient of the whole
  // batch's mean loss. Returns the mean loss over all rows.
  // With several models, `model` must be one given to prepare(model, params_of, optimizer).
  template <typename Model, typename Fn>
  float forward_backward(Model& model, std::size_t rows, Fn&& fn) {
    const std::size_t index = model_index_of(&model);
    ReplicaSet* dp = strategy(index).replicas();
    if (dp == nullptr) return float(fn(model, std::size_t{0}, rows, GradReady(this, index)));
    ReplicatedModel* replicas = replicas_of(index);
    ACCEL_CHECK_ARG(replicas != nullptr && static_cast<const void*>(&model) == replicas->model(),
                    "forward_backward: under DATA_PARALLEL the model must be the one given to "
                    "prepare(model, params_of, optimizer)");
    return static_cast<ModelReplicas<Model>&>(*replicas).forward_backward(
        *dp, rows, fn, GradReady(nullptr, index));
  }
  // The replica count under DATA_PARALLEL (data_parallel_replicas, 0 resolved to the cores);
  // 1 otherwise.
  int data_parallel_replicas() const;
  // Replica k's GPU under DATA_PARALLEL on GPUs, else -1.
  int replica_cuda_device(int replica) const;

  // Multiply the loss (or the gradient of the mean loss) by this: 1 / accumulation steps,
  // times the dynamic loss scale under mixed_precision fp16.
  float loss_scale() const;
  // Where the loop is in its data, before each batch's forward: the last batch of an epoch
  // always ends in a sync, and accumulation counts restart with the next epoch (Accelerate's
  // sync_with_dataloader). Without it, a sync happens every gradient_accumulation_steps.
  void begin_batch(std::size_t batch_index, std::size_t num_batches);
  // From the backward pass: parameter `index`'s gradient (of model 0, or of `model`) is final
  // for this micro-batch.
  void grad_ready(std::size_t index) { grad_ready(0, index); }
  void grad_ready(std::size_t model, std::size_t index);
  // After each micro-batch's backward. Returns true at an accumulation boundary, once the
  // gradients are synchronised: the optimizer steps then. Between boundaries gradients only
  // accumulate locally (no communication) and it returns false. Under mixed_precision fp16
  // the gradients are also unscaled at the boundary; when any rank's overflowed, the step is
  // skipped on every rank: the gradients are zeroed, the scale backs off, it returns false and
  // optimizer_step_was_skipped() is true.
  // Several models: the ones this backward reached (any grad_ready since the last sync) are
  // synchronised, as PyTorch's DDP reduces a module whose backward ran (every model when none
  // reported); the others keep their gradients and do not communicate. A backward through
  // two models (a generator's loss through the discriminator) syncs both. Ranks must reach
  // the same models (the same graph): a model only some ranks reached fails the collective
  // after the timeout, naming the ranks not heard from.
  // Several backwards of one batch (begin_batch, as the data loaders call it): the batch is
  // one micro-batch; every backward of it syncs or accumulates alike.
  bool sync_gradients();
  bool optimizer_step_was_skipped() const { return step_skipped_; }
  // Accelerate's no_sync(model): while the returned guard lives, the backwards reaching `model`
  // only accumulate its gradients locally (no communication, not unscaled); the first backward
  // after it synchronises everything accumulated, as PyTorch DDP's no_sync. For a model a
  // backward reaches without needing its gradients (a GAN's discriminator under the
  // generator's loss: `auto local = acc.no_sync(discriminator);`).
  class NoSync {
   public:
    ~NoSync();
    NoSync(const NoSync&) = delete;
    NoSync& operator=(const NoSync&) = delete;

   private:
    friend class Accelerator;
    NoSync(Accelerator& accelerator, std::size_t model);
    Accelerator& accelerator_;
    std::size_t model_;
  };
  [[nodiscard]] NoSync no_sync(std::size_t model = 0);
  // DeepSpeed's GatheredParameters / an FSDP unit's scope: under ZeRO-3 (zero_stage 3) unit
  // `unit`'s parameters (ParamRef::unit) are whole in their buffers while the returned guard
  // lives, gathered for `pass`; a loop brackets each unit's forward and its backward with one
  // (the next unit's gather is prefetched meanwhile). Under every other strategy the
  // parameters are always whole and the guard does nothing, so the loop runs unchanged.
  class GatheredParameters {
   public:
    ~GatheredParameters();
    // Movable (into a std::optional a loop's layer hooks keep), the moved-from one releasing
    // nothing.
    GatheredParameters(GatheredParameters&& other) noexcept;
    GatheredParameters& operator=(GatheredParameters&&) = delete;

   private:
    friend class Accelerator;
    GatheredParameters(Strategy& strategy, std::size_t unit, UnitPass pass);
    Strategy* strategy_;
    std::size_t unit_;
    UnitPass pass_;
  };
  [[nodiscard]] GatheredParameters gather_parameters(std::size_t unit,
                                                     UnitPass pass = UnitPass::forward,
                                                     std::size_t model = 0);
  // The fp16 loss scaler (null unless mixed_precision is fp16).
  const DynamicLossScaler* loss_scaler() const { return scaler_.get(); }
  // Accelerate's accelerator.sync_gradients: will the current micro-batch end in a sync?
  bool is_accumulation_boundary() const;
  // Clips every gradient of the model (the one prepared, or `model` when there are several)
  // so their global L2 norm is at most max_norm; returns the norm before clipping (the same
  // on every rank).
  double clip_grad_norm(double max_norm);
  double clip_grad_norm(std::size_t model, double max_norm);
  std::uint64_t step() const { return optimizer_steps_; }  // optimizer steps taken (not skipped)

  // ---- data
  // This rank's share of a dataset of `size` samples (see ShardedSampler). Every rank calls
  // it: the dataset size, batch size, seed, shuffle, drop_last and even_batches must agree
  // across ranks (else every rank throws RankMismatchError naming a rank and the value).
  // With the config's global_batch_size G the batch is G / num_processes() whatever
  // options.batch_size says, so every world size draws the same global batches.
  ShardedSampler make_sampler(std::size_t size, SamplerOptions options = {});
  // The per-process batch a sampler or data loader asked for `requested` gets:
  // global_batch_size / num_processes() when the config sets it, else `requested`.
  std::size_t batch_size_for(std::size_t requested) const;

  // ---- collectives on the loop's own values (blocking)
  void reduce(Buffer data, ReduceOp op);  // in place: sum, avg, min, max
  void broadcast(Buffer data, int root = 0);
  // Every rank's `local` (equal counts), concatenated in rank order.
  std::vector<float> gather(const std::vector<float>& local);
  std::vector<std::int64_t> gather(const std::vector<std::int64_t>& local);
  // gather() of one batch of per-sample values, dropping the sampler's padding once the
  // epoch's last batch is reached: an evaluation epoch yields exactly the dataset's size.
  // `batch_index` is this batch's position in the epoch (0-based).
  std::vector<float> gather_for_metrics(const std::vector<float>& local,
                                        const ShardedSampler& sampler, std::size_t batch_index);
  std::vector<std::int64_t> gather_for_metrics(const std::vector<std::int64_t>& local,
                                               const ShardedSampler& sampler,
                                               std::size_t batch_index);
  // Pads `local` with `pad` up to the longest length on any rank (so gather can follow).
  std::vector<float> pad_across_processes(std::vector<float> local, float pad = 0.0f);
  void wait_for_everyone();
  // Runs fn on the main process first, then on the others (e.g. a download or a cache).
  void main_process_first(const std::function<void()>& fn);
  // The contiguous part [begin, end) of [0, n) this rank takes (uneven splits allowed).
  std::pair<std::size_t, std::size_t> split_between_processes(std::size_t n) const;

  // ---- control flow across ranks (Accelerate's names)
  // Logging on the main process only, so a loop needs no is_main_process() guard:
  //   acc.print("step %d loss %.4f\n", step, loss);  // printf, when the format's conversions
  //                                                  // read exactly the arguments
  //   acc.print("step ", step, " loss ", loss);      // else each with <<, then a newline
  // (accelerate/print.hpp has the rule). The streaming form ends the line as Python's print
  // does, unless the text already ends with one. GCC 12 (Debian 12) has no <format>, so there
  // is no std::format form.
  // Training metrics are per rank: reduce on every rank (a collective, so never inside
  // on_main_process), then print once:
  //   float mean = loss;                                          // this rank's mean loss
  //   acc.reduce(buffer_of(std::span(&mean, 1)), ReduceOp::avg);  // every rank
  //   acc.print("step ", acc.step(), " loss ", mean);             // the main process writes
  // TorchAccelerator: acc.print("loss ", acc.reduce(loss.detach(), ReduceOp::avg).item<float>());
  template <typename First, typename... Rest>
  void print(const First& first, const Rest&... rest) const {
    if (is_main_process()) print_detail::print_to(stdout, first, rest...);
  }
  // Runs fn only on the main process / on each machine's local main process (Accelerate's
  // decorators of the same names); not a collective: the other ranks go on at once.
  template <std::invocable F>
  void on_main_process(F&& fn) const {
    if (is_main_process()) std::forward<F>(fn)();
  }
  template <std::invocable F>
  void on_local_main_process(F&& fn) const {
    if (is_local_main_process()) std::forward<F>(fn)();
  }
  // Early stopping on a condition only some ranks see (their own loss, a NaN in their shard):
  // the rank that sees it calls set_trigger(); every rank calls check_trigger() at the same
  // point of the loop, a collective (one all-reduce) that returns true on every rank at the
  // same call when any rank set the trigger since, and then clears it:
  //   if (should_stop(loss)) acc.set_trigger();
  //   if (acc.check_trigger()) break;
  // A rank that breaks alone leaves the others in their next collective, which fails: after
  // the timeout (AcceleratorOptions::timeout, ACCEL_COMM_TIMEOUT) naming the rank not heard
  // from, or at once when it exited (shm names it; gloo sees a closed socket); `accel launch`
  // then stops every rank.
  void set_trigger() { trigger_ = true; }
  bool check_trigger();

  // ---- experiment tracking (Accelerate's names; accelerate/trackers/)
  // Starts the config's log_with trackers (tensorboard, csv, jsonl, mlflow) writing under
  // logging_dir/project_name, and AcceleratorOptions::trackers, on the main process, and
  // stores the run's hyperparameters there. Every rank calls it; the others hold only the
  // loop's trackers whose main_process_only() is false.
  void init_trackers(const std::string& project_name, const TrackerConfig& config = {});
  // Each tracker's record of `values` at `step` (those this rank holds). Written when it
  // returns.
  void log(const TrackerValues& values, std::int64_t step);
  // Ends the trackers (also when the Accelerator is destroyed) and waits for every rank.
  void end_training();
  // The trackers this process writes to (on ranks but the main one, only those asked for).
  std::vector<std::string> tracker_names() const { return trackers_.names(); }

  // ---- progress (accelerate/progress_bar.hpp)
  // `for (auto& batch : acc.progress(*loader, "epoch 1"))`: the loop unchanged, a progress bar
  // on the main process (i/n when the range has a size, rate, ETA, the last loss acc.log was
  // given) unless disable_progress_bar (config key, --disable_progress_bar,
  // ACCEL_DISABLE_PROGRESS_BAR); closed when the loop ends.
  template <typename Range>
  ProgressRange<Range> progress(Range& range, std::string description = "") {
    std::size_t total = 0;  // what the loop will walk: a resumed epoch's batches left
    if constexpr (requires { range.batches_left(); })
      total = range.batches_left();
    else if constexpr (requires { std::size(range); })
      total = std::size(range);
    auto bar = std::make_shared<ProgressBar>(std::move(description), total, progress_bar_options());
    progress_ = bar;
    return ProgressRange<Range>(range, std::move(bar));
  }
  // For a bar of one's own: enabled on the main process unless disabled.
  ProgressBarOptions progress_bar_options() const;
  // The config's project_dir, and logging_dir (project_dir when not set).
  const std::string& project_dir() const;
  const std::string& logging_dir() const;

  // ---- randomness: the same seed on every rank (and recorded in checkpoints)
  // Accelerate's set_seed: seeds every generator the process uses, rng() from (seed, rank)
  // and the front end's (TorchAccelerator: LibTorch's CPU generator, and its CUDA ones when
  // this rank computes on a GPU, as torch::manual_seed(seed) would). A collective: rank 0's
  // seed is every rank's, so a seed drawn from a clock still agrees. device_specific: the
  // front end's generators get seed + process_index() (different draws per rank); seed(),
  // the sampler's and checkpoints' seed, stays the shared one. rng() is per rank either way.
  void set_seed(std::uint64_t seed, bool device_specific = false);
  std::uint64_t seed() const { return seed_; }
  // The loop's own random engine (dropout masks, augmentation): a different stream per rank,
  // seeded by set_seed, saved per rank in checkpoints, so a resumed run draws what the
  // uninterrupted run would have drawn.
  std::mt19937_64& rng() { return rng_; }

  // ---- where the loop is in its data (saved in checkpoints)
  // The epoch about to run (call it where the sampler's set_epoch is called). A different
  // epoch than the current one starts at batch 0; the same one keeps the position, so
  // set_epoch(resume_epoch()) after load_state stays mid-epoch. begin_batch and
  // sync_gradients then advance the position; after an epoch's last batch it is the next
  // epoch's batch 0. A loop that does not call begin_batch is only tracked by epoch.
  void set_epoch(std::uint64_t epoch);
  std::uint64_t epoch() const { return epoch_; }
  std::uint64_t batch_in_epoch() const { return next_batch_; }  // batches of epoch() done

  // ---- checkpoints (accelerate/checkpointing/checkpoint.hpp has the directory format and crash
  // rules) State the Accelerator does not know about (optimizer, LR scheduler, a framework's
  // model): save() returns its bytes, load() restores them. A shared state's save() is
  // called on rank 0 only, so it must not communicate. Register in the same order with the
  // same names on every rank, before save_state / load_state.
  void register_state(std::string name, std::function<std::string()> save,
                      std::function<void(const std::string&)> load,
                      StateScope scope = StateScope::shared);
  // A random generator of the loop's besides rng() (LibTorch's, an augmentation library's):
  // saved per rank, as rng() is. Loaded from a checkpoint of another number of processes,
  // where no saved stream belongs to this rank, reseed() gets a seed reproducible from
  // (seed, rank, step, name) instead, so such a checkpoint still loads.
  void register_rng(std::string name, std::function<std::string()> save,
                    std::function<void(const std::string&)> load,
                    std::function<void(std::uint64_t)> reseed);
  // State that lives outside prepare and writes blobs of its own (a pipeline's stages: each
  // rank holds other layers). save() returns them, every rank in registration order (it may
  // communicate); the writer rank's `shared` are written, every rank's `per_rank` as NAME.rankR.
  // load(ck) checks the verified checkpoint on this rank without communicating and returns what
  // applies it, called after the registered states. `shared_blobs` names the shared blobs it
  // reads, which load_state then does not report as unknown.
  struct CheckpointPartBlobs {
    std::vector<BlobView> shared, per_rank;
    std::shared_ptr<const void> keep;  // what the views point into, until the save ends
  };
  struct CheckpointPart {
    std::vector<std::string> shared_blobs;
    std::function<CheckpointPartBlobs()> save;
    std::function<std::function<void()>(const LoadedCheckpoint&)> load;
  };
  void register_checkpoint_part(std::string name, CheckpointPart part);
  void unregister_checkpoint_part(const std::string& name);
  // A training call that steps its optimizer outside sync_gradients (TorchPipeline::step)
  // counts the step here: step(), the trackers and checkpoints see it.
  void count_optimizer_step() { ++optimizer_steps_; }
  // Every rank calls it, after an optimizer step (between accumulation steps the partly
  // accumulated gradients would be lost, so that throws). Saves every prepared model's
  // parameters and buffers (rank 0's copy: DDP replicas are equal) and optimizer state (model
  // k > 0 under prepared_name: "parameters_1", "optimizer_1"), the step, epoch and batch
  // position, the seed, each rank's rng() and every registered state.
  void save_state(const std::string& dir);
  // Every rank calls it, after set_seed and prepare_parameters. Reads and verifies the whole
  // checkpoint on every rank before changing anything; throws CheckpointError (naming the
  // file and the problem) on every rank if any rank found one. Registered states are loaded
  // first (a load() that throws may leave earlier ones applied: validate before changing
  // anything), then parameters, counters and rng(). A checkpoint saved by another number of
  // processes loads when nothing depends on it: not mid-epoch, no per-rank registered state
  // but generators; rng() and register_rng's generators are then reseeded instead.
  void load_state(const std::string& dir);
  // Project checkpoints (Accelerate's ProjectConfiguration, config keys
  // automatic_checkpoint_naming and total_limit): save_state() writes
  // project_dir/checkpoints/checkpoint_<i>, i one past the newest there (0 first), and returns
  // that directory; then, with total_limit N, rank 0 removes the oldest beyond N, so a save
  // that crashes leaves the N before it. load_state() reads the newest complete one
  // (CheckpointError when there is none); latest_checkpoint() names it, or "" (every rank
  // calls these: rank 0 looks, the others are told). With save_on_each_node every machine
  // keeps its own copies (its first process looks and removes there): the index is one past
  // the newest any machine has, the newest the one every machine has.
  std::string save_state();
  void load_state();
  std::string latest_checkpoint();
  // Where load_state left the loop: continue with epoch resume_epoch() at batch
  // resume_batch() (both 0 before any load).
  std::uint64_t resume_epoch() const { return resume_epoch_; }
  std::uint64_t resume_batch() const { return resume_batch_; }
  // A front end that saves the model itself through register_state (the LibTorch adapter,
  // or parameters living on a GPU) switches off the parameter blob.
  void set_checkpoint_parameters(bool on) { checkpoint_parameters_ = on; }

 protected:
  // fp16 loss scaling: divides the synchronised gradients of `models` by `scale` in place and
  // says whether they were all finite; discard_gradients() zeroes them after an overflow.
  // These work on the CPU gradient buffers the optimizer reads (the strategy's segments); a
  // front end whose gradients live elsewhere (a GPU) overrides them.
  virtual bool unscale_gradients(double scale, const std::vector<std::size_t>& models);
  virtual void discard_gradients(const std::vector<std::size_t>& models);
  // set_seed's part for the front end's own generators; `seed` is this rank's (seed +
  // process_index() when device_specific). The raw API has none.
  virtual void seed_generators(std::uint64_t /*seed*/) {}
  // save_state's first and last steps on every rank, for a front end whose registered states
  // need a collective before rank 0 saves them (the LibTorch adapter's ZeRO-3 model, gathered
  // unit by unit). The second runs also when the save fails.
  virtual void before_save_state() {}
  virtual void after_save_state() {}
  // load_state's last step for the parameter blob: the checked bytes into the prepared
  // parameters and buffers (copy_parameters_in); a front end whose parameters are not where
  // their ParamRefs were (the LibTorch adapter under ZeRO-3) hands them to the strategy.
  virtual void load_parameter_values(const PreparedParameters& model,
                                     const FullParameters& values) {
    copy_parameters_in(model, values);
  }
  // Where save_state's files go (checkpoint.hpp): one directory every rank sees, or with
  // save_on_each_node one per machine (its ranks found once, by an all-gather of NODE_RANK).
  // The writer of a directory writes the shared files: rank 0, or each machine's first rank.
  const CheckpointPlacement& checkpoint_placement();
  bool writes_shared_checkpoint_files();
  // For a front end (the LibTorch adapter) to set what only it knows (the replicas it made)
  // before prepare_parameters.
  StrategyOptions& strategy_options_to_prepare() { return strategy_options_; }
  // For a front end with an optimizer of its own (the LibTorch adapter): its state is saved
  // and loaded as prepare()'s built-in optimizer's is ("optimizer": one blob under DDP, each
  // rank's slices under ZeRO; any strategy and world size loads it). save() returns it in
  // Optimizer::save_state's format for strategy().segments(). load(bytes, where) gets that
  // format for this rank's segments, resharded from whatever saved it, while load_state still
  // checks (throw from it, naming `where`, the checkpoint), and returns what applies it,
  // called after the registered states are loaded.
  // One per prepared model: `model`'s optimizer ("optimizer", "optimizer_1", ...).
  void register_optimizer_state(std::size_t model, std::function<std::string()> save,
                                OptimizerStateLoader load);
  // Throws when no other model may be prepared (DATA_PARALLEL replicates one).
  void check_can_prepare_another() const;
  // For a front end with an optimizer of its own: values the next prepare_parameters checks
  // across ranks besides its own (the param groups' options).
  void agree_at_prepare(std::vector<AgreedValue> values) { prepare_agreement_ = std::move(values); }

 private:
  ProcessEnv env_;
  AcceleratorOptions options_;
  std::unique_ptr<ProcessGroup> group_;
  StrategyOptions strategy_options_;
  // hybrid_shard: this machine's ranks, and this local index's rank on every machine (before
  // models_: the strategies use them until they are gone).
  CommunicatorPtr hybrid_shard_group_, hybrid_replica_group_;
  void make_hybrid_groups(const std::string& origin);
  // The prepared models in preparation order: each one's strategy, parameters, optimizer.
  std::vector<std::unique_ptr<PreparedParameters>> models_;
  std::vector<AgreedValue> prepare_agreement_;  // the optimizer's, for prepare_parameters
  // The resolved config (its logging_dir filled in from project_dir): the accessors read it.
  std::unique_ptr<const config::Config> config_;
  std::optional<CheckpointPlacement> placement_;  // save_on_each_node's machines, found once
  std::weak_ptr<ProgressBar> progress_;  // the newest progress(): log() shows its loss there
  // The named checkpoints' directory (project_dir/checkpoints), checked for the no-dir calls.
  std::string checkpoints_dir(const char* call) const;
  std::vector<std::shared_ptr<GeneralTracker>> own_trackers_;
  TrackerSet trackers_;
  int micro_since_sync_ = 0;                   // micro-batches since the last boundary
  std::unique_ptr<DynamicLossScaler> scaler_;  // mixed_precision fp16
  bool step_skipped_ = false;                  // the last boundary's gradients overflowed
  bool last_batch_ = false;                    // the current batch ends an epoch
  std::uint64_t optimizer_steps_ = 0;          // boundaries reached
  bool batch_boundary_ = false;  // begin_batch's batch ends in a sync (every backward of it)
  bool in_batch_again_ = false;  // that batch synced once: a further backward is part of it
  std::uint64_t seed_ = 0;
  std::mt19937_64 rng_;
  bool trigger_ = false;  // set_trigger() since the last check_trigger() that returned true

  // The loop's position: epoch_ and the batches of it done; begin_batch's batch in flight.
  std::uint64_t epoch_ = 0;
  std::uint64_t next_batch_ = 0;
  std::optional<std::pair<std::uint64_t, std::uint64_t>> batch_in_flight_;  // index, count
  std::uint64_t resume_epoch_ = 0;
  std::uint64_t resume_batch_ = 0;

  struct RegisteredState {
    std::string name;
    std::function<std::string()> save;
    std::function<void(const std::string&)> load;
    StateScope scope;
    std::function<void(std::uint64_t)> reseed;  // register_rng's
  };
  std::vector<RegisteredState> states_;
  std::vector<std::pair<std::string, CheckpointPart>> parts_;
  bool checkpoint_parameters_ = true;

  // load_state's steps (accelerator_state.cpp): check every registered state's blob, then
  // load them; copy the checked parameter bytes into the prepared parameters and buffers.
  void check_registered_states(const LoadedCheckpoint& ck) const;
  void load_registered_states(const LoadedCheckpoint& ck);
  void copy_parameters_in(const PreparedParameters& model, const FullParameters& values);

 protected:
  void copy_buffers_in(const PreparedParameters& model, const FullParameters& values);
  // A front end with a module tree names the model's buffers and tied parameters' other names
  // for the checkpoint layout (accel merge-weights writes them).
  void name_tensors(std::size_t model, TensorNames names);

 private:
  // The raw API's models: which one `model` (an object given to prepare) is; its copies.
  std::size_t model_index_of(const void* model) const;
  ReplicatedModel* replicas_of(std::size_t model) const;
  void keep_replicas(std::size_t model, std::unique_ptr<ReplicatedModel> replicas);
  // The models sync_gradients synchronises now: those a gradient was reported for since the
  // last sync, or every one when none was; none under no_sync.
  std::vector<std::size_t> models_to_sync() const;
  // Whether the next micro-batch ends in a sync; every model's strategy told so (but those
  // under no_sync).
  bool next_micro_batch_syncs() const;
  void apply_sync_state();
};

}  // namespace accel
