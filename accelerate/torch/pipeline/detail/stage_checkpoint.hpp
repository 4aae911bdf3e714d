#pragma once
// A pipeline's part of Accelerator::save_state / load_state (register_checkpoint_part): the
// whole model in the checkpoint layout every strategy writes (parameter_layout.hpp), each
// stage writing only its own layers, so a pipeline checkpoint loads at other stages and
// replicas, without a pipeline (state_dict_type SHARDED_STATE_DICT) and in accel merge-weights.
//
// No rank holds the whole model (LayerSpecs build only their stage's), so at construction the
// ranks all-gather what each stage holds (names, dtypes, shapes, param groups, buffers), and
// every rank knows the whole model's flat coordinates. The blobs:
//   parameters.layout   (rank 0) the whole model, strategy "pipeline", world_size P: piece v's
//                       parameters are slices of blob parameters.rank<v % P>
//   parameters          (rank 0) the whole model's buffers (gathered from the stages at save)
//   parameters.rankS    (replica 0's stage S) that stage's parameters, piece by piece
//   optimizer.rankR     (every rank) its optimizer's state in flat coordinates
//                       (optimizer_state.hpp; a stage's replicas write equal copies, as
//                       HYBRID_SHARD's machines do), resharded on load from the first P's
//   state.optimizer     (rank 0) the param groups' options, as the LibTorch adapter writes
// An optimizer whose state is not element-wise floats (torch_optimizer_state.hpp's
// unsupported_reason: double parameters, RMSprop ...) writes its LibTorch archive per rank as
// state.optimizer.rankR instead, which loads only at the same stages and replicas.

#include <memory>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "accelerate/accelerator.hpp"
#include "accelerate/checkpointing/parameter_layout.hpp"

namespace accel::pipeline::detail {

struct StagePiece {
  int piece = 0;  // its index among the P x V pieces
  torch::nn::Sequential layers;
};

class StageCheckpoint {
 public:
  // Collective over the world (the all-gather of what each stage holds). `pieces`: this
  // rank's, chunk by chunk; `stages` P, this rank's `stage` and `replica`.
  StageCheckpoint(Communicator& world, std::vector<StagePiece> pieces, int stages, int stage,
                  int replica, torch::optim::Optimizer& optimizer);

  Accelerator::CheckpointPart part();

 private:
  Accelerator::CheckpointPartBlobs save();
  std::function<void()> load(const LoadedCheckpoint& ck) const;
  std::vector<ParamSegment> segments() const;

  Communicator& world_;
  std::vector<StagePiece> pieces_;
  int stages_, stage_, replica_;
  torch::optim::Optimizer& optimizer_;
  std::string flat_state_unsupported_;  // "" when the optimizer state reshards
  // The whole model: parameters (data only where this rank holds them) and buffers (count
  // and dtype only), and the layout every save writes.
  std::vector<ParamRef> params_;
  std::vector<Buffer> buffers_;
  ParameterLayout layout_;
  std::vector<std::size_t> mine_;          // this rank's parameters' indices into params_
  std::vector<at::Tensor> my_params_;      // ... and their tensors
  std::vector<at::Tensor> my_buffers_;     // this rank's buffers, piece by piece
  std::vector<std::size_t> my_buffer_at_;  // ... their indices into buffers_
  // Which piece each whole-model buffer belongs to (for the gather at save).
  std::vector<int> buffer_piece_;
};

}  // namespace accel::pipeline::detail
