#pragma once
// The front end a training loop talks to (Hugging Face Accelerate's Accelerator), framework-
// free: parameters and gradients are typed buffer views. The LibTorch adapter
// (accelerate/torch/) builds on it; a hand-written loop uses it directly (the raw API):
//
//   accel::Accelerator acc;                                // process state, config, comm
//   acc.prepare_parameters(params);                        // strategy chosen by the config
//   for (each batch of acc's shard) {
//     model.forward_backward(x, y, acc.loss_scale(), [&](layer l) { acc.grad_ready(i); });
//     if (acc.sync_gradients()) {                          // false between accumulation steps
//       acc.clip_grad_norm(1.0);
//       optimizer_step(); zero_grad();
//     }
//   }
//
// Settings: a value given in AcceleratorOptions wins over the environment (ACCEL_*, set by
// `accel launch`), which wins over the config file, which wins over the detected default.

#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "accelerate/process_env.hpp"
#include "accelerate/sharded_sampler.hpp"
#include "backends/backend.hpp"
#include "backends/comm/communicator.hpp"
#include "backends/ddp/ddp_strategy.hpp"

namespace accel {

class ProcessGroup;

struct AcceleratorOptions {
  std::optional<std::string> communicator;             // "gloo", "mpi", "nccl", "local"
  std::optional<int> gradient_accumulation_steps;
  std::optional<std::string> mixed_precision;          // "no", "fp16", "bf16"
  std::optional<Milliseconds> timeout;                 // every collective, and joining
  std::optional<std::string> config_file;              // else ACCEL_CONFIG_FILE / default path
  DdpOptions ddp;
};

class Accelerator {
 public:
  explicit Accelerator(AcceleratorOptions options = {});
  ~Accelerator();
  Accelerator(const Accelerator&) = delete;
  Accelerator& operator=(const Accelerator&) = delete;

  // ---- process state
  int process_index() const { return env_.rank; }
  int local_process_index() const { return env_.local_rank; }
  int num_processes() const { return env_.world_size; }
  bool is_main_process() const { return env_.rank == 0; }
  bool is_local_main_process() const { return env_.local_rank == 0; }
  DeviceKind device() const;
  const ProcessEnv& process_env() const { return env_; }
  int gradient_accumulation_steps() const { return accumulation_steps_; }
  const std::string& mixed_precision() const { return mixed_precision_; }
  Communicator& comm();

  // ---- the raw API: a loop's own parameter and gradient buffers
  // Chooses the strategy (DDP; the world of one runs the same code), makes every rank start
  // from rank 0's parameters and buffers.
  void prepare_parameters(std::vector<ParamRef> params, std::vector<Buffer> buffers = {});
  Strategy& strategy();
  // Multiply the loss (or the gradient of the mean loss) by this: 1 / accumulation steps.
  float loss_scale() const { return 1.0f / float(accumulation_steps_); }
  // Where the loop is in its data, before each batch's forward: the last batch of an epoch
  // always ends in a sync, and accumulation counts restart with the next epoch (Accelerate's
  // sync_with_dataloader). Without it, a sync happens every gradient_accumulation_steps.
  void begin_batch(std::size_t batch_index, std::size_t num_batches);
  // From the backward pass: parameter `index`'s gradient is final for this micro-batch.
  void grad_ready(std::size_t index);
  // After each micro-batch's backward. Returns true at an accumulation boundary, once the
  // gradients are synchronised: the optimizer steps then. Between boundaries gradients only
  // accumulate locally (no communication) and it returns false.
  bool sync_gradients();
  // Accelerate's accelerator.sync_gradients: will the current micro-batch end in a sync?
  bool is_accumulation_boundary() const;
  // Clips every gradient so their global L2 norm is at most max_norm; returns the norm
  // before clipping (the same on every rank).
  double clip_grad_norm(double max_norm);
  std::uint64_t step() const { return optimizer_steps_; }  // optimizer steps taken

  // ---- data
  // This rank's share of a dataset of `size` samples (see ShardedSampler).
  ShardedSampler make_sampler(std::size_t size, SamplerOptions options = {}) const;

  // ---- collectives on the loop's own values (blocking)
  void reduce(Buffer data, ReduceOp op);        // in place: sum, avg, min, max
  void broadcast(Buffer data, int root = 0);
  // Every rank's `local` (equal counts), concatenated in rank order.
  std::vector<float> gather(const std::vector<float>& local);
  std::vector<std::int64_t> gather(const std::vector<std::int64_t>& local);
  // gather() of one batch of per-sample values, dropping the sampler's padding once the
  // epoch's last batch is reached: an evaluation epoch yields exactly the dataset's size.
  // `batch_index` is this batch's position in the epoch (0-based).
  std::vector<float> gather_for_metrics(const std::vector<float>& local,
                                        const ShardedSampler& sampler, std::size_t batch_index);
  std::vector<std::int64_t> gather_for_metrics(const std::vector<std::int64_t>& local,
                                               const ShardedSampler& sampler,
                                               std::size_t batch_index);
  // Pads `local` with `pad` up to the longest length on any rank (so gather can follow).
  std::vector<float> pad_across_processes(std::vector<float> local, float pad = 0.0f);
  void wait_for_everyone();
  // printf on the main process only.
  template <typename... Args>
  void print(const char* format, Args... args) const {
    if (!is_main_process()) return;
    std::printf(format, args...);
    std::fflush(stdout);
  }
  // Runs fn on the main process first, then on the others (e.g. a download or a cache).
  void main_process_first(const std::function<void()>& fn);
  // The contiguous part [begin, end) of [0, n) this rank takes (uneven splits allowed).
  std::pair<std::size_t, std::size_t> split_between_processes(std::size_t n) const;

  // ---- randomness: the same seed on every rank (and recorded in checkpoints)
  void set_seed(std::uint64_t seed);
  std::uint64_t seed() const { return seed_; }

 private:
  ProcessEnv env_;
  AcceleratorOptions options_;
  std::unique_ptr<ProcessGroup> group_;
  std::unique_ptr<DdpStrategy> strategy_;
  int accumulation_steps_ = 1;
  std::string mixed_precision_ = "no";
  int micro_since_sync_ = 0;           // micro-batches since the last boundary
  bool last_batch_ = false;            // the current batch ends an epoch
  std::uint64_t optimizer_steps_ = 0;  // boundaries reached
  std::uint64_t seed_ = 0;
};

}  // namespace accel
