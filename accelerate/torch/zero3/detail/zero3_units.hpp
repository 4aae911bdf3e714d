#pragma once
// ZeRO-3 on the LibTorch side, for one prepared model (sharded_unit.hpp says what a unit is;
// zero3_units.cpp how they are gathered). TorchAccelerator holds one per prepared
// torch::nn::Module and forwards to it; it also runs the model's ShardedUnit blocks under the
// other strategies (activation checkpointing), where nothing is sharded (active() false).
// Private to the adapter: the loop sees only the prepared call and ShardedUnit.
//
// prepare's order: plan_units (before the strategy exists: which parameter is in which unit,
// for the strategy's layout), the strategy, then Zero3Units over it, shard() (ZeRO-3) and
// attach_blocks().

#include <atomic>
#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <ATen/Tensor.h>

#include "accelerate/torch/zero3/detail/sharded_parameter_access.hpp"
#include "accelerate/torch/zero3/root_forward.hpp"
#include "backends/backend.hpp"
#include "config/config.hpp"

namespace torch::nn {
class Module;
}

namespace accel {

class ShardedUnitBase;

// A model's units as prepare finds them (unit 0 is the root: every parameter outside the others).
struct UnitPlan {
  bool sequential = false;  // the units are a root Sequential's children, run by the call
  // The units are the children of the model's outermost ModuleLists and Sequentials
  // (auto_wrap_policy TRANSFORMER_BASED_WRAP): each gathered when one of its parameters is
  // first used (sharded_parameter_access.hpp), forward or backward, and released when another is.
  bool automatic = false;
  // The ShardedUnit blocks (unit k + 1 is blocks[k], if any); the model may go before them.
  std::vector<std::pair<std::weak_ptr<torch::nn::Module>, ShardedUnitBase*>> blocks;
  std::vector<std::string> names;    // per unit: its module's name ("" the root); ZeRO-3 only
  std::vector<bool> recomputable;    // per unit: shares no parameter with another
  std::vector<std::size_t> unit_of;  // per parameter (of `params`); ZeRO-3 only
  std::size_t units() const { return recomputable.size(); }
};

// The units of `root` whose trainable parameters are `params` (strategy order). Under ZeRO-3
// (stage3) also each parameter's unit; the ShardedUnit blocks under every strategy. Refuses
// nested ShardedUnits, and activation_checkpointing where nothing could be recomputed.
UnitPlan plan_units(torch::nn::Module& root, const std::vector<at::Tensor>& params, bool stage3,
                    config::AutoWrapPolicy policy, bool activation_checkpointing);

class Zero3Units final : private ShardedParameterOwner {
 public:
  // `params` and `in_backward` (true while acc.backward runs the graph) are the accelerator's,
  // and outlive this object; `strategy` is the model's.
  Zero3Units(UnitPlan plan, Strategy& strategy, std::vector<at::Tensor>& params,
             const std::atomic<bool>& in_backward, bool activation_checkpointing);
  Zero3Units(const Zero3Units&) = delete;
  Zero3Units& operator=(const Zero3Units&) = delete;
  ~Zero3Units();

  // ZeRO-3 (Strategy::parameters_sharded): the parameters' storage handed to the strategy.
  bool active() const { return active_; }
  void shard();
  // The ShardedUnit blocks run through run_unit while attached (from prepare to destruction).
  void attach_blocks();
  void detach_blocks();

  // ---- the forward and backward
  // The prepared call's scope (root_forward.hpp); its end, finish_root_forward, releases
  // the last automatic unit (and the root, without grad mode).
  [[nodiscard]] RootForward root_forward();
  void finish_root_forward();
  // Unit `unit`: gathered, fn(inputs) (recomputed in backward with activation_checkpointing
  // when checkpointable), released; its backward gathers it again.
  at::Tensor run_unit(std::size_t unit, std::vector<at::Tensor> inputs,
                      const std::function<at::Tensor(const std::vector<at::Tensor>&)>& fn,
                      bool checkpointable);
  // The autograd functions' calls: a unit's backward begins (its output's gradient arrived)
  // and ends (its inputs' gradients are computed).
  void backward_begins(std::size_t unit);
  void backward_ends(std::size_t unit);
  // Parameter i's gradient was accumulated: its unit is released after its last one.
  void gradient_accumulated(std::size_t i);
  // The end of backward(), a load: the units still gathered released.
  void release_in_use();
  // After the optimizer step and a save: storage and state as the strategy's.
  void settle_all();

  // ---- whole parameters (checkpoints, get_state_dict)
  // save_state's FULL_STATE_DICT: every unit gathered in turn on every rank; with keep, the
  // parameters get whole copies (for the archive this rank writes), freed by settle_all().
  void gather_whole(bool keep);
  // The module's parameters and buffers by name, whole, copied.
  std::vector<std::pair<std::string, at::Tensor>> state_dict(const torch::nn::Module& root);
  // SHARDED_STATE_DICT's load: whole values (one per parameter) of which each rank keeps its parts.
  void load_values(const std::vector<Buffer>& whole);
  // FULL_STATE_DICT's load: the archive read into whole storage by `load`, then sharded.
  void load_archive(const std::function<void(const std::string&)>& load, const std::string& bytes);
  // The accelerator goes: the persistent parameters get copies of their own, the others stay
  // empty (their values are spread over the ranks) and are no longer watched.
  void leave_model();

 private:
  // Where a unit's parameters are: released (storage empty), gathered for its forward or its
  // backward, or kept from forward to backward (reshard_after_forward false).
  enum class State { released, forward, kept, backward };
  void sharded_parameter_used(std::size_t model, std::size_t param, bool released) override;
  void point_unit(std::size_t unit);
  void gather_for(std::size_t unit, UnitPass pass);
  void release_for(std::size_t unit, UnitPass pass);
  void settle(std::size_t unit);
  void for_each_gathered(const std::function<void(std::size_t, const Buffer&)>& use);

  UnitPlan plan_;
  Strategy& strategy_;
  std::vector<at::Tensor>& params_;
  const std::atomic<bool>& in_backward_;
  bool activation_checkpointing_;
  bool active_ = false;
  std::vector<bool> sharded_;                        // per parameter: not kept gathered
  std::vector<std::vector<std::size_t>> params_of_;  // per unit: its sharded parameters
  std::vector<State> state_;                         // per unit
  std::vector<std::size_t> pending_;  // per unit: gradients not accumulated yet in its backward
};

}  // namespace accel
