#pragma once
// One model the Accelerator prepared (accelerate/accelerator.hpp: prepare_parameters): its
// strategy and what checkpoints and the optimizer step need of it. Private to the
// Accelerator's .cpp files; an accelerator holds one per prepared model, in preparation order.

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "accelerate/checkpointing/optimizer_state.hpp"
#include "accelerate/checkpointing/parameter_layout.hpp"
#include "accelerate/replicated_model.hpp"
#include "backends/backend.hpp"
#include "backends/optim/optimizer.hpp"

namespace accel {

struct PreparedParameters {
  std::size_t index = 0;  // its position in preparation order (prepared_name's `model`)
  std::unique_ptr<Strategy> strategy;
  std::vector<ParamRef> params;  // as prepared, for checkpoints
  std::vector<Buffer> buffers;
  TensorNames names;               // the front end's (name_tensors), for checkpoints' layout
  Optimizer* optimizer = nullptr;  // prepare()'s built-in optimizer
  // Its state (or a front end's optimizer's, register_optimizer_state) for checkpoints.
  std::function<std::string()> save_optimizer;
  OptimizerStateLoader load_optimizer;
  // DataParallel under the raw API: prepare(model, ...)'s model and its copies.
  std::unique_ptr<ReplicatedModel> replicas;
  bool reported = false;  // a gradient was reported ready since the last sync
  bool no_sync = false;   // under Accelerator::no_sync: its gradients accumulate locally
};

}  // namespace accel
