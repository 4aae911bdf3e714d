// ZeRO-3 for LibTorch models (sharded_unit.hpp says what a unit is). LibTorch modules have no
// forward hooks, so the prepared call (the root, a Sequential's children) and ShardedUnit's
// forward gather; autograd functions and the gradient hooks do the backward:
//  - a parameter keeps its tensor (the model, the optimizer's aliases and autograd's saved
//    tensors share its StorageImpl); that storage points into the strategy's gathered slot
//    while its unit is gathered (Strategy::gathered_view) and is empty otherwise, so saved
//    views see the values gathered again for the backward, and nothing of it stays allocated;
//  - UnitOutput, on a unit's output, gathers the unit when the output's gradient arrives,
//    before the unit's own backward; UnitInputs, on its inputs, releases it once their
//    gradients are computed, as does the last of its gradients to be accumulated (a unit whose
//    inputs need no gradient), and the end of backward() whatever is left;
//  - the root is gathered by the prepared call and stays gathered to the end of backward()
//    (without grad mode, to the end of the call): parameters tied across units belong to it;
//  - every sharded parameter is watched (sharded_parameter_access.hpp): an automatic unit (a
//    ModuleList's or Sequential's child) is gathered when one of its parameters is first used
//    in the forward or the backward, and the one gathered before it released; any other use
//    of a released parameter is refused, naming it.

#include <c10/core/Allocator.h>
#include <c10/core/StorageImpl.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/grad_mode.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/container/sequential.h>

#include <map>
#include <unordered_map>

#include "accelerate/parameter_layout.hpp"
#include "accelerate/prepared_parameters.hpp"
#include "accelerate/torch/prepared_tensors.hpp"
#include "accelerate/torch/sharded_parameter_access.hpp"
#include "accelerate/torch/sharded_unit.hpp"
#include "accelerate/torch/tensor_buffer.hpp"
#include "accelerate/torch/torch_accelerator.hpp"
#include "config/config.hpp"
#include "core/error.hpp"

namespace accel {
namespace {

using State = ShardedUnits::State;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// A unit's place for the autograd functions: the accelerator, the model and the unit.
void remember(AutogradContext* ctx, TorchAccelerator* accelerator, std::size_t model,
              std::size_t unit) {
  ctx->saved_data["accelerator"] = std::int64_t(reinterpret_cast<std::intptr_t>(accelerator));
  ctx->saved_data["model"] = std::int64_t(model);
  ctx->saved_data["unit"] = std::int64_t(unit);
}

TorchAccelerator& accelerator_of(AutogradContext* ctx) {
  return *reinterpret_cast<TorchAccelerator*>(
      std::intptr_t(ctx->saved_data["accelerator"].toInt()));
}

class UnitOutput : public torch::autograd::Function<UnitOutput> {
 public:
  static at::Tensor forward(AutogradContext* ctx, std::int64_t accelerator, std::int64_t model,
                            std::int64_t unit, const at::Tensor& out) {
    remember(ctx, reinterpret_cast<TorchAccelerator*>(std::intptr_t(accelerator)),
             std::size_t(model), std::size_t(unit));
    return out.view_as(out);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    accelerator_of(ctx).unit_backward_begins(std::size_t(ctx->saved_data["model"].toInt()),
                                             std::size_t(ctx->saved_data["unit"].toInt()));
    return {at::Tensor(), at::Tensor(), at::Tensor(), grads[0]};
  }
};

class UnitInputs : public torch::autograd::Function<UnitInputs> {
 public:
  static variable_list forward(AutogradContext* ctx, std::int64_t accelerator, std::int64_t model,
                               std::int64_t unit, at::TensorList inputs) {
    remember(ctx, reinterpret_cast<TorchAccelerator*>(std::intptr_t(accelerator)),
             std::size_t(model), std::size_t(unit));
    variable_list out;
    for (const at::Tensor& t : inputs) out.push_back(t.view_as(t));
    return out;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    accelerator_of(ctx).unit_backward_ends(std::size_t(ctx->saved_data["model"].toInt()),
                                           std::size_t(ctx->saved_data["unit"].toInt()));
    variable_list out = {at::Tensor(), at::Tensor(), at::Tensor()};
    for (at::Tensor& g : grads) out.push_back(std::move(g));
    return out;
  }
};

c10::StorageImpl& storage_of(const at::Tensor& p) {
  return *p.unsafeGetTensorImpl()->storage().unsafeGetStorageImpl();
}

// The parameter's values at `view` (not owned), or nowhere (a read then fails).
void point_at(const at::Tensor& p, const Buffer& view) {
  c10::StorageImpl& storage = storage_of(p);
  storage.set_data_ptr_noswap(at::DataPtr(view.data, p.device()));
  storage.set_nbytes(view.data != nullptr ? view.bytes() : 0);
}

// The parameter's own storage again (a copy of `from` when given).
void own_storage(const at::Tensor& p, const Buffer* from) {
  const std::size_t bytes = std::size_t(p.numel()) * p.element_size();
  at::DataPtr data = c10::GetAllocator(p.device().type())->allocate(bytes);
  if (from != nullptr && from->data != nullptr) {
    const Buffer to{data.get(), from->count, from->dtype, from->device};
    copy_buffer(to, *from, DeviceStream{});
  }
  c10::StorageImpl& storage = storage_of(p);
  storage.set_data_ptr_noswap(std::move(data));
  storage.set_nbytes(bytes);
}

bool any_requires_grad(const std::vector<at::Tensor>& tensors) {
  for (const at::Tensor& t : tensors)
    if (t.defined() && t.requires_grad()) return true;
  return false;
}

}  // namespace

// ---- ShardedUnitBase

at::Tensor ShardedUnitBase::run(std::vector<at::Tensor> inputs, const UnitFn& fn,
                                bool checkpointable) {
  return accelerator_->run_unit(model_, unit_, std::move(inputs), fn, checkpointable);
}

// ---- prepare

void TorchAccelerator::assign_units(PreparedTensors& model, const ModuleTensors& tensors,
                                    std::vector<ParamRef>& refs) {
  StrategyOptions& options = strategy_options_to_prepare();
  options.zero.root_unit = false;
  const bool stage3 = options.kind == StrategyKind::zero && options.zero.stage == 3;
  ACCEL_CHECK_ARG(!stage3 || tensors.module != nullptr,
                  "zero_stage 3: a TorchScript module has no forward the accelerator can gather "
                  "its parameters around; prepare a torch::nn::Module, or use zero_stage 2");
  if (tensors.module == nullptr) return;
  torch::nn::Module& root = *tensors.module;
  // The units' modules by name: the ShardedUnits anywhere (activation checkpointing applies
  // to them under every strategy), else under ZeRO-3 a root Sequential's children.
  std::vector<std::pair<std::string, torch::nn::Module*>> units;
  for (const auto& item : root.named_modules("", /*include_self=*/false))
    if (auto* wrapped = dynamic_cast<ShardedUnitBase*>(item.value().get())) {
      for (const auto& [outer, module] : units)
        ACCEL_CHECK_ARG(item.key().rfind(outer + ".", 0) != 0,
                        "prepare: ShardedUnit '" + item.key() + "' is inside ShardedUnit '" +
                            outer + "'; units do not nest: wrap one of them");
      units.emplace_back(item.key(), item.value().get());
      model.units.wrappers.emplace_back(item.value(), wrapped);
    }
  const auto is_container = [](const torch::nn::Module& m) {
    return dynamic_cast<const torch::nn::SequentialImpl*>(&m) != nullptr ||
           dynamic_cast<const torch::nn::ModuleListImpl*>(&m) != nullptr;
  };
  if (stage3 && units.empty() && dynamic_cast<torch::nn::SequentialImpl*>(&root) != nullptr) {
    for (const auto& item : root.named_children())
      units.emplace_back(item.key(), item.value().get());
    model.units.sequential = true;
  } else if (stage3 && units.empty() && auto_wrap_policy() != config::AutoWrapPolicy::NO_WRAP) {
    // The children of each outermost ModuleList or Sequential (a transformer's layers).
    for (const auto& item : root.named_modules("", /*include_self=*/false)) {
      if (!is_container(*item.value())) continue;
      bool inside = false;
      for (const auto& [outer, module] : units)
        inside = inside || item.key().rfind(outer + ".", 0) == 0;
      if (inside) continue;
      for (const auto& child : item.value()->named_children())
        units.emplace_back(item.key() + "." + child.key(), child.value().get());
    }
    model.units.automatic = !units.empty();
  }
  check_checkpointable(root, !model.units.wrappers.empty());
  const auto unit_of_name = [&](const std::string& name) -> std::size_t {
    for (std::size_t k = 0; k < units.size(); ++k)
      if (name.rfind(units[k].first + ".", 0) == 0) return k + 1;
    return 0;
  };
  // A parameter under names in two units (tied) belongs to the root, gathered around both;
  // neither unit is recomputed (activation checkpointing): each recompute's backward would
  // report its gradient once more.
  model.units.recomputable.assign(units.size() + 1, true);
  std::unordered_map<const void*, std::size_t> unit_of_tensor;
  for (const auto& item : root.named_parameters(/*recurse=*/true)) {
    const void* key = item.value().unsafeGetTensorImpl();
    const std::size_t u = unit_of_name(item.key());
    const auto [it, fresh] = unit_of_tensor.emplace(key, u);
    if (fresh || it->second == u) continue;
    model.units.recomputable[u] = model.units.recomputable[it->second] = false;
    it->second = 0;
  }
  if (!stage3) return;
  for (std::size_t i = 0; i < refs.size(); ++i)
    refs[i].unit = unit_of_tensor.at(model.params[i].unsafeGetTensorImpl());
  options.zero.root_unit = !units.empty();
  model.units.names.push_back("");
  for (const auto& [name, module] : units) model.units.names.push_back(name);
  model.units.params.resize(units.size() + 1);
  model.units.state.assign(units.size() + 1, State::released);
  model.units.pending.assign(units.size() + 1, 0);
  for (const ParamRef& r : refs) model.units.unit_of.push_back(r.unit);
}

// activation_checkpointing recomputes a root Sequential's children and the ShardedUnits: in
// any other model the switch could do nothing (LibTorch C++ modules have no forward hooks,
// so a ModuleList's children run where the model's forward calls them), which is refused.
void TorchAccelerator::check_checkpointable(const torch::nn::Module& root, bool wrapped) const {
  if (!activation_checkpointing() || wrapped ||
      dynamic_cast<const torch::nn::SequentialImpl*>(&root) != nullptr)
    return;
  std::string lists;
  for (const auto& item : root.named_modules("", /*include_self=*/false))
    if (dynamic_cast<const torch::nn::ModuleListImpl*>(item.value().get()) != nullptr)
      lists += (lists.empty() ? " (its ModuleList '" : "', '") + item.key();
  if (!lists.empty()) lists += "')";
  ACCEL_CHECK_ARG(false, "activation_checkpointing: nothing in the model " + root.name() + lists +
                             " can be recomputed: LibTorch C++ modules have no forward hooks, so "
                             "only a prepared Sequential's children and accel::ShardedUnit "
                             "blocks are checkpointed by the switch; wrap the block type in "
                             "accel::ShardedUnit<BlockImpl> (one line per block), call "
                             "accel::checkpoint(fn, x) in the forward, or set "
                             "activation_checkpointing false");
}

void TorchAccelerator::attach_units(PreparedTensors& model) {
  for (std::size_t k = 0; k < model.units.wrappers.size(); ++k)
    model.units.wrappers[k].second->attach(this, model.index, k + 1);
}

void TorchAccelerator::shard_parameters(PreparedTensors& model) {
  Strategy& strategy = this->strategy(model.index);
  ShardedUnits& units = model.units;
  units.active = true;
  for (std::size_t i = 0; i < model.params.size(); ++i) {
    const at::Tensor& p = model.params[i];
    ACCEL_CHECK_ARG(p.storage_offset() == 0 &&
                        storage_of(p).nbytes() == std::size_t(p.numel()) * p.element_size(),
                    "zero_stage 3: parameter '" + strategy.params()[i].name +
                        "' is a view into a larger tensor's storage; its storage cannot be "
                        "released: make it a tensor of its own");
  }
  strategy.use_gathered_views();
  // Nothing is gathered now: the persistent parameters have their views (kept gathered), the
  // others none, which frees the memory they had.
  units.sharded.assign(model.params.size(), false);
  for (std::size_t i = 0; i < model.params.size(); ++i) {
    const Buffer view = strategy.gathered_view(i);
    point_at(model.params[i], view);
    if (view.data == nullptr && view.count > 0) {
      units.sharded[i] = true;
      units.params[units.unit_of[i]].push_back(i);
      watch_sharded_parameter(model.params[i], *this, model.index, i);
    }
  }
}

void TorchAccelerator::sharded_parameter_used(std::size_t index, std::size_t i, bool released) {
  PreparedTensors& model = *prepared_.at(index);
  ShardedUnits& units = model.units;
  const std::size_t u = units.unit_of.at(i);
  if (!released) {
    // Kept since its forward: its backward holds it, and releases it once its gradients are in.
    if (units.automatic && u != 0 && units.state[u] == State::kept && in_backward_.load()) {
      gather_unit_for(model, u, UnitPass::backward);
      units.pending[u] = units.params[u].size();
    }
    return;
  }
  const std::string& name = strategy(index).params()[i].name;
  const bool backward = in_backward_.load();
  if (backward && u == 0) {
    // A graph from an earlier forward, whose root an earlier backward() released (a GAN's
    // generator, reached again through the discriminator): gathered for this backward.
    gather_unit_for(model, 0, UnitPass::backward);
    return;
  }
  // The root is gathered from the prepared call's start to the end of backward().
  ACCEL_CHECK_ARG(backward || units.state[0] != State::released,
                  "ZeRO-3: parameter '" + name +
                      "' was used outside the prepared model's call, where this rank holds only "
                      "its slice: call the model prepare returned, model(x), not "
                      "model->forward(x) (acc.get_state_dict(model) gives the whole values)");
  ACCEL_CHECK_ARG(units.automatic && u != 0,
                  "ZeRO-3: parameter '" + name + "' of unit '" + units.names[u] +
                      "' was used while that unit is not gathered (outside its forward and "
                      "backward)");
  // At most one automatic unit in use: the one used before this one is done with.
  const State in_use = backward ? State::backward : State::forward;
  for (std::size_t v = 1; v < units.state.size(); ++v)
    if (v != u && units.state[v] == in_use)
      release_unit_for(model, v, backward ? UnitPass::backward : UnitPass::forward);
  if (backward) {
    gather_unit_for(model, u, UnitPass::backward);
    units.pending[u] = units.params[u].size();
  } else {
    gather_unit_for(model, u, UnitPass::forward);
  }
}

// ---- gathering

void TorchAccelerator::point_unit(PreparedTensors& model, std::size_t unit) {
  Strategy& strategy = this->strategy(model.index);
  for (std::size_t i : model.units.params[unit])
    point_at(model.params[i], strategy.gathered_view(i));
}

void TorchAccelerator::gather_unit_for(PreparedTensors& model, std::size_t unit, UnitPass pass) {
  ShardedUnits& units = model.units;
  if (!units.params[unit].empty()) {
    strategy(model.index).gather_unit(unit, pass);
    point_unit(model, unit);
  }
  units.state[unit] = pass == UnitPass::forward ? State::forward : State::backward;
}

void TorchAccelerator::release_unit_for(PreparedTensors& model, std::size_t unit, UnitPass pass) {
  ShardedUnits& units = model.units;
  if (units.params[unit].empty()) {
    units.state[unit] = State::released;
    return;
  }
  strategy(model.index).release_unit(unit, pass);
  settle(model, unit);
}

void TorchAccelerator::settle(PreparedTensors& model, std::size_t unit) {
  ShardedUnits& units = model.units;
  point_unit(model, unit);
  // reshard_after_forward false: the strategy keeps a released unit to its backward.
  units.state[unit] =
      !units.params[unit].empty() &&
              strategy(model.index).gathered_view(units.params[unit].front()).data != nullptr
          ? State::kept
          : State::released;
}

TorchAccelerator::RootForward TorchAccelerator::root_forward(const torch::nn::Module& module) {
  if (prepared_.empty()) return {};
  const std::size_t index = index_of_module(module);
  PreparedTensors& model = *prepared_[index];
  if (!model.units.active) return {};
  const State state = model.units.state[0];
  if (state != State::forward && state != State::backward)
    gather_unit_for(model, 0, UnitPass::forward);
  return RootForward(this, index, model.units.sequential);
}

void TorchAccelerator::finish_root_forward(std::size_t index) {
  PreparedTensors& model = *prepared_[index];
  // The last automatic unit the forward used (the others were released as it went on).
  for (std::size_t u = 1; model.units.automatic && u < model.units.state.size(); ++u)
    if (model.units.state[u] == State::forward) release_unit_for(model, u, UnitPass::forward);
  // With grad mode the root stays gathered for its backward (released at backward()'s end).
  if (!torch::GradMode::is_enabled() && model.units.state[0] == State::forward)
    release_unit_for(model, 0, UnitPass::forward);
}

TorchAccelerator::RootForward::~RootForward() {
  if (accelerator_ == nullptr) return;
  try {
    accelerator_->finish_root_forward(model_);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ZeRO-3: releasing the root unit after the forward failed: %s\n",
                 e.what());
  }
}

at::Tensor TorchAccelerator::run_unit(
    std::size_t index, std::size_t unit, std::vector<at::Tensor> inputs,
    const std::function<at::Tensor(const std::vector<at::Tensor>&)>& fn, bool checkpointable) {
  PreparedTensors& model = *prepared_.at(index);
  ShardedUnits& units = model.units;
  const bool grad = torch::GradMode::is_enabled();
  const bool recompute =
      checkpointable && grad && activation_checkpointing() && units.recomputable.at(unit);
  if (!units.active) return recompute ? checkpoint_function(fn, inputs) : fn(inputs);
  ACCEL_CHECK_ARG(units.params[0].empty() || units.state[0] != State::released,
                  "ZeRO-3: unit '" + units.names[unit] +
                      "' ran outside the prepared model's call, where the root's parameters "
                      "(e.g. '" +
                      strategy(index).params()[units.params[0].front()].name +
                      "') are not gathered: call the model prepare returned, model(x), not "
                      "model->forward(x)");
  const auto self = std::int64_t(reinterpret_cast<std::intptr_t>(this));
  if (grad && any_requires_grad(inputs)) {
    variable_list through =
        UnitInputs::apply(self, std::int64_t(index), std::int64_t(unit), at::TensorList(inputs));
    inputs.assign(through.begin(), through.end());
  }
  // Already gathered: for its backward (a recompute in backward), or the forward of a unit
  // called twice inside one forward.
  const bool gather_here =
      units.state[unit] != State::forward && units.state[unit] != State::backward;
  if (gather_here) gather_unit_for(model, unit, UnitPass::forward);
  at::Tensor out;
  try {
    out = recompute ? checkpoint_function(fn, inputs) : fn(inputs);
  } catch (...) {
    if (gather_here) release_unit_for(model, unit, UnitPass::forward);
    throw;
  }
  if (gather_here) release_unit_for(model, unit, UnitPass::forward);
  ACCEL_CHECK_ARG(out.defined(), "ZeRO-3: unit " + std::to_string(unit) + " returned no tensor");
  if (grad && out.requires_grad())
    out = UnitOutput::apply(self, std::int64_t(index), std::int64_t(unit), out);
  return out;
}

void TorchAccelerator::unit_backward_begins(std::size_t index, std::size_t unit) {
  PreparedTensors& model = *prepared_.at(index);
  ShardedUnits& units = model.units;
  if (units.state[unit] == State::forward) {
    units.state[unit] = State::backward;  // the root, gathered since its forward
  } else if (units.state[unit] != State::backward) {
    gather_unit_for(model, unit, UnitPass::backward);
  }
  units.pending[unit] = units.params[unit].size();
}

void TorchAccelerator::unit_backward_ends(std::size_t index, std::size_t unit) {
  PreparedTensors& model = *prepared_.at(index);
  if (unit != 0 && model.units.state[unit] == State::backward)
    release_unit_for(model, unit, UnitPass::backward);
}

void TorchAccelerator::unit_gradient_accumulated(PreparedTensors& model, std::size_t i) {
  ShardedUnits& units = model.units;
  if (!units.active || !units.sharded[i]) return;
  const std::size_t u = units.unit_of[i];
  if (u == 0 || units.state[u] != State::backward || units.pending[u] == 0) return;
  if (--units.pending[u] == 0) release_unit_for(model, u, UnitPass::backward);
}

void TorchAccelerator::end_backward_units() {
  for (const auto& model : prepared_)
    if (model->units.active) release_units_in_use(*model);
}

void TorchAccelerator::release_units_in_use(PreparedTensors& model) {
  ShardedUnits& units = model.units;
  for (std::size_t u = 0; u < units.state.size(); ++u)
    if (units.state[u] == State::forward || units.state[u] == State::backward)
      release_unit_for(model, u, UnitPass::backward);
}

void TorchAccelerator::settle_all(PreparedTensors& model) {
  ShardedUnits& units = model.units;
  if (!units.active) return;
  for (std::size_t u = 0; u < units.state.size(); ++u) settle(model, u);
}

// ---- whole parameters (checkpoints, get_state_dict)

void TorchAccelerator::for_each_gathered(
    PreparedTensors& model, const std::function<void(std::size_t, const Buffer&)>& use) {
  ShardedUnits& units = model.units;
  Strategy& strategy = this->strategy(model.index);
  for (std::size_t u = 0; u < units.params.size(); ++u) {
    if (units.params[u].empty()) continue;
    ACCEL_CHECK_ARG(units.state[u] == State::released || units.state[u] == State::kept,
                    "ZeRO-3: the whole parameters are wanted while unit " + std::to_string(u) +
                        " is in use (inside a forward or backward)");
    strategy.gather_unit(u, UnitPass::forward);
    for (std::size_t i : units.params[u]) use(i, strategy.gathered_view(i));
    strategy.release_unit(u, UnitPass::forward);
    units.state[u] = State::released;  // the views: settle(), after the use of the copies
  }
}

void TorchAccelerator::before_save_state() {
  // Rank 0 (each machine's first rank, saved on each node) writes the model as a LibTorch
  // archive ("model"): its parameters get whole copies, gathered unit by unit on every rank.
  // SHARDED_STATE_DICT: each rank writes its slices, nothing is gathered.
  if (state_dict_type() == config::StateDictType::SHARDED_STATE_DICT) return;
  const bool keep = writes_shared_checkpoint_files();
  for (const auto& model : prepared_) {
    if (!model->units.active) continue;
    for_each_gathered(*model, [&](std::size_t i, const Buffer& view) {
      if (keep) own_storage(model->params[i], &view);
    });
  }
}

void TorchAccelerator::after_save_state() {
  for (const auto& model : prepared_)
    if (model->units.active) settle_all(*model);  // the copies freed
}

void TorchAccelerator::load_parameter_values(const PreparedParameters& prepared,
                                             const FullParameters& values) {
  PreparedTensors& model = *prepared_.at(prepared.index);
  if (!model.units.active) return Accelerator::load_parameter_values(prepared, values);
  // ZeRO-3 (SHARDED_STATE_DICT): the parameters' storage is the strategy's, which keeps each
  // rank's parts of the whole values.
  release_units_in_use(model);
  std::vector<Buffer> whole;
  for (std::size_t i = 0; i < prepared.params.size(); ++i) {
    const Buffer& like = prepared.params[i].data;
    whole.push_back(
        {const_cast<char*>(values.params[i].data()), like.count, like.dtype, DeviceKind::cpu});
  }
  strategy(model.index).load_parameters(whole);
  settle_all(model);
  copy_buffers_in(prepared, values);
}

void TorchAccelerator::load_sharded_model(PreparedTensors& model, const ModuleTensors& tensors,
                                          const std::string& bytes) {
  // The archive is read into whole (uninitialised) storage, each rank keeps its parts.
  ShardedUnits& units = model.units;
  release_units_in_use(model);
  for (std::size_t i = 0; i < model.params.size(); ++i)
    if (units.sharded[i]) own_storage(model.params[i], nullptr);
  struct Free {
    TorchAccelerator& a;
    PreparedTensors& m;
    ~Free() { a.settle_all(m); }
  } free_after{*this, model};
  tensors.load(bytes);
  std::vector<Buffer> values;
  for (std::size_t i = 0; i < model.params.size(); ++i)
    values.push_back(tensor_buffer(model.params[i], "parameter " + std::to_string(i)));
  strategy(model.index).load_parameters(values);
}

std::vector<std::pair<std::string, at::Tensor>> TorchAccelerator::sharded_state_dict(
    PreparedTensors& model) {
  std::unordered_map<const void*, at::Tensor> whole;
  for_each_gathered(model, [&](std::size_t i, const Buffer& view) {
    const at::Tensor& p = model.params[i];
    whole[p.unsafeGetTensorImpl()] = at::from_blob(view.data, p.sizes(), p.options()).clone();
  });
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& item : model.module->named_parameters(/*recurse=*/true)) {
    const auto it = whole.find(item.value().unsafeGetTensorImpl());
    out.emplace_back(item.key(), it != whole.end() ? it->second : item.value().detach().clone());
  }
  for (const auto& item : model.module->named_buffers(/*recurse=*/true))
    out.emplace_back(item.key(), item.value().detach().clone());
  settle_all(model);
  return out;
}

void TorchAccelerator::detach_units(PreparedTensors& model) {
  for (const auto& [module, wrapper] : model.units.wrappers)
    if (!module.expired()) wrapper->attach(nullptr, 0, 0);
}

void TorchAccelerator::detach_sharded(PreparedTensors& model) {
  ShardedUnits& units = model.units;
  // The persistent parameters' views die with the strategy: copies of their own; the others
  // stay empty (their values are spread over the ranks) and are no longer watched.
  for (std::size_t i = 0; i < model.params.size(); ++i) {
    if (units.sharded[i]) {
      unwatch_sharded_parameter(model.params[i]);
      continue;
    }
    const Buffer view = strategy(model.index).gathered_view(i);
    own_storage(model.params[i], &view);
  }
}

}  // namespace accel
