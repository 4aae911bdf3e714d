#pragma once
// A LibTorch optimizer's per-parameter state in flat, world-size-free coordinates, so a
// checkpoint of the LibTorch adapter resumes under any strategy and number of processes:
// accelerate/checkpointing/optimizer_state.hpp packs it with the segment map and reshards it, as it
// does the built-in optimizers' state (Accelerator::register_optimizer_state).
//
// The state tensors of torch::optim::SGD (momentum_buffer), Adam and AdamW (exp_avg,
// exp_avg_sq, max_exp_avg_sq with amsgrad) are element-wise: element e of a state tensor
// belongs to element e of its parameter. So each segment's state tensors are its slot arrays
// in Optimizer::save_state's format (floats, in the order just named), and they load into
// whatever tensors this rank's optimizer holds: under ZeRO its slice tensors (a slice of the
// group's flat coordinates), under DDP the parameters themselves. Adam's step count is the
// same for every parameter (they step together) and is carried once.
//
// Other optimizers (RMSprop, Adagrad, LBFGS, one's own), double parameters (a float would not
// hold their state exactly) and a param group mixing dtypes (ZeRO would give it one flat buffer
// per dtype, overlapping in the group's coordinates) are not handled here: unsupported_reason
// says why, and the adapter then saves the LibTorch archive as it is (one process or rank's
// own, so such a checkpoint resumes with the same number of processes only).

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <ATen/Tensor.h>
#include <torch/optim/optimizer.h>

#include "backends/backend.hpp"

namespace accel::torch_optimizer_state {

// "" when the state of `optimizer` can be saved this way, else the reason (for messages). Ask
// before ZeRO replaces the param groups' parameters by slices.
std::string unsupported_reason(const torch::optim::Optimizer& optimizer);

// The state, in Optimizer::save_state's format, of the tensors the optimizer holds for
// `segments` (tensors[k] for segments[k]: a ZeRO slice or a DDP parameter; undefined where
// the optimizer holds none, e.g. a parameter in no param group). Throws CheckpointError when
// the state is not element-wise as described above (a parameter with state in a group whose
// other parameters have none, steps that differ, a state tensor of another size).
std::string save(const torch::optim::Optimizer& optimizer,
                 const std::vector<ParamSegment>& segments, const std::vector<at::Tensor>& tensors);

// Checks `bytes` (this rank's segments, resharded: sizes, the number of state arrays each
// group's options need) and builds the state from it; returns what replaces the state of
// those tensors by it. Throws CheckpointError naming `where`; nothing changes before the
// returned function is called.
std::function<void()> load(torch::optim::Optimizer& optimizer,
                           const std::vector<ParamSegment>& segments,
                           const std::vector<at::Tensor>& tensors, const std::string& bytes,
                           const std::string& where);

// One tensor's element-wise state: its arrays in save()'s order (none: no state yet) and
// Adam's step count (0 for SGD).
struct TensorState {
  std::vector<at::Tensor> arrays;
  std::int64_t step = 0;
};
// What `optimizer` (SGD, Adam or AdamW) holds for `tensor`.
TensorState state_of(const torch::optim::Optimizer& optimizer, const at::Tensor& tensor);
// How many arrays per tensor param group `group`'s options make `optimizer` keep.
std::size_t arrays_per_tensor(const torch::optim::Optimizer& optimizer, std::size_t group);
// Gives `tensor` that state in `optimizer` (SGD, Adam or AdamW).
void set_state(torch::optim::Optimizer& optimizer, const at::Tensor& tensor, TensorState state);
// A plain optimizer of `like`'s kind (SGD, Adam or AdamW) with `like`'s defaults over `groups`.
std::unique_ptr<torch::optim::Optimizer> make_like(
    const torch::optim::Optimizer& like, std::vector<torch::optim::OptimizerParamGroup> groups);

}  // namespace accel::torch_optimizer_state
