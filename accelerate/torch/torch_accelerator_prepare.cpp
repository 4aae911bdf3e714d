// TorchAccelerator::prepare's steps (the hub's own definitions, beside torch_accelerator.cpp): a
// model's tensors to the strategy, its gradients' storage and ready hooks, ZeRO's slices under the
// user's optimizer, and its checkpoint states. One PreparedTensors per prepared model
// (prepared_tensors.hpp).

#include <optional>
#include <unordered_map>
#include <unordered_set>

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/grad_mode.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#if ACCEL_TORCH_WITH_CUDA  // a CUDA-enabled LibTorch (accelerate/torch/CMakeLists.txt)
#include <c10/cuda/CUDAStream.h>
#endif

#include "accelerate/checkpointing/parameter_layout.hpp"
#include "accelerate/torch/checkpointing/torch_optimizer_state.hpp"
#include "accelerate/torch/checkpointing/torch_state.hpp"
#include "accelerate/torch/detail/prepared_tensors.hpp"
#include "accelerate/torch/detail/tensor_buffer.hpp"
#include "accelerate/torch/torch_accelerator.hpp"
#include "accelerate/torch/torch_replicas.hpp"
#include "config/config.hpp"
#include "foundation/error.hpp"

namespace accel {
namespace {

// The buffers' names and shapes, each tied parameter's other names (a module lists it under
// each; the trainable parameters once) and the submodules, for the checkpoint layout.
TensorNames names_of(const ModuleTensors& tensors) {
  TensorNames out;
  for (const auto& [name, t] : tensors.buffers) out.buffers.push_back({name, t.sizes().vec()});
  if (tensors.module == nullptr) return out;
  for (const auto& item : tensors.module->named_modules("", /*include_self=*/false))
    out.modules.push_back(item.key());
  std::unordered_map<const void*, std::size_t> index;
  for (std::size_t i = 0; i < tensors.trainable.size(); ++i)
    index.emplace(tensors.trainable[i].second.unsafeGetTensorImpl(), i);
  for (const auto& item : tensors.module->named_parameters(/*recurse=*/true)) {
    const auto it = index.find(item.value().unsafeGetTensorImpl());
    if (it != index.end() && tensors.trainable[it->second].first != item.key())
      out.aliases.push_back({it->second, item.key()});
  }
  return out;
}

// A param group's hyperparameters by name, for the check that every rank has the same: all of
// them for the optimizers whose options the checkpoints know, the learning rate for others.
std::vector<std::pair<std::string, double>> group_options(const torch::optim::OptimizerOptions& o) {
  using namespace torch::optim;
  if (const auto* sgd = dynamic_cast<const SGDOptions*>(&o))
    return {{"lr", sgd->lr()},
            {"momentum", sgd->momentum()},
            {"dampening", sgd->dampening()},
            {"weight_decay", sgd->weight_decay()},
            {"nesterov", sgd->nesterov() ? 1.0 : 0.0}};
  const auto adam_like = [](const auto& a) -> std::vector<std::pair<std::string, double>> {
    return {
        {"lr", a.lr()},   {"beta1", std::get<0>(a.betas())},  {"beta2", std::get<1>(a.betas())},
        {"eps", a.eps()}, {"weight_decay", a.weight_decay()}, {"amsgrad", a.amsgrad() ? 1.0 : 0.0}};
  };
  if (const auto* adam = dynamic_cast<const AdamOptions*>(&o)) return adam_like(*adam);
  if (const auto* adamw = dynamic_cast<const AdamWOptions*>(&o)) return adam_like(*adamw);
  try {
    return {{"lr", o.get_lr()}};
  } catch (const std::exception&) {  // an OptimizerOptions of one's own without get_lr
    return {};
  }
}

std::vector<AgreedValue> optimizer_agreement(const torch::optim::Optimizer& optimizer) {
  const auto& groups = optimizer.param_groups();
  std::vector<AgreedValue> v = {{"optimizer param groups", std::to_string(groups.size())}};
  for (std::size_t g = 0; g < groups.size(); ++g) {
    const std::string group = "param group " + std::to_string(g);
    v.push_back({group + " parameters", std::to_string(groups[g].params().size())});
    if (groups[g].has_options())
      for (const auto& [key, value] : group_options(groups[g].options()))
        v.push_back({group + " " + key, exact_text(value)});
  }
  return v;
}

// The trainable parameters as the strategy gets them (model.params filled); `prepared`: the
// models prepared before.
std::vector<ParamRef> collect_parameters(
    PreparedTensors& model, const ModuleTensors& tensors, torch::optim::Optimizer& optimizer,
    const std::vector<std::unique_ptr<PreparedTensors>>& prepared) {
  // ZeRO lays out one flat buffer per optimizer param group (and dtype).
  std::unordered_map<const void*, std::size_t> group_of;
  for (std::size_t g = 0; g < optimizer.param_groups().size(); ++g)
    for (const at::Tensor& p : optimizer.param_groups()[g].params())
      group_of.emplace(p.unsafeGetTensorImpl(), g);
  // A parameter another prepared model has (a shared embedding) would be synchronised twice.
  std::unordered_set<const void*> elsewhere;
  for (const auto& other : prepared)
    for (const at::Tensor& p : other->params) elsewhere.insert(p.unsafeGetTensorImpl());
  std::vector<ParamRef> refs;
  std::unordered_set<const void*> seen;
  for (const auto& [name, p] : tensors.trainable) {
    ACCEL_CHECK_ARG(!elsewhere.count(p.unsafeGetTensorImpl()),
                    "prepare: parameter '" + name +
                        "' belongs to a model prepared before; a parameter two prepared models "
                        "share would be synchronised twice: prepare the model holding both");
    seen.insert(p.unsafeGetTensorImpl());
    const Buffer data = tensor_buffer(p, "parameter '" + name + "'");
    const auto group = group_of.find(p.unsafeGetTensorImpl());
    // Gradients asked of the strategy (backend.hpp's contract): its slots (DDP, ZeRO-1,
    // DataParallel), or autograd's own, lent to it (ZeRO-2).
    // The param group is ZeRO's flat buffer and, under every strategy, the coordinates the
    // optimizer state is saved in; a parameter the optimizer does not hold (DDP only) gets a
    // group of its own, which has no state.
    refs.push_back({name, data, gradient_wanted(data),
                    group != group_of.end() ? group->second : optimizer.param_groups().size(),
                    p.sizes().vec()});
    model.params.push_back(p);
  }
  for (const auto& group : optimizer.param_groups())
    for (const at::Tensor& p : group.params())
      ACCEL_CHECK_ARG(seen.count(p.unsafeGetTensorImpl()),
                      "prepare: the optimizer holds a parameter that is not a trainable "
                      "parameter of the model, so its gradient would never be synchronised");
  return refs;
}

std::vector<Buffer> collect_buffers(PreparedTensors& model, const ModuleTensors& tensors) {
  std::vector<Buffer> buffers;
  for (const auto& [name, tensor] : tensors.buffers) {
    buffers.push_back(tensor_buffer(tensor, "buffer '" + name + "'"));
    model.buffers.push_back(tensor);
    model.buffer_data.push_back(buffers.back().data);
  }
  return buffers;
}

// The options of a slice tensor for `segment` (its group's parameters' dtype and device).
at::TensorOptions segment_options(const PreparedTensors& model, const Strategy& strategy,
                                  const ParamSegment& segment) {
  const std::vector<ParamRef>& refs = strategy.params();
  for (std::size_t i = 0; i < refs.size(); ++i)
    if (refs[i].group == segment.group && refs[i].data.dtype == segment.values.dtype)
      return model.params[i].options();
  throw InvalidArgument("prepare: no parameter of param group " + std::to_string(segment.group) +
                        " for the strategy's segment");
}

// Under ZeRO: parameters into the flat buffers, the optimizer onto the slices.
void shard_optimizer(PreparedTensors& model, Strategy& z, torch::optim::Optimizer& optimizer) {
  torch::NoGradGuard no_grad;
  // The parameters become views of the flat buffers (which hold their values since prepare),
  // so the all-gather after each step updates the model in place.
  if (z.has_param_slots()) {
    for (std::size_t i = 0; i < model.params.size(); ++i) {
      const Buffer view = z.param_slot(i);
      model.params[i].set_data(
          at::from_blob(view.data, model.params[i].sizes(), model.params[i].options()));
    }
    z.use_param_slots();
  }
  model.sharded_optimizer = &optimizer;
  auto& groups = optimizer.param_groups();
  for (auto& group : groups) group.params().clear();
  // One tensor per flat buffer: this rank's slice, its .grad() the reduced gradient slice,
  // with the options of a parameter of its group and dtype.
  for (const ParamSegment& segment : z.segments()) {
    const auto options = segment_options(model, z, segment);
    const auto n = std::int64_t(segment.values.count);
    at::Tensor slice = at::from_blob(segment.values.data, {n}, options);
    slice.mutable_grad() = at::from_blob(segment.grad.data, {n}, options);
    groups[segment.group].params().push_back(slice);
    model.slices.push_back(slice);
  }
}

// The tensors the optimizer holds for the strategy's segments, in order (its state's keys):
// this rank's slices (ZeRO), the parameters (DDP; undefined for one in no param group).
std::vector<at::Tensor> optimizer_tensors(const PreparedTensors& model, Strategy& strategy) {
  if (model.sharded_optimizer) return model.slices;  // ZeRO: one slice per segment, in order
  // DDP: the segments are the parameters (by group); the optimizer holds those of its groups.
  const std::size_t groups = model.optimizer->optimizer().param_groups().size();
  std::unordered_map<const void*, const at::Tensor*> by_data;
  for (const at::Tensor& p : model.params) by_data.emplace(p.data_ptr(), &p);
  std::vector<at::Tensor> out;
  for (const ParamSegment& s : strategy.segments()) {
    const auto it = by_data.find(s.values.data);
    out.push_back(s.group < groups && it != by_data.end() ? *it->second : at::Tensor());
  }
  return out;
}

}  // namespace

// Runs after AccumulateGrad has added a micro-batch's gradient into param.grad() (PyTorch's
// DDP reducer hooks the same node): the earliest moment the gradient is final.
class TorchAccelerator::GradReadyHook final : public torch::autograd::FunctionPostHook {
 public:
  GradReadyHook(TorchAccelerator& accelerator, PreparedTensors& model, std::size_t index)
      : accelerator_(accelerator), model_(model), index_(index) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list&) override {
    accelerator_.on_grad_accumulated(model_, index_);
    return outputs;
  }

 private:
  TorchAccelerator& accelerator_;
  PreparedTensors& model_;
  std::size_t index_;
};

// The steps are prepare_tensors' helpers below; in order: what the strategy gets, the
// replicas, the strategy, the gradients' storage and hooks, ZeRO's slices, the checkpoints.
AcceleratedOptimizer& TorchAccelerator::prepare_module(torch::nn::Module& module,
                                                       torch::optim::Optimizer& optimizer,
                                                       ReplicaFactory make_replica) {
  return prepare_tensors(module_tensors(module), optimizer, make_replica);
}

AcceleratedOptimizer& TorchAccelerator::prepare_script(const torch::jit::Module& module,
                                                       torch::optim::Optimizer& optimizer) {
  ACCEL_CHECK_ARG(data_parallel_replicas() == 1,
                  "prepare: DATA_PARALLEL replicates a torch::nn::Module (module->clone()); a "
                  "TorchScript module cannot be cloned into replicas: use MULTI_CPU or ZERO");
  return prepare_tensors(module_tensors(module), optimizer);
}

AcceleratedOptimizer& TorchAccelerator::prepare_tensors(const ModuleTensors& tensors,
                                                        torch::optim::Optimizer& optimizer,
                                                        const ReplicaFactory& make_replica) {
  for (const auto& other : prepared_)
    ACCEL_CHECK_ARG(&other->optimizer->optimizer() != &optimizer,
                    "prepare: this optimizer was already prepared with " +
                        prepared_name("model", other->index) + " (one optimizer per model)");
  check_can_prepare_another();
  auto owned = std::make_unique<PreparedTensors>();
  PreparedTensors& model = *owned;
  model.module = tensors.module;
  std::vector<ParamRef> refs = collect_parameters(model, tensors, optimizer, prepared_);
  std::vector<Buffer> buffers = collect_buffers(model, tensors);
  // On a GPU the loop computes on LibTorch's current stream of the parameters' device: the
  // communicator orders its collectives and the strategies their copies against it. Debian's
  // LibTorch is CPU-only, so this is compiled only against a CUDA-enabled one; without it the
  // compute stream stays the legacy default stream, which is LibTorch's default stream too.
#if ACCEL_TORCH_WITH_CUDA
  if (!model.params.empty() && model.params[0].is_cuda())
    set_cuda_stream(c10::cuda::getCurrentCUDAStream(model.params[0].device().index()).stream());
#endif
  // DATA_PARALLEL's copies (none for one replica; DATA_PARALLEL takes one model)
  if (tensors.module != nullptr && prepared_.empty())
    replicas_ = std::make_unique<TorchReplicas>(
        *tensors.module, refs.size(), strategy_options_to_prepare().data_parallel, make_replica);
  agree_at_prepare(optimizer_agreement(optimizer));
  const std::size_t ungrouped = optimizer.param_groups().size();
  std::vector<std::string> names;
  for (const ParamRef& r : refs) names.push_back(r.group == ungrouped ? r.name : std::string());
  // The units, before the strategy lays out its buffers: under ZeRO-3 each parameter's.
  StrategyOptions& options = strategy_options_to_prepare();
  const bool stage3 = options.kind == StrategyKind::zero && options.zero.stage == 3;
  ACCEL_CHECK_ARG(!stage3 || tensors.module != nullptr,
                  "zero_stage 3: a TorchScript module has no forward the accelerator can gather "
                  "its parameters around; prepare a torch::nn::Module, or use zero_stage 2");
  std::optional<UnitPlan> units;
  if (tensors.module != nullptr)
    units = plan_units(*tensors.module, model.params, stage3, auto_wrap_policy(),
                       activation_checkpointing());
  options.zero.root_unit = stage3 && units->units() > 1;
  for (std::size_t i = 0; stage3 && i < refs.size(); ++i) refs[i].unit = units->unit_of[i];
  TensorNames tensor_names = names_of(tensors);
  model.index = prepare_parameters(std::move(refs), std::move(buffers));  // broadcasts
  name_tensors(model.index, std::move(tensor_names));
  prepared_.push_back(std::move(owned));
  Strategy& strategy = this->strategy(model.index);
  if (units)
    model.units = std::make_unique<Zero3Units>(std::move(*units), strategy, model.params,
                                               in_backward_, activation_checkpointing());
  const bool sharded = strategy.gradients_sharded();
  for (const std::string& name : names)
    ACCEL_CHECK_ARG(!sharded || name.empty(),
                    "prepare: parameter '" + name +
                        "' is in no param group of the optimizer; under ZeRO the optimizer "
                        "owns every trainable parameter's slice");
  hook_gradients(model);
  // Asked while the param groups still hold the parameters themselves.
  const bool flat_state = torch_optimizer_state::unsupported_reason(optimizer).empty();
  std::vector<std::vector<at::Tensor>> groups;  // as the model holds them, before ZeRO's slices
  for (const auto& group : optimizer.param_groups()) groups.push_back(group.params());
  if (sharded) shard_optimizer(model, strategy, optimizer);
  if (strategy.replicas() != nullptr) replicas_->attach(strategy);
  model.optimizer = std::make_unique<AcceleratedOptimizer>(static_cast<OptimizerHost&>(*this),
                                                           model.index, optimizer, groups);
  register_checkpoint_states(model, tensors, optimizer, flat_state, sharded);
  return *model.optimizer;
}

torch::optim::Optimizer& detail::optimizer_of(
    const std::vector<at::Tensor>& parameters,
    const std::vector<torch::optim::Optimizer*>& optimizers) {
  std::unordered_set<const void*> mine;
  for (const at::Tensor& p : parameters) mine.insert(p.unsafeGetTensorImpl());
  torch::optim::Optimizer* found = nullptr;
  for (torch::optim::Optimizer* optimizer : optimizers)
    for (const auto& group : optimizer->param_groups())
      for (const at::Tensor& p : group.params())
        if (mine.count(p.unsafeGetTensorImpl())) {
          ACCEL_CHECK_ARG(found == nullptr || found == optimizer,
                          "prepare: two optimizers given hold parameters of one model");
          found = optimizer;
        }
  ACCEL_CHECK_ARG(found != nullptr,
                  "prepare: no optimizer given holds the parameters of a model given (each model "
                  "needs its optimizer in the same call)");
  return *found;
}

void TorchAccelerator::hook_gradients(PreparedTensors& model) {
  Strategy& strategy = this->strategy(model.index);
  if (model.units) {
    if (strategy.parameters_sharded()) model.units->shard();  // ZeRO-3: storage to the strategy
    model.units->attach_blocks();
  }
  for (std::size_t i = 0; i < model.params.size(); ++i) {
    at::Tensor& param = model.params[i];
    // The parameter holds its AccumulateGrad node only weakly: without our reference a new
    // node (without the hook) would be made for the next graph.
    std::shared_ptr<torch::autograd::Node> node = torch::autograd::impl::grad_accumulator(param);
    ACCEL_CHECK_ARG(node != nullptr, "prepare: parameter without a gradient accumulator");
    model.hook_keys.push_back(
        node->add_post_hook(std::make_unique<GradReadyHook>(*this, model, i)));
    model.accumulators.push_back(std::move(node));
  }
  // Each .grad() at its bucket slot (DDP, ZeRO-1), or autograd's own lent (ZeRO-2/3).
  model.gradients = std::make_unique<ModelGradients>(strategy, model.params, model.accumulators);
}

void TorchAccelerator::register_checkpoint_states(PreparedTensors& model,
                                                  const ModuleTensors& tensors,
                                                  torch::optim::Optimizer& optimizer,
                                                  bool flat_state, bool sharded) {
  PreparedTensors* m = &model;
  // state_dict_type FULL_STATE_DICT: the model as a LibTorch archive (loadable without
  // accelerate-cpp) instead of the Accelerator's raw parameter blob: "model", "model_1" ...
  // SHARDED_STATE_DICT keeps the blob: each rank's slices under ZeRO (nothing gathered) and
  // the layout that reshards them; accel merge-weights makes the archive.
  if (state_dict_type() != config::StateDictType::SHARDED_STATE_DICT) {
    set_checkpoint_parameters(false);
    std::function<void(const std::string&)> load_model = tensors.load;
    if (model.units && model.units->active())  // ZeRO-3: read whole, each rank keeps its slices
      load_model = [m, load = tensors.load](const std::string& bytes) {
        m->units->load_archive(load, bytes);
      };
    register_state(prepared_name("model", model.index), tensors.save, load_model);
  }
  // Without flat state: the whole LibTorch archive (under ZeRO each rank's own, its slices, so
  // such a checkpoint resumes with the same number of processes only). With it: the param
  // groups' options (learning rates ...) from rank 0 as a LibTorch archive, and below the
  // per-parameter state in flat coordinates, as the built-in optimizers' ("optimizer" under
  // DDP, "optimizer.rankR" under ZeRO), so any strategy and number of processes resumes.
  // Either way the rates saved are the prepared optimizer's (a scheduler may have changed them
  // since its last step), and a load gives them to it.
  using Save = std::string (*)(torch::optim::Optimizer&);
  using Load = void (*)(torch::optim::Optimizer&, const std::string&);
  const Save save = flat_state
                        ? Save(torch_state::save_optimizer_options)
                        : [](torch::optim::Optimizer& o) { return torch_state::save_optimizer(o); };
  const Load load = flat_state ? torch_state::load_optimizer_options : torch_state::load_optimizer;
  register_state(
      prepared_name("optimizer", model.index),
      [m, &optimizer, save] {
        m->optimizer->sync_learning_rates();
        return save(optimizer);
      },
      [m, &optimizer, load](const std::string& bytes) {
        load(optimizer, bytes);
        m->optimizer->adopt_learning_rates();
      },
      !flat_state && sharded ? StateScope::per_rank : StateScope::shared);
  if (!flat_state) return;
  register_optimizer_state(
      model.index,
      [this, m, &optimizer] {
        return torch_optimizer_state::save(optimizer, strategy(m->index).segments(),
                                           optimizer_tensors(*m, strategy(m->index)));
      },
      [this, m, &optimizer](const std::string& bytes, const std::string& where) {
        return torch_optimizer_state::load(optimizer, strategy(m->index).segments(),
                                           optimizer_tensors(*m, strategy(m->index)), bytes, where);
      });
}

}  // namespace accel
