#pragma once
// The LibTorch adapter (target accel::torch): the Accelerator for LibTorch modules, optimizers
// and tensors. A plain loop changes in a handful of lines (the lines between the markers are
// compiled and run as written by torch_accelerator_test):
//
// usage:
//   accel::TorchAccelerator acc;  // rank, world and communicator from `accel launch`
//   auto [model, opt] = acc.prepare(net, optimizer);  // was: net, optimizer
//   auto loader = acc.prepare_data_loader(images, labels, {.batch_size = 64});
//   for (std::uint64_t epoch = 0; epoch < epochs; ++epoch) {
//     loader.set_epoch(epoch);
//     for (const auto& batch : loader) {
//       opt.zero_grad();
//       auto loss = torch::nll_loss(model(batch.data), batch.target);  // bf16: autocast
//       acc.backward(loss);  // was: loss.backward()
//       opt.step();
//     }
//   }
// end of usage
//
// Contract of prepare (the strategy decides the storage through backend.hpp's contract):
//  - every trainable parameter and buffer is broadcast from rank 0; buffers again at each
//    backward() (DdpOptions::broadcast_buffers);
//  - DDP: each .grad() aliases its slot in a bucket (DDP's gradient_as_bucket_view) and a hook
//    on its AccumulateGrad node reports it ready, so buckets all-reduce during backward;
//  - ZeRO: parameters become views into the flat buffers; the optimizer keeps its type and
//    options but steps this rank's slices (stage 1: .grad() in the flat buffer; stage 2:
//    gradients lent and released at the boundary); step() all-gathers the parameters;
//  - ZeRO-3: each rank keeps only its slices; the prepared call gathers the units
//    (zero3/sharded_unit.hpp; one Zero3Units per model, zero3/zero3_units.hpp), and the
//    parameters' storage is empty outside them;
//  - DATA_PARALLEL: replicas made and driven by TorchReplicas (torch_replicas.hpp);
//  - checkpoints: save_state / load_state carry model, optimizer, scheduler and RNG state as
//    torch_state.hpp and torch_optimizer_state.hpp describe, resharding to any world size
//    (each rank's generator reseeded when the number of processes changed).
// The accelerator owns that storage: destroyed, it leaves the model plain copies (usable),
// and under ZeRO the optimizer this rank's slices (build a new one to go on training). Under
// ZeRO-3 only the persistent parameters keep values (the others are spread over the ranks:
// take get_state_dict or save_state before).

#include <atomic>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <sstream>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include <ATen/Tensor.h>
#include <c10/core/Device.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/optim/optimizer.h>
#include <torch/optim/schedulers/lr_scheduler.h>
#include <torch/serialize.h>

#include "accelerate/accelerator.hpp"
#include "accelerate/torch/accelerated_optimizer.hpp"
#include "accelerate/torch/activation_checkpoint.hpp"
#include "accelerate/torch/autocast.hpp"
#include "accelerate/torch/data/data_loader.hpp"
#include "accelerate/torch/data/dataset_loader.hpp"
#include "accelerate/torch/module_tensors.hpp"
#include "accelerate/torch/prepared_model.hpp"
#include "accelerate/torch/prepared_script.hpp"
#include "accelerate/torch/torch_replicas.hpp"
#include "accelerate/torch/zero3/root_forward.hpp"
#include "accelerate/torch/zero3/sharded_unit.hpp"
#include "foundation/file_io.hpp"

namespace torch::autograd {
struct Node;
}

namespace accel {

class TorchReplicas;
struct PreparedTensors;  // prepared_tensors.hpp: one prepared model's tensors

namespace detail {
// The one-call prepare's parameters of an argument (for the optimizer that holds them).
template <typename Arg>
std::vector<at::Tensor> module_tensors_of(Arg& arg) {
  if constexpr (std::is_same_v<Arg, torch::jit::Module>) {
    std::vector<at::Tensor> out;
    for (const at::Tensor& p : arg.parameters()) out.push_back(p);
    return out;
  } else if constexpr (std::derived_from<Arg, torch::nn::Module>) {
    return arg.parameters();
  } else {
    return (*arg).parameters();
  }
}
// The optimizer among `optimizers` whose parameters are the model's (refused: none, or two).
torch::optim::Optimizer& optimizer_of(const std::vector<at::Tensor>& parameters,
                                      const std::vector<torch::optim::Optimizer*>& optimizers);
}  // namespace detail

// shared_ptr<SomeModule> or a torch::nn::ModuleHolder (torch::nn::Sequential, TORCH_MODULE types).
template <typename Model>
concept TorchModel =
    std::derived_from<std::remove_cvref_t<decltype(*std::declval<Model&>())>, torch::nn::Module>;

class TorchAccelerator : public Accelerator, private OptimizerHost {
 public:
  using Batch = TorchBatch;
  using DataLoader = TorchDataLoader;

  // mixed_precision: bf16 (autocast on the CPU or CUDA), or fp16 on CUDA only (autocast with
  // dynamic loss scaling: backward() scales the loss, and a step whose gradients overflowed on
  // any rank is skipped; see DynamicLossScaler). fp16 on the CPU is refused: LibTorch's CPU
  // autocast runs in bf16 only.
  explicit TorchAccelerator(AcceleratorOptions options = {});
  ~TorchAccelerator();

  // Where tensors of this rank live: the CPU, or cuda:LOCAL_RANK under a CUDA communicator.
  torch::Device device_for_tensors() const;

  // Activation checkpointing (activation_checkpoint.hpp): block(inputs...), a module or any
  // callable of tensors, recomputed during backward instead of keeping its activations; the
  // gradients are the same bits. Inside a model's own forward, accel::checkpoint does the same.
  template <typename Block, typename... Tensors>
  at::Tensor checkpoint(Block&& block, const Tensors&... inputs) {
    return accel::checkpoint(std::forward<Block>(block), inputs...);
  }

  // ---- models and optimizers
  // Returns the same model (its parameters now synchronised and hooked), wrapped so that
  // calling it, model(x), is the forward the strategy may fan out (prepared_model.hpp), and the
  // wrapped optimizer. Any number of models, one call each (a GAN: prepare(G, opt_g), then
  // prepare(D, opt_d)) or all in one (below): each has a strategy of its own (its buckets or
  // shards), its optimizer steps only at a sync, and a backward through several (G's loss
  // through D) syncs each one it reached (Accelerator::sync_gradients). Checkpoints carry them
  // all, model k > 0 as "model_k", "optimizer_k". DATA_PARALLEL takes one model. The model may
  // be a std::shared_ptr<M> or a ModuleHolder (TORCH_MODULE types, torch::nn::Sequential) ...
  template <TorchModel Model>
  std::pair<PreparedModel<Model>, AcceleratedOptimizer&> prepare(
      Model model, torch::optim::Optimizer& optimizer) {
    AcceleratedOptimizer& wrapped = prepare_module(*model, optimizer);
    return {PreparedModel<Model>(std::move(model), *this), wrapped};
  }
  // ... a module object of the loop's own (`Net net;`: not copied, it must outlive its use)
  template <typename M>
  requires std::derived_from<M, torch::nn::Module>
      std::pair<PreparedModel<std::shared_ptr<M>>, AcceleratedOptimizer&> prepare(
          M& module, torch::optim::Optimizer& optimizer) {
    return prepare(std::shared_ptr<M>(&module, [](M*) {}), optimizer);  // not owned
  }
  // ... with a factory for DATA_PARALLEL's replicas of a module that is not Cloneable (a plain
  // torch::nn::Module): `acc.prepare(net, optimizer, [] { return Net(); })`. Each replica is
  // built by it and given the model's parameters and buffers; the other strategies make no
  // replica and never call it. It may return a ModuleHolder, a std::shared_ptr or a module.
  template <TorchModel Model, std::invocable Factory>
  std::pair<PreparedModel<Model>, AcceleratedOptimizer&> prepare(Model model,
                                                                 torch::optim::Optimizer& optimizer,
                                                                 Factory make_replica) {
    AcceleratedOptimizer& wrapped =
        prepare_module(*model, optimizer, replica_factory(std::move(make_replica)));
    return {PreparedModel<Model>(std::move(model), *this), wrapped};
  }
  template <typename M, std::invocable Factory>
  requires std::derived_from<M, torch::nn::Module>
      std::pair<PreparedModel<std::shared_ptr<M>>, AcceleratedOptimizer&> prepare(
          M& module, torch::optim::Optimizer& optimizer, Factory make_replica) {
    return prepare(std::shared_ptr<M>(&module, [](M*) {}), optimizer, std::move(make_replica));
  }
  // ... or a TorchScript module (torch::jit::load), frozen parts allowed (prepared_script.hpp).
  std::pair<PreparedScriptModule, AcceleratedOptimizer&> prepare(
      torch::jit::Module module, torch::optim::Optimizer& optimizer) {
    AcceleratedOptimizer& wrapped = prepare_script(module, optimizer);
    return {PreparedScriptModule(std::move(module), autocast_settings()), wrapped};
  }
  // ... or several models and their optimizers in one call, in any order (Accelerate's
  // prepare(G, D, opt_g, opt_d)): each optimizer goes with the model holding its parameters,
  // the models are prepared in the arguments' order, and the results come in that order:
  //   auto [generator, discriminator, g_opt, d_opt] = acc.prepare(g_net, d_net, g_adam, d_adam);
  template <typename... Args>
  requires(sizeof...(Args) > 2) auto prepare(Args&... args);
  AcceleratedOptimizer& prepare_module(torch::nn::Module& module,
                                       torch::optim::Optimizer& optimizer,
                                       ReplicaFactory make_replica = {});
  AcceleratedOptimizer& prepare_script(const torch::jit::Module& module,
                                       torch::optim::Optimizer& optimizer);
  // Accelerate's unwrap_model: the user's model behind what prepare returned.
  template <typename Model>
  static Model& unwrap_model(const PreparedModel<Model>& model) {
    return model.get();
  }
  static torch::jit::Module& unwrap_model(const PreparedScriptModule& model) { return model.get(); }
  // Accelerate's save: torch::save(value, path) on the main process only (written aside and
  // renamed, so `path` is never half-written), then every rank waits for it.
  // A prepared optimizer under ZeRO is FSDP's full optimizer state dict (state_dict_type
  // FULL_STATE_DICT, the default): every rank's slices gathered to the main process, written as
  // the user's kind of optimizer over the whole model, which a plain one torch::load()s (SGD,
  // Adam, AdamW); every rank calls it. Under SHARDED_STATE_DICT it is refused.
  void save(const AcceleratedOptimizer& optimizer, const std::string& path);
  template <typename Value>
  void save(const Value& value, const std::string& path) {
    if (is_main_process()) {
      std::ostringstream bytes;
      torch::save(value, bytes);
      write_file_atomically(path, bytes.str());
    }
    wait_for_everyone();
  }
  // Accelerate's register_for_checkpointing: something else save_state / load_state carry
  // (a model or optimizer not prepared, a tensor): anything torch::save / torch::load take,
  // saved from rank 0 as "state.custom_checkpoint_<i>" in registration order. Register in the same
  // order on every rank; `object` must outlive the accelerator's use of it.
  template <typename Object>
  void register_for_checkpointing(Object& object) {
    register_state(
        "custom_checkpoint_" + std::to_string(custom_checkpoints_++),
        [&object] {
          std::ostringstream bytes;
          torch::save(object, bytes);
          return bytes.str();
        },
        [&object](const std::string& bytes) {
          std::istringstream in(bytes);
          torch::load(object, in);
        });
  }
  // Accelerate's get_state_dict: the model's full parameters and buffers by name, copied.
  // Under ZeRO-3 it gathers them unit by unit: every rank calls it.
  template <typename Model>
  std::vector<std::pair<std::string, at::Tensor>> get_state_dict(
      const PreparedModel<Model>& model) {
    return get_state_dict(index_of_module(*model.get()));
  }
  // The same for the model prepared `model`-th (0-based, as the raw API counts models).
  std::vector<std::pair<std::string, at::Tensor>> get_state_dict(std::size_t model);
  // After prepare: the scheduler built on the prepared optimizer (or the user's own), wrapped,
  // and registered for checkpoints ("scheduler", then "scheduler_1" ...). With several
  // optimizers, name the one it schedules (its step is skipped when that one's was).
  AcceleratedScheduler& prepare_scheduler(torch::optim::LRScheduler& scheduler);
  AcceleratedScheduler& prepare_scheduler(torch::optim::LRScheduler& scheduler,
                                          AcceleratedOptimizer& optimizer);
  // The trainable parameters of model 0 (or of the model-th prepared) in the order the
  // strategy knows them (module order).
  const std::vector<torch::Tensor>& prepared_parameters(std::size_t model = 0) const;

  // ---- DataParallel (see the top of this file)
  // Whether a prepared model's call runs on replicas (DATA_PARALLEL).
  bool replicates_forward() const;
  // Replica k's module (k >= 1; replica 0 is the prepared module).
  torch::nn::Module& replica_module(int k);
  // The DataParallel forward over `rows` rows: forward(k, chunk) on worker k for every
  // replica with rows, outputs concatenated along dim 0 (PreparedModel's call operator).
  at::Tensor replica_forward(std::int64_t rows,
                             const std::function<at::Tensor(int, Shard)>& forward);

  // ---- one micro-batch
  // Re-broadcasts buffers, runs (loss * loss_scale()).backward() (buckets all-reduce from
  // the hooks while it runs; under DATA_PARALLEL then each replica's backward on its worker),
  // then sync_gradients(). Returns sync_gradients_happened(): false
  // between accumulation steps, and for an fp16 step skipped after an overflow (its
  // gradients are then zeroed, and the optimizer step() does nothing).
  bool backward(const torch::Tensor& loss);
  // Accelerate's no_sync(model) (Accelerator::no_sync): backwards reaching the model only
  // accumulate its gradients while the guard lives, e.g. the discriminator under the
  // generator's loss, whose gradients the loop zeroes before its own step anyway:
  //   { auto local = acc.no_sync(discriminator); acc.backward(g_loss); }
  using Accelerator::no_sync;
  template <typename Model>
  [[nodiscard]] NoSync no_sync(const PreparedModel<Model>& model) {
    return no_sync(index_of_module(*model.get()));
  }
  // Whether the last backward() ended at an accumulation boundary (gradients synchronised).
  bool sync_gradients_happened() const { return synced_; }
  // Whether gradients are accumulating: a backward() happened that did not end in a sync.
  bool accumulating() const { return accumulating_; }
  // Broadcasts the module's buffers from rank 0 (backward() does it; also for eval loops).
  void sync_buffers();
  // Global L2 norm clipping over the prepared parameters' gradients (returns the norm before
  // clipping, the same on every rank); call it after a backward() that synchronised. It is the
  // one correct call under every strategy: LibTorch's torch::nn::utils::clip_grad_norm_ sees
  // only this rank's local gradients under ZeRO (the optimizer steps the reduced slices), so
  // under ZeRO-1 the step refuses gradients changed after the sync, and under ZeRO-2 (whose
  // gradients are released at the sync) clip_grad_norm_ finds none and clips nothing.
  // (A local clip_grad_norm_ that did not clip is not detected, though the global norm may
  // have needed it: use this call.) With several models, name the one to clip:
  // acc.clip_grad_norm(model, max_norm) with what prepare returned.
  using Accelerator::clip_grad_norm;
  template <typename Model>
  double clip_grad_norm(const PreparedModel<Model>& model, double max_norm) {
    return clip_grad_norm(index_of_module(*model.get()), max_norm);
  }

  // ---- data
  DataLoader prepare_data_loader(torch::Tensor data, torch::Tensor targets,
                                 SamplerOptions options = {});
  // Any torch::data dataset, as torch::data::make_data_loader takes it (the Sampler type
  // defaulting to RandomSampler, "shuffle"): each rank gets its share (dataset_loader.hpp).
  template <typename Sampler = torch::data::samplers::RandomSampler, TorchDataset Dataset>
  DatasetLoader<Dataset> prepare_data_loader(Dataset dataset,
                                             torch::data::DataLoaderOptions options = {},
                                             DataLoaderConfiguration config = {}) {
    const c10::optional<std::size_t> size = dataset.size();
    ACCEL_CHECK_ARG(size.has_value(),
                    "prepare_data_loader: the dataset has no size() to "
                    "construct the Sampler from");
    return make_dataset_loader(*this, std::move(dataset), Sampler(*size), std::move(options),
                               config);
  }
  // With the loop's sampler object (a DistributedRandomSampler it built is kept).
  template <TorchDataset Dataset, std::derived_from<torch::data::samplers::Sampler<>> Sampler>
  DatasetLoader<Dataset> prepare_data_loader(Dataset dataset, Sampler sampler,
                                             torch::data::DataLoaderOptions options = {},
                                             DataLoaderConfiguration config = {}) {
    return make_dataset_loader(*this, std::move(dataset), std::move(sampler), std::move(options),
                               config);
  }
  // This rank's contiguous part of dim 0 (Accelerate's split_between_processes; uneven splits
  // differ by one row). A token stream for a language model's BPTT windows: cut it to what
  // the global batch uses, then batchify this rank's part as before, so every rank steps the
  // same windows and global column j is rank j / batch's column j % batch:
  //   tokens = tokens.narrow(0, 0, tokens.size(0) / (batch * world) * (batch * world));
  //   auto train = batchify(acc.split_between_processes(tokens), batch);  // was: tokens
  using Accelerator::split_between_processes;
  torch::Tensor split_between_processes(const torch::Tensor& t) const;

  // ---- collectives on tensors (blocking; every rank calls them with equal shapes)
  using Accelerator::broadcast;
  using Accelerator::gather;
  using Accelerator::gather_for_metrics;
  using Accelerator::pad_across_processes;
  using Accelerator::reduce;
  // Every rank's tensor concatenated along dim 0, in rank order.
  torch::Tensor gather(const torch::Tensor& t);
  // gather() of one batch's per-sample results (dim 0 = samples), dropping the sampler's
  // padding at the epoch's last batch: an evaluation epoch yields exactly the dataset's size.
  torch::Tensor gather_for_metrics(const torch::Tensor& t, const DataLoader& loader,
                                   std::size_t batch_index);
  // The same for the batch a Dataset loader yielded last (its position is the loader's).
  torch::Tensor gather_for_metrics(const torch::Tensor& t, const DatasetLoaderBase& loader);
  // A reduced copy (sum, avg, min, max over ranks).
  torch::Tensor reduce(const torch::Tensor& t, ReduceOp op);
  // In place, from `root` (t must be contiguous).
  void broadcast(torch::Tensor& t, int root = 0);
  // Pads dim 0 with `value` up to the longest dim 0 on any rank (so gather can follow).
  torch::Tensor pad_across_processes(const torch::Tensor& t, double value = 0.0);

  // ---- ZeRO-3 (zero3/): the prepared call's scope, in which the model's root unit is gathered
  // (RootForward; it does nothing outside ZeRO-3).
  [[nodiscard]] RootForward root_forward(const torch::nn::Module& module);

  // ---- mixed precision
  // A guard enabling autocast on this rank's device while it lives, in the mixed_precision
  // dtype (bf16, or fp16 on CUDA); a guard that does nothing when mixed_precision is no.
  AutocastGuard autocast() const;
  AutocastSettings autocast_settings() const;

 protected:
  // fp16 loss scaling with tensor operations (the gradients may live on a GPU).
  bool unscale_gradients(double scale, const std::vector<std::size_t>& models) override;
  void discard_gradients(const std::vector<std::size_t>& models) override;
  // set_seed's LibTorch part: torch::manual_seed(seed) on a GPU rank; on a CPU rank only the
  // CPU generator (all torch::manual_seed seeds there, without its CUDA device query).
  void seed_generators(std::uint64_t seed) override;
  // ZeRO-3: the model's whole parameters on rank 0 for its archive, freed after the save.
  void before_save_state() override;
  void after_save_state() override;
  // ZeRO-3 under SHARDED_STATE_DICT: the loaded values go to the strategy (load_parameters).
  void load_parameter_values(const PreparedParameters& model,
                             const FullParameters& values) override;

 private:
  class GradReadyHook;
  // OptimizerHost (accelerated_optimizer.hpp): what the prepared optimizers ask.
  bool ready_to_step() const override;
  void before_step(std::size_t model) override;
  void after_step(std::size_t model) override;
  void zero_grad(std::size_t model) override;
  bool holds_slices(std::size_t model) const override;
  // The prepared model whose root module is `module` (clip_grad_norm(model, ...)).
  std::size_t index_of_module(const torch::nn::Module& module) const;
  // Autograd accumulated parameter i's gradient of `model`: make sure it is (still) the bucket
  // slot, then report it ready.
  void on_grad_accumulated(PreparedTensors& model, std::size_t i);
  // prepare_tensors' steps: the trainable parameters as the strategy gets them (model.params
  // filled), the buffers; after prepare_parameters each parameter's .grad() at its storage and
  // its ready hook; then the model and optimizer states for checkpoints (flat_state: the
  // optimizer's per-parameter state in flat coordinates).
  AcceleratedOptimizer& prepare_tensors(const ModuleTensors& tensors,
                                        torch::optim::Optimizer& optimizer,
                                        const ReplicaFactory& make_replica = {});
  void hook_gradients(PreparedTensors& model);
  void register_checkpoint_states(PreparedTensors& model, const ModuleTensors& tensors,
                                  torch::optim::Optimizer& optimizer, bool flat_state,
                                  bool sharded);
  std::atomic<bool> in_backward_{false};
  std::atomic<bool> backward_outside_{false};

  // The prepared models, in preparation order (the Accelerator's model indices).
  std::vector<std::unique_ptr<PreparedTensors>> prepared_;
  std::vector<std::unique_ptr<AcceleratedScheduler>> schedulers_;
  bool synced_ = false;
  bool accumulating_ = false;

  // DataParallel: the module's replicas (torch_replicas.hpp), made at prepare.
  std::unique_ptr<TorchReplicas> replicas_;
  int custom_checkpoints_ = 0;  // register_for_checkpointing's count
};

namespace detail {
// The many-argument prepare's steps, per argument: its preparation, and what it gives back.
template <typename Arg>
AcceleratedOptimizer& prepare_one(TorchAccelerator& acc, Arg& arg,
                                  torch::optim::Optimizer& optimizer) {
  if constexpr (std::is_same_v<Arg, torch::jit::Module>)
    return acc.prepare_script(arg, optimizer);
  else if constexpr (std::derived_from<Arg, torch::nn::Module>)
    return acc.prepare_module(arg, optimizer);
  else
    return acc.prepare_module(*arg, optimizer);
}
template <typename Arg>
decltype(auto) prepared_result(
    TorchAccelerator& acc, Arg& arg,
    const std::vector<std::pair<const torch::optim::Optimizer*, AcceleratedOptimizer*>>& wrapped) {
  if constexpr (std::derived_from<Arg, torch::optim::Optimizer>) {
    for (const auto& [optimizer, accelerated] : wrapped)
      if (optimizer == &arg) return static_cast<AcceleratedOptimizer&>(*accelerated);
    throw InvalidArgument("prepare: an optimizer holds the parameters of no model given");
  } else if constexpr (std::is_same_v<Arg, torch::jit::Module>) {
    return PreparedScriptModule(arg, acc.autocast_settings());
  } else if constexpr (std::derived_from<Arg, torch::nn::Module>) {
    return PreparedModel<std::shared_ptr<Arg>>(std::shared_ptr<Arg>(&arg, [](Arg*) {}), acc);
  } else {
    return PreparedModel<Arg>(arg, acc);
  }
}
}  // namespace detail

template <typename... Args>
requires(sizeof...(Args) > 2) auto TorchAccelerator::prepare(Args&... args) {
  std::vector<torch::optim::Optimizer*> optimizers;
  (
      [&] {
        if constexpr (std::derived_from<Args, torch::optim::Optimizer>) optimizers.push_back(&args);
      }(),
      ...);
  // Every model's optimizer found before anything is prepared.
  std::vector<torch::optim::Optimizer*> chosen;
  (
      [&] {
        if constexpr (!std::derived_from<Args, torch::optim::Optimizer>)
          chosen.push_back(&detail::optimizer_of(detail::module_tensors_of(args), optimizers));
      }(),
      ...);
  ACCEL_CHECK_ARG(chosen.size() == optimizers.size(),
                  "prepare: " + std::to_string(optimizers.size()) + " optimizers for " +
                      std::to_string(chosen.size()) +
                      " models; each model needs the one optimizer that holds its parameters");
  std::vector<std::pair<const torch::optim::Optimizer*, AcceleratedOptimizer*>> wrapped;
  (
      [&] {
        if constexpr (!std::derived_from<Args, torch::optim::Optimizer>) {
          torch::optim::Optimizer& optimizer = *chosen[wrapped.size()];
          wrapped.emplace_back(&optimizer, &detail::prepare_one(*this, args, optimizer));
        }
      }(),
      ...);
  return std::tuple<decltype(detail::prepared_result(*this, args, wrapped))...>(
      detail::prepared_result(*this, args, wrapped)...);
}

template <typename Model>
template <typename... Args>
auto PreparedModel<Model>::operator()(Args&&... args) const {
  using Out = decltype((*model_).forward(std::forward<Args>(args)...));
  // mixed_precision bf16/fp16: the forward runs under autocast by itself, as Accelerate
  // wraps the prepared model's forward (autocast is per thread: each replica sets its own).
  const AutocastGuard autocast = accelerator_->autocast();
  // ZeRO-3: the root unit gathered while the forward runs (zero3/root_forward.hpp).
  RootForward root = accelerator_->root_forward(*model_);
  if constexpr (std::is_same_v<Impl, torch::nn::SequentialImpl> && sizeof...(Args) == 1) {
    // ZeRO-3: a Sequential's children are its units (recomputed with activation_checkpointing).
    if (root.sequential_units()) {
      at::Tensor x = at::Tensor(std::forward<Args>(args)...);
      std::size_t unit = 1;
      for (auto& child : *model_)
        x = root.run_unit(
            unit++, {x},
            [&child](const std::vector<at::Tensor>& in) { return child.forward(in[0]); }, true);
      return detail::outputs_to_fp32(std::move(x));
    }
    // activation_checkpointing: a Sequential's children, each recomputed in backward.
    if (accelerator_->activation_checkpointing() && !accelerator_->replicates_forward()) {
      at::Tensor x = at::Tensor(std::forward<Args>(args)...);
      for (auto& child : *model_)
        x = checkpoint([&child](const at::Tensor& in) { return child.forward(in); }, x);
      return detail::outputs_to_fp32(std::move(x));
    }
  }
  if constexpr (std::is_same_v<std::remove_cvref_t<Out>, at::Tensor>) {
    if (accelerator_->replicates_forward()) {
      const std::int64_t rows = detail::first_rows(args...);
      ACCEL_CHECK_ARG(rows >= 0,
                      "DataParallel: the model's call needs a tensor argument with a batch "
                      "dimension (dim 0) to split between the replicas");
      ACCEL_CHECK_ARG(detail::same_rows(rows, args...),
                      "DataParallel: every tensor argument of the model's call must have the "
                      "same size in dim 0 (" +
                          std::to_string(rows) + " rows)");
      return accelerator_->replica_forward(rows, [&](int k, Shard chunk) -> at::Tensor {
        const AutocastGuard replica_autocast = accelerator_->autocast();
        Impl* replica = k == 0 ? &*model_ : dynamic_cast<Impl*>(&accelerator_->replica_module(k));
        ACCEL_CHECK_ARG(replica != nullptr, "DataParallel: replica " + std::to_string(k) +
                                                " is not of the model's type");
        return detail::outputs_to_fp32(replica->forward(detail::chunk_of(args, chunk)...));
      });
    }
  }
  if constexpr (std::is_void_v<Out>)
    (*model_).forward(std::forward<Args>(args)...);
  else
    return detail::outputs_to_fp32<Out>((*model_).forward(std::forward<Args>(args)...));
}

}  // namespace accel
