// ZeRO-3 for LibTorch models (sharded_unit.hpp says what a unit is, zero3_units.hpp the order).
// LibTorch modules have no forward hooks, so the prepared call (the root, a Sequential's children)
// and ShardedUnit's forward gather; autograd functions and the gradient hooks do the backward:
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

#include "accelerate/torch/zero3/detail/zero3_units.hpp"

#include "accelerate/torch/activation_checkpoint.hpp"
#include "accelerate/torch/detail/tensor_buffer.hpp"
#include "accelerate/torch/zero3/sharded_unit.hpp"
#include "foundation/error.hpp"

namespace accel {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// A unit's place for the autograd functions: its model's units and the unit.
void remember(AutogradContext* ctx, std::int64_t units, std::int64_t unit) {
  ctx->saved_data["units"] = units;
  ctx->saved_data["unit"] = unit;
}

Zero3Units& units_of(AutogradContext* ctx) {
  return *reinterpret_cast<Zero3Units*>(std::intptr_t(ctx->saved_data["units"].toInt()));
}

std::size_t unit_of(AutogradContext* ctx) { return std::size_t(ctx->saved_data["unit"].toInt()); }

class UnitOutput : public torch::autograd::Function<UnitOutput> {
 public:
  static at::Tensor forward(AutogradContext* ctx, std::int64_t units, std::int64_t unit,
                            const at::Tensor& out) {
    remember(ctx, units, unit);
    return out.view_as(out);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    units_of(ctx).backward_begins(unit_of(ctx));
    return {at::Tensor(), at::Tensor(), grads[0]};
  }
};

class UnitInputs : public torch::autograd::Function<UnitInputs> {
 public:
  static variable_list forward(AutogradContext* ctx, std::int64_t units, std::int64_t unit,
                               at::TensorList inputs) {
    remember(ctx, units, unit);
    variable_list out;
    for (const at::Tensor& t : inputs) out.push_back(t.view_as(t));
    return out;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    units_of(ctx).backward_ends(unit_of(ctx));
    variable_list out = {at::Tensor(), at::Tensor()};
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

// activation_checkpointing recomputes a root Sequential's children and the ShardedUnits: in
// any other model the switch could do nothing (LibTorch C++ modules have no forward hooks,
// so a ModuleList's children run where the model's forward calls them), which is refused.
void check_checkpointable(const torch::nn::Module& root, bool wrapped) {
  if (wrapped || dynamic_cast<const torch::nn::SequentialImpl*>(&root) != nullptr) return;
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

}  // namespace

// ---- ShardedUnitBase

at::Tensor ShardedUnitBase::run(std::vector<at::Tensor> inputs, const UnitFn& fn,
                                bool checkpointable) {
  return units_->run_unit(unit_, std::move(inputs), fn, checkpointable);
}

// ---- prepare

UnitPlan plan_units(torch::nn::Module& root, const std::vector<at::Tensor>& params, bool stage3,
                    config::AutoWrapPolicy policy, bool activation_checkpointing) {
  UnitPlan plan;
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
      plan.blocks.emplace_back(item.value(), wrapped);
    }
  const auto is_container = [](const torch::nn::Module& m) {
    return dynamic_cast<const torch::nn::SequentialImpl*>(&m) != nullptr ||
           dynamic_cast<const torch::nn::ModuleListImpl*>(&m) != nullptr;
  };
  if (stage3 && units.empty() && dynamic_cast<torch::nn::SequentialImpl*>(&root) != nullptr) {
    for (const auto& item : root.named_children())
      units.emplace_back(item.key(), item.value().get());
    plan.sequential = true;
  } else if (stage3 && units.empty() && policy != config::AutoWrapPolicy::NO_WRAP) {
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
    plan.automatic = !units.empty();
  }
  if (activation_checkpointing) check_checkpointable(root, !plan.blocks.empty());
  const auto unit_of_name = [&](const std::string& name) -> std::size_t {
    for (std::size_t k = 0; k < units.size(); ++k)
      if (name.rfind(units[k].first + ".", 0) == 0) return k + 1;
    return 0;
  };
  // A parameter under names in two units (tied) belongs to the root, gathered around both;
  // neither unit is recomputed (activation checkpointing): each recompute's backward would
  // report its gradient once more.
  plan.recomputable.assign(units.size() + 1, true);
  std::unordered_map<const void*, std::size_t> unit_of_tensor;
  for (const auto& item : root.named_parameters(/*recurse=*/true)) {
    const void* key = item.value().unsafeGetTensorImpl();
    const std::size_t u = unit_of_name(item.key());
    const auto [it, fresh] = unit_of_tensor.emplace(key, u);
    if (fresh || it->second == u) continue;
    plan.recomputable[u] = plan.recomputable[it->second] = false;
    it->second = 0;
  }
  if (!stage3) return plan;
  plan.names.push_back("");
  for (const auto& [name, module] : units) plan.names.push_back(name);
  for (const at::Tensor& p : params)
    plan.unit_of.push_back(unit_of_tensor.at(p.unsafeGetTensorImpl()));
  return plan;
}

Zero3Units::Zero3Units(UnitPlan plan, Strategy& strategy, std::vector<at::Tensor>& params,
                       const std::atomic<bool>& in_backward, bool activation_checkpointing)
    : plan_(std::move(plan)),
      strategy_(strategy),
      params_(params),
      in_backward_(in_backward),
      activation_checkpointing_(activation_checkpointing) {}

Zero3Units::~Zero3Units() = default;

void Zero3Units::attach_blocks() {
  for (std::size_t k = 0; k < plan_.blocks.size(); ++k) plan_.blocks[k].second->attach(this, k + 1);
}

void Zero3Units::detach_blocks() {
  for (const auto& [module, block] : plan_.blocks)
    if (!module.expired()) block->attach(nullptr, 0);
}

void Zero3Units::shard() {
  active_ = true;
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const at::Tensor& p = params_[i];
    ACCEL_CHECK_ARG(p.storage_offset() == 0 &&
                        storage_of(p).nbytes() == std::size_t(p.numel()) * p.element_size(),
                    "zero_stage 3: parameter '" + strategy_.params()[i].name +
                        "' is a view into a larger tensor's storage; its storage cannot be "
                        "released: make it a tensor of its own");
  }
  strategy_.use_gathered_views();
  params_of_.assign(plan_.units(), {});
  state_.assign(plan_.units(), State::released);
  pending_.assign(plan_.units(), 0);
  // Nothing is gathered now: the persistent parameters have their views (kept gathered), the
  // others none, which frees the memory they had.
  sharded_.assign(params_.size(), false);
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const Buffer view = strategy_.gathered_view(i);
    point_at(params_[i], view);
    if (view.data == nullptr && view.count > 0) {
      sharded_[i] = true;
      params_of_[plan_.unit_of[i]].push_back(i);
      watch_sharded_parameter(params_[i], *this, 0, i);
    }
  }
}

void Zero3Units::sharded_parameter_used(std::size_t, std::size_t i, bool released) {
  const std::size_t u = plan_.unit_of.at(i);
  if (!released) {
    // Kept since its forward: its backward holds it, and releases it once its gradients are in.
    if (plan_.automatic && u != 0 && state_[u] == State::kept && in_backward_.load()) {
      gather_for(u, UnitPass::backward);
      pending_[u] = params_of_[u].size();
    }
    return;
  }
  const std::string& name = strategy_.params()[i].name;
  const bool backward = in_backward_.load();
  if (backward && u == 0) {
    // A graph from an earlier forward, whose root an earlier backward() released (a GAN's
    // generator, reached again through the discriminator): gathered for this backward.
    gather_for(0, UnitPass::backward);
    return;
  }
  // The root is gathered from the prepared call's start to the end of backward().
  ACCEL_CHECK_ARG(backward || state_[0] != State::released,
                  "ZeRO-3: parameter '" + name +
                      "' was used outside the prepared model's call, where this rank holds only "
                      "its slice: call the model prepare returned, model(x), not "
                      "model->forward(x) (acc.get_state_dict(model) gives the whole values)");
  ACCEL_CHECK_ARG(plan_.automatic && u != 0,
                  "ZeRO-3: parameter '" + name + "' of unit '" + plan_.names[u] +
                      "' was used while that unit is not gathered (outside its forward and "
                      "backward)");
  // At most one automatic unit in use: the one used before this one is done with.
  const State in_use = backward ? State::backward : State::forward;
  for (std::size_t v = 1; v < state_.size(); ++v)
    if (v != u && state_[v] == in_use)
      release_for(v, backward ? UnitPass::backward : UnitPass::forward);
  if (backward) {
    gather_for(u, UnitPass::backward);
    pending_[u] = params_of_[u].size();
  } else {
    gather_for(u, UnitPass::forward);
  }
}

// ---- gathering

void Zero3Units::point_unit(std::size_t unit) {
  for (std::size_t i : params_of_[unit]) point_at(params_[i], strategy_.gathered_view(i));
}

void Zero3Units::gather_for(std::size_t unit, UnitPass pass) {
  if (!params_of_[unit].empty()) {
    strategy_.gather_unit(unit, pass);
    point_unit(unit);
  }
  state_[unit] = pass == UnitPass::forward ? State::forward : State::backward;
}

void Zero3Units::release_for(std::size_t unit, UnitPass pass) {
  if (params_of_[unit].empty()) {
    state_[unit] = State::released;
    return;
  }
  strategy_.release_unit(unit, pass);
  settle(unit);
}

void Zero3Units::settle(std::size_t unit) {
  point_unit(unit);
  // reshard_after_forward false: the strategy keeps a released unit to its backward.
  state_[unit] =
      !params_of_[unit].empty() && strategy_.gathered_view(params_of_[unit].front()).data != nullptr
          ? State::kept
          : State::released;
}

RootForward Zero3Units::root_forward() {
  if (!active_) return {};
  if (state_[0] != State::forward && state_[0] != State::backward) gather_for(0, UnitPass::forward);
  return RootForward(this, plan_.sequential);
}

void Zero3Units::finish_root_forward() {
  // The last automatic unit the forward used (the others were released as it went on).
  for (std::size_t u = 1; plan_.automatic && u < state_.size(); ++u)
    if (state_[u] == State::forward) release_for(u, UnitPass::forward);
  // With grad mode the root stays gathered for its backward (released at backward()'s end).
  if (!torch::GradMode::is_enabled() && state_[0] == State::forward)
    release_for(0, UnitPass::forward);
}

RootForward::~RootForward() {
  if (units_ == nullptr) return;
  try {
    units_->finish_root_forward();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ZeRO-3: releasing the root unit after the forward failed: %s\n",
                 e.what());
  }
}

at::Tensor RootForward::run_unit(std::size_t unit, std::vector<at::Tensor> inputs, const UnitFn& fn,
                                 bool checkpointable) {
  return units_->run_unit(unit, std::move(inputs), fn, checkpointable);
}

at::Tensor Zero3Units::run_unit(std::size_t unit, std::vector<at::Tensor> inputs,
                                const std::function<at::Tensor(const std::vector<at::Tensor>&)>& fn,
                                bool checkpointable) {
  const bool grad = torch::GradMode::is_enabled();
  const bool recompute =
      checkpointable && grad && activation_checkpointing_ && plan_.recomputable.at(unit);
  if (!active_) return recompute ? checkpoint_function(fn, inputs) : fn(inputs);
  ACCEL_CHECK_ARG(params_of_[0].empty() || state_[0] != State::released,
                  "ZeRO-3: unit '" + plan_.names[unit] +
                      "' ran outside the prepared model's call, where the root's parameters "
                      "(e.g. '" +
                      strategy_.params()[params_of_[0].front()].name +
                      "') are not gathered: call the model prepare returned, model(x), not "
                      "model->forward(x)");
  const auto self = std::int64_t(reinterpret_cast<std::intptr_t>(this));
  if (grad && any_requires_grad(inputs)) {
    variable_list through = UnitInputs::apply(self, std::int64_t(unit), at::TensorList(inputs));
    inputs.assign(through.begin(), through.end());
  }
  // Already gathered: for its backward (a recompute in backward), or the forward of a unit
  // called twice inside one forward.
  const bool gather_here = state_[unit] != State::forward && state_[unit] != State::backward;
  if (gather_here) gather_for(unit, UnitPass::forward);
  at::Tensor out;
  try {
    out = recompute ? checkpoint_function(fn, inputs) : fn(inputs);
  } catch (...) {
    if (gather_here) release_for(unit, UnitPass::forward);
    throw;
  }
  if (gather_here) release_for(unit, UnitPass::forward);
  ACCEL_CHECK_ARG(out.defined(), "ZeRO-3: unit " + std::to_string(unit) + " returned no tensor");
  if (grad && out.requires_grad()) out = UnitOutput::apply(self, std::int64_t(unit), out);
  return out;
}

void Zero3Units::backward_begins(std::size_t unit) {
  if (state_[unit] == State::forward) {
    state_[unit] = State::backward;  // the root, gathered since its forward
  } else if (state_[unit] != State::backward) {
    gather_for(unit, UnitPass::backward);
  }
  pending_[unit] = params_of_[unit].size();
}

void Zero3Units::backward_ends(std::size_t unit) {
  if (unit != 0 && state_[unit] == State::backward) release_for(unit, UnitPass::backward);
}

void Zero3Units::gradient_accumulated(std::size_t i) {
  if (!active_ || !sharded_[i]) return;
  const std::size_t u = plan_.unit_of[i];
  if (u == 0 || state_[u] != State::backward || pending_[u] == 0) return;
  if (--pending_[u] == 0) release_for(u, UnitPass::backward);
}

void Zero3Units::release_in_use() {
  for (std::size_t u = 0; u < state_.size(); ++u)
    if (state_[u] == State::forward || state_[u] == State::backward)
      release_for(u, UnitPass::backward);
}

void Zero3Units::settle_all() {
  for (std::size_t u = 0; u < state_.size(); ++u) settle(u);
}

// ---- whole parameters (checkpoints, get_state_dict)

void Zero3Units::for_each_gathered(const std::function<void(std::size_t, const Buffer&)>& use) {
  for (std::size_t u = 0; u < params_of_.size(); ++u) {
    if (params_of_[u].empty()) continue;
    ACCEL_CHECK_ARG(state_[u] == State::released || state_[u] == State::kept,
                    "ZeRO-3: the whole parameters are wanted while unit " + std::to_string(u) +
                        " is in use (inside a forward or backward)");
    strategy_.gather_unit(u, UnitPass::forward);
    for (std::size_t i : params_of_[u]) use(i, strategy_.gathered_view(i));
    strategy_.release_unit(u, UnitPass::forward);
    state_[u] = State::released;  // the views: settle(), after the use of the copies
  }
}

void Zero3Units::gather_whole(bool keep) {
  for_each_gathered([&](std::size_t i, const Buffer& view) {
    if (keep) own_storage(params_[i], &view);
  });
}

void Zero3Units::load_values(const std::vector<Buffer>& whole) {
  // The parameters' storage is the strategy's, which keeps each rank's parts of the values.
  release_in_use();
  strategy_.load_parameters(whole);
  settle_all();
}

void Zero3Units::load_archive(const std::function<void(const std::string&)>& load,
                              const std::string& bytes) {
  // The archive is read into whole (uninitialised) storage, each rank keeps its parts.
  release_in_use();
  for (std::size_t i = 0; i < params_.size(); ++i)
    if (sharded_[i]) own_storage(params_[i], nullptr);
  struct Free {
    Zero3Units& units;
    ~Free() { units.settle_all(); }
  } free_after{*this};
  load(bytes);
  std::vector<Buffer> values;
  for (std::size_t i = 0; i < params_.size(); ++i)
    values.push_back(tensor_buffer(params_[i], "parameter " + std::to_string(i)));
  strategy_.load_parameters(values);
}

std::vector<std::pair<std::string, at::Tensor>> Zero3Units::state_dict(
    const torch::nn::Module& root) {
  std::unordered_map<const void*, at::Tensor> whole;
  for_each_gathered([&](std::size_t i, const Buffer& view) {
    const at::Tensor& p = params_[i];
    whole[p.unsafeGetTensorImpl()] = at::from_blob(view.data, p.sizes(), p.options()).clone();
  });
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& item : root.named_parameters(/*recurse=*/true)) {
    const auto it = whole.find(item.value().unsafeGetTensorImpl());
    out.emplace_back(item.key(), it != whole.end() ? it->second : item.value().detach().clone());
  }
  for (const auto& item : root.named_buffers(/*recurse=*/true))
    out.emplace_back(item.key(), item.value().detach().clone());
  settle_all();
  return out;
}

void Zero3Units::leave_model() {
  // The persistent parameters' views die with the strategy: copies of their own.
  for (std::size_t i = 0; i < params_.size(); ++i) {
    if (sharded_[i]) {
      unwatch_sharded_parameter(params_[i]);
      continue;
    }
    const Buffer view = strategy_.gathered_view(i);
    own_storage(params_[i], &view);
  }
}

}  // namespace accel
