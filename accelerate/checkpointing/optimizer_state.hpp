#pragma once
// An optimizer's state in checkpoints, in a form any strategy and world size can load: the
// optimizer's bytes in Optimizer::save_state's format (a step count, then per segment its
// element-wise state arrays of floats) preceded by the map of its segments (param group,
// offset among the group's parameters laid end to end, count). DDP saves one blob (rank 0's,
// every parameter); ZeRO one per rank (its slices). Loading under another strategy or world
// size rebuilds each slot of each group from every saved blob and cuts out what this rank's
// segments cover (zeros past the end: padding). The built-in optimizers write that format
// themselves; the LibTorch adapter converts a LibTorch optimizer's state to it
// (accelerate/torch/checkpointing/torch_optimizer_state.hpp).

#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "backends/backend.hpp"
#include "backends/optim/optimizer.hpp"

namespace accel {

// A front end's optimizer state loader (Accelerator::register_optimizer_state): checks `bytes`
// and returns what applies them.
using OptimizerStateLoader =
    std::function<std::function<void()>(const std::string& bytes, const std::string& where)>;

// `optimizer_bytes`: Optimizer::save_state's format, for `segments`.
std::string pack_optimizer_state(const std::string& optimizer_bytes,
                                 const std::vector<ParamSegment>& segments);

// Whether `blob` was saved with exactly these segments (then its optimizer bytes load as
// they are).
bool same_segments(const std::string& blob, const std::vector<ParamSegment>& segments);

// The Optimizer::save_state bytes for `segments`, from every blob a checkpoint holds (all
// ranks' under ZeRO). Throws CheckpointError naming `where` on a blob that does not parse or
// blobs that disagree (step counts).
std::string reshard_optimizer_state(const std::vector<std::string>& blobs,
                                    const std::vector<ParamSegment>& segments,
                                    const std::string& where);

// Optimizer::save_state's bytes from a checkpoint, parsed (parse_optimizer_state); damaged
// ones throw CheckpointError naming `where`.
SavedOptimizerState read_optimizer_bytes(std::string_view bytes, const std::string& where);

// The optimizer bytes inside a blob.
std::string optimizer_bytes(const std::string& blob, const std::string& where);

}  // namespace accel
