#include "accelerate/torch/checkpointing/torch_optimizer_state.hpp"

#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <set>
#include <utility>

#include <ATen/Functions.h>
#include <c10/util/string_utils.h>
#include <torch/csrc/autograd/grad_mode.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include "accelerate/checkpointing/checkpoint_manifest.hpp"
#include "accelerate/checkpointing/optimizer_state.hpp"

namespace accel::torch_optimizer_state {
namespace {

enum class Kind { sgd, adam, adamw };

std::optional<Kind> kind_of(const torch::optim::Optimizer& optimizer) {
  if (dynamic_cast<const torch::optim::SGD*>(&optimizer)) return Kind::sgd;
  if (dynamic_cast<const torch::optim::Adam*>(&optimizer)) return Kind::adam;
  if (dynamic_cast<const torch::optim::AdamW*>(&optimizer)) return Kind::adamw;
  return std::nullopt;
}

const char* kind_name(Kind kind) {
  return kind == Kind::sgd ? "SGD" : kind == Kind::adam ? "Adam" : "AdamW";
}

// LibTorch's optimizers key their state by the parameter's TensorImpl address.
std::string state_key(const at::Tensor& t) { return c10::guts::to_string(t.unsafeGetTensorImpl()); }

// The state arrays a group's options make the optimizer keep, in the saved order.
std::size_t expected_slots(Kind kind, const torch::optim::OptimizerOptions& options) {
  switch (kind) {
    case Kind::sgd:
      return static_cast<const torch::optim::SGDOptions&>(options).momentum() != 0 ? 1 : 0;
    case Kind::adam:
      return static_cast<const torch::optim::AdamOptions&>(options).amsgrad() ? 3 : 2;
    case Kind::adamw:
      return static_cast<const torch::optim::AdamWOptions&>(options).amsgrad() ? 3 : 2;
  }
  return 0;
}

using Slots = TensorState;

template <typename AdamState>
Slots adam_slots(const torch::optim::OptimizerParamState& state) {
  const auto& s = static_cast<const AdamState&>(state);
  Slots out{{s.exp_avg(), s.exp_avg_sq()}, s.step()};
  if (s.max_exp_avg_sq().defined()) out.arrays.push_back(s.max_exp_avg_sq());
  return out;
}

Slots slots_of(Kind kind, const torch::optim::OptimizerParamState& state) {
  switch (kind) {
    case Kind::sgd: {
      const auto& s = static_cast<const torch::optim::SGDParamState&>(state);
      return s.momentum_buffer().defined() ? Slots{{s.momentum_buffer()}, 0} : Slots{};
    }
    case Kind::adam:
      return adam_slots<torch::optim::AdamParamState>(state);
    case Kind::adamw:
      return adam_slots<torch::optim::AdamWParamState>(state);
  }
  return {};
}

template <typename AdamState>
std::unique_ptr<torch::optim::OptimizerParamState> make_adam_state(std::vector<at::Tensor>& a,
                                                                   std::int64_t step) {
  auto s = std::make_unique<AdamState>();
  s->step(step);
  s->exp_avg(a[0]);
  s->exp_avg_sq(a[1]);
  if (a.size() > 2) s->max_exp_avg_sq(a[2]);
  return s;
}

std::unique_ptr<torch::optim::OptimizerParamState> make_state(Kind kind,
                                                              std::vector<at::Tensor> arrays,
                                                              std::int64_t step) {
  switch (kind) {
    case Kind::sgd: {
      auto s = std::make_unique<torch::optim::SGDParamState>();
      s->momentum_buffer(arrays[0]);
      return s;
    }
    case Kind::adam:
      return make_adam_state<torch::optim::AdamParamState>(arrays, step);
    case Kind::adamw:
      return make_adam_state<torch::optim::AdamWParamState>(arrays, step);
  }
  return nullptr;
}

void put_u64(std::string& out, std::uint64_t v) {
  out.append(reinterpret_cast<const char*>(&v), 8);
}

}  // namespace

std::string unsupported_reason(const torch::optim::Optimizer& optimizer) {
  if (!kind_of(optimizer))
    return "only SGD, Adam and AdamW keep element-wise state this adapter can reshard";
  for (std::size_t g = 0; g < optimizer.param_groups().size(); ++g) {
    std::set<at::ScalarType> dtypes;
    for (const at::Tensor& p : optimizer.param_groups()[g].params()) dtypes.insert(p.scalar_type());
    if (dtypes.count(at::kDouble))
      return "param group " + std::to_string(g) +
             " holds double parameters (the state is "
             "resharded as float)";
    if (dtypes.size() > 1) return "param group " + std::to_string(g) + " mixes parameter dtypes";
  }
  return "";
}

std::string save(const torch::optim::Optimizer& optimizer,
                 const std::vector<ParamSegment>& segments,
                 const std::vector<at::Tensor>& tensors) {
  const std::optional<Kind> kind = kind_of(optimizer);
  ACCEL_CHECK_ARG(kind && tensors.size() == segments.size(),
                  "optimizer state: an SGD, Adam or AdamW optimizer and one tensor per segment");
  // Every held tensor's slots, checked: element-wise, one step count.
  std::vector<Slots> slots(segments.size());
  std::optional<std::int64_t> step;
  std::vector<std::optional<bool>> group_has_state;  // per param group: all or none
  for (std::size_t k = 0; k < segments.size(); ++k) {
    const at::Tensor& t = tensors[k];
    if (!t.defined()) continue;
    const auto it = optimizer.state().find(state_key(t));
    if (it != optimizer.state().end()) slots[k] = slots_of(*kind, *it->second);
    const std::string what = "optimizer state: " + std::string(kind_name(*kind)) + " param group " +
                             std::to_string(segments[k].group);
    for (const at::Tensor& a : slots[k].arrays)
      if (a.numel() != t.numel() || std::size_t(t.numel()) != segments[k].values.count)
        throw CheckpointError(what + ": a state tensor of " + std::to_string(a.numel()) +
                              " elements for a parameter of " + std::to_string(t.numel()) +
                              "; only element-wise state can be saved");
    const bool has = !slots[k].arrays.empty();
    if (group_has_state.size() <= segments[k].group) group_has_state.resize(segments[k].group + 1);
    auto& seen = group_has_state[segments[k].group];
    if (seen && *seen != has)
      throw CheckpointError(what +
                            ": some parameters have state and others none (a parameter "
                            "that never had a gradient?); the group steps as one");
    seen = has;
    if (has && *kind != Kind::sgd) {
      if (step && *step != slots[k].step)
        throw CheckpointError(what + ": parameters at different step counts (" +
                              std::to_string(*step) + " and " + std::to_string(slots[k].step) +
                              ")");
      step = slots[k].step;
    }
  }
  bool any = false;
  for (const Slots& s : slots) any = any || !s.arrays.empty();
  // Optimizer::save_state's format: steps, segments stored, then per segment count, slots and
  // the arrays as floats.
  std::string out;
  put_u64(out, std::uint64_t(step.value_or(0)));
  put_u64(out, any ? segments.size() : 0);
  if (!any) return out;
  torch::NoGradGuard no_grad;
  for (std::size_t k = 0; k < segments.size(); ++k) {
    put_u64(out, segments[k].values.count);
    put_u64(out, slots[k].arrays.size());
    for (const at::Tensor& a : slots[k].arrays) {
      const at::Tensor f = a.detach().to(at::kCPU, at::kFloat).contiguous();
      out.append(static_cast<const char*>(f.data_ptr()), std::size_t(f.nbytes()));
    }
  }
  return out;
}

std::function<void()> load(torch::optim::Optimizer& optimizer,
                           const std::vector<ParamSegment>& segments,
                           const std::vector<at::Tensor>& tensors, const std::string& bytes,
                           const std::string& where) {
  const std::optional<Kind> kind = kind_of(optimizer);
  ACCEL_CHECK_ARG(kind && tensors.size() == segments.size(),
                  "optimizer state: an SGD, Adam or AdamW optimizer and one tensor per segment");
  const SavedOptimizerState saved = read_optimizer_bytes(bytes, where);
  const std::uint64_t step = saved.step;
  if (!saved.segments.empty() && saved.segments.size() != segments.size())
    throw CheckpointError(where + ": optimizer state for " + std::to_string(saved.segments.size()) +
                          " segments, this rank has " + std::to_string(segments.size()));
  // Every new state built (and checked) before the optimizer's is touched.
  auto states = std::make_shared<
      std::vector<std::pair<std::string, std::unique_ptr<torch::optim::OptimizerParamState>>>>();
  torch::NoGradGuard no_grad;
  for (std::size_t k = 0; k < saved.segments.size(); ++k) {
    const SavedOptimizerState::Segment& in = saved.segments[k];
    const std::string what =
        where + ": optimizer state of param group " + std::to_string(segments[k].group);
    if (in.count != segments[k].values.count)
      throw CheckpointError(what + ": a segment of " + std::to_string(in.count) +
                            " elements where this rank's has " +
                            std::to_string(segments[k].values.count));
    const at::Tensor& t = tensors[k];
    if (in.slots == 0) continue;  // none saved: none restored (SGD without momentum)
    if (!t.defined())
      throw CheckpointError(what + ": state for parameters this optimizer does not hold");
    const std::size_t expected =
        expected_slots(*kind, optimizer.param_groups()[segments[k].group].options());
    if (in.slots != expected)
      throw CheckpointError(what + ": " + std::to_string(in.slots) +
                            " state arrays per element, this " + kind_name(*kind) +
                            " group keeps " + std::to_string(expected) +
                            " (another optimizer, or other momentum/amsgrad options?)");
    if (*kind != Kind::sgd && step == 0)
      throw CheckpointError(what + ": no step count, which " + std::string(kind_name(*kind)) +
                            " state has (saved by SGD?)");
    std::vector<at::Tensor> arrays;
    for (std::uint64_t s = 0; s < in.slots; ++s) {
      const at::Tensor f = at::from_blob(const_cast<char*>(in.data) + s * in.count * sizeof(float),
                                         {std::int64_t(in.count)}, at::kFloat);
      arrays.push_back(f.to(t.options(), /*non_blocking=*/false, /*copy=*/true).view(t.sizes()));
    }
    states->emplace_back(state_key(t), make_state(*kind, std::move(arrays), std::int64_t(step)));
  }
  std::vector<std::string> keys;
  for (const at::Tensor& t : tensors)
    if (t.defined()) keys.push_back(state_key(t));
  return [&optimizer, keys = std::move(keys), states] {
    for (const std::string& key : keys) optimizer.state().erase(key);
    for (auto& [key, state] : *states) optimizer.state()[key] = std::move(state);
  };
}

namespace {
Kind kind_or_refuse(const torch::optim::Optimizer& optimizer) {
  const std::optional<Kind> kind = kind_of(optimizer);
  ACCEL_CHECK_ARG(kind.has_value(),
                  "optimizer state: only SGD, Adam and AdamW keep element-wise state, which can "
                  "be gathered or resharded; save another optimizer's with acc.save_state(dir)");
  return *kind;
}
}  // namespace

TensorState state_of(const torch::optim::Optimizer& optimizer, const at::Tensor& tensor) {
  const Kind kind = kind_or_refuse(optimizer);
  const auto it = optimizer.state().find(state_key(tensor));
  return it == optimizer.state().end() ? TensorState{} : slots_of(kind, *it->second);
}

std::size_t arrays_per_tensor(const torch::optim::Optimizer& optimizer, std::size_t group) {
  return expected_slots(kind_or_refuse(optimizer), optimizer.param_groups().at(group).options());
}

void set_state(torch::optim::Optimizer& optimizer, const at::Tensor& tensor, TensorState state) {
  optimizer.state()[state_key(tensor)] =
      make_state(kind_or_refuse(optimizer), std::move(state.arrays), state.step);
}

std::unique_ptr<torch::optim::Optimizer> make_like(
    const torch::optim::Optimizer& like, std::vector<torch::optim::OptimizerParamGroup> groups) {
  switch (kind_or_refuse(like)) {
    case Kind::sgd:
      return std::make_unique<torch::optim::SGD>(
          std::move(groups), static_cast<const torch::optim::SGDOptions&>(like.defaults()));
    case Kind::adam:
      return std::make_unique<torch::optim::Adam>(
          std::move(groups), static_cast<const torch::optim::AdamOptions&>(like.defaults()));
    case Kind::adamw:
      return std::make_unique<torch::optim::AdamW>(
          std::move(groups), static_cast<const torch::optim::AdamWOptions&>(like.defaults()));
  }
  return nullptr;
}

}  // namespace accel::torch_optimizer_state
