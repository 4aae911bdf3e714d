#pragma once
// How a model is pipelined: the stages, the micro-batches, the schedule and the split (the
// config keys of the same names; DeepSpeed's PipelineModule and engine settings).

#include <string>
#include <vector>

#include "accelerate/pipeline/partition.hpp"
#include "accelerate/pipeline/schedule.hpp"

namespace accel::pipeline {

struct PipelineOptions {
  // P: stages; the world is P x D (D data-parallel replicas of the pipeline). Rank r is stage
  // r % P of replica r / P, so a pipeline's neighbours are consecutive ranks (one host).
  int pipeline_parallel_size = 1;
  // M: each step's batch splits into M micro-batches (a multiple of M rows); the loss is their
  // mean, as gradient accumulation over M would give.
  int num_microbatches = 1;
  Schedule pipeline_schedule = Schedule::ONE_F_ONE_B;
  int pipeline_chunks = 1;  // V: model chunks per stage (INTERLEAVED_1F1B)
  PartitionMethod partition_method = PartitionMethod::parameters;
  // Clip the gradients to this global 2-norm over every stage's parameters before the step
  // (clip_grad_norm_'s, DeepSpeed's gradient_clipping); 0: no clipping.
  double max_grad_norm = 0;
  // Explicit split: the first layer (child name) of each piece after the first; overrides
  // partition_method.
  std::vector<std::string> split_points;
};

}  // namespace accel::pipeline
