#pragma once
// A prepared model's ZeRO-3 units on the LibTorch side (sharded_unit.hpp says what a unit is,
// sharded_units.cpp how they are gathered). Private to the adapter's .cpp files.

#include <cstddef>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace torch::nn {
class Module;
}

namespace accel {

class ShardedUnitBase;

struct ShardedUnits {
  // Where a unit's parameters are: released (storage empty), gathered for its forward or its
  // backward, or kept from forward to backward (reshard_after_forward false).
  enum class State { released, forward, kept, backward };
  bool active = false;      // ZeRO-3 (Strategy::parameters_sharded)
  bool sequential = false;  // the units are a root Sequential's children, run by the call
  // The units are the children of the model's ModuleLists and Sequentials (auto_wrap_policy
  // TRANSFORMER_BASED_WRAP): each is gathered when one of its parameters is first used
  // (sharded_parameter_access.hpp), forward or backward, and released when another is.
  bool automatic = false;
  // Unit k + 1 is wrappers[k] (if any); the model may go before the accelerator.
  std::vector<std::pair<std::weak_ptr<torch::nn::Module>, ShardedUnitBase*>> wrappers;
  std::vector<std::string> names;                // per unit: its module's name ("" the root)
  std::vector<bool> recomputable;                // per unit: shares no parameter with another
  std::vector<std::size_t> unit_of;              // per parameter; 0 is the root
  std::vector<bool> sharded;                     // per parameter: not kept gathered
  std::vector<std::vector<std::size_t>> params;  // per unit: its sharded parameters
  std::vector<State> state;                      // per unit
  std::vector<std::size_t> pending;  // per unit: gradients not accumulated yet in its backward
};

}  // namespace accel
