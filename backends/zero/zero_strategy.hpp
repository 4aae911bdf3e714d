#pragma once
// ZeRO (DeepSpeed's Zero Redundancy Optimizer), stages 1 and 2: every rank keeps the full
// parameters, but the optimizer updates only this rank's slice of each flat (param group,
// dtype) buffer (flat_layout.hpp), so optimizer state exists for that slice only.
//
//   stage 1: the strategy keeps full flat gradient buffers (a front end may make them the
//            gradient storage: grad_slot, backend.hpp's "slots"); in the micro-batch that ends an
//            accumulation (sync enabled) they are reduce-scattered (average) in buckets as backward
//            produces them, each rank's part landing in its own gradient slice (not in place: the
//            flat buffers keep what the loop accumulated, so a later backward adds to it).
//   stage 2: the strategy keeps only the owned gradient slices and two bucket buffers (one
//            filling while the other is in flight): each bucket's gradients are copied in,
//            reduce-scattered during backward, this rank's part copied to its slice; gradients
//            asked of the strategy are lent (backend.hpp's "lent") and released once copied
//            (LibTorch frees them).
//
// Several backwards before one optimizer step (a GAN's discriminator: real, then fake batch)
// sum their gradients, as autograd does: gradients the loop keeps (stage 1's flat buffers, a
// raw loop's own) hold everything since its zero_grad and each sync replaces the slice with
// their average; released ones (stage 2, lent) hold only what came since, so
// after the first sync of a step each sync adds its average into the slice.
//
// Gradient accumulation: between boundaries nothing is communicated in either stage and the
// gradients accumulate where the loop keeps them (PyTorch's no_sync). DeepSpeed's stage 2
// instead reduces every micro-batch and sums the averages into the slice, which moves K times
// the bytes and rounds differently from DDP; here each rank's slice holds exactly the average
// of every rank's accumulated gradient, as DDP computes it, and a step moves DDP's bytes.
//
// The reduce-scatter is a true one with per-rank parts (a bucket's overlap with each rank's
// slice; Communicator::reduce_scatter with counts), launched strictly in bucket order so every
// rank issues the same collective sequence. After the optimizer updated segments() (the
// owned slices), after_optimizer_step() all-gathers each flat parameter buffer and copies the
// values into the parameters (no copy for parameters that live in the flat buffer:
// use_param_slots()). Bytes moved per step: reduce-scatter + all-gather = one all-reduce.
//
// Devices: the flat buffers and staging buckets live where the communicator works (host, or
// CUDA memory under NCCL), as DDP's buckets; copies and waits are ordered on the compute
// stream, so the host does not wait for the GPU per bucket.
// Optimizer offload (offload_optimizer = cpu, DeepSpeed's offload_optimizer device cpu): with
// parameters on a GPU, pinned host copies of this rank's parameter and gradient slices are what
// segments() hand the optimizer, so a CPU optimizer steps there and its state lives in host
// memory. sync_gradients() copies the reduced gradient slices to the host and waits for them
// (the host reads them next); after_optimizer_step() copies the updated slices back before the
// all-gather. With CPU parameters it changes nothing (rank 0 notes so at prepare()).

#include <array>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <vector>

#include "backends/backend.hpp"
#include "backends/zero/flat_layout.hpp"
#include "core/device_memory.hpp"

namespace accel {

class ZeroStrategy final : public Strategy {
 public:
  ZeroStrategy(Communicator& comm, std::vector<ParamRef> params, std::vector<Buffer> buffers = {},
               ZeroOptions options = {});
  ~ZeroStrategy() override;

  std::string_view name() const override { return options_.stage == 1 ? "zero1" : "zero2"; }
  int stage() const { return options_.stage; }
  // Broadcasts parameters and buffers from rank 0 and fills the flat parameter buffers.
  void prepare() override;
  void grad_ready(std::size_t index) override;
  // At a boundary (sync enabled): finishes the reduce-scatters, the slices hold the averages.
  void sync_gradients() override;
  void set_sync_enabled(bool enabled) override { sync_enabled_ = enabled; }
  bool sync_enabled() const override { return sync_enabled_; }
  void sync_buffers() override;
  const std::vector<ParamRef>& params() const override { return params_; }

  // One segment per flat buffer: this rank's slice of the parameters and its gradient.
  std::vector<ParamSegment> segments() const override;
  bool gradients_sharded() const override { return true; }
  void after_optimizer_step() override;
  void reload_parameters() override;
  std::size_t gradient_bytes() const override;

  const FlatLayout& layout() const { return layout_; }
  // Whether segments() are pinned host copies (offload_optimizer cpu, parameters on a GPU).
  bool offloads_optimizer() const { return offload_; }
  // Parameter i's place in its flat parameter buffer (same dtype and count).
  bool has_param_slots() const override { return true; }
  Buffer param_slot(std::size_t index) const override;
  // The caller made every parameter live at param_slot(i): the all-gather then writes the
  // parameters directly.
  void use_param_slots() override;
  // Stage 1: slots (the flat gradient buffers); stage 2: lent (it keeps no full gradients).
  GradientStorage gradient_storage() const override {
    return options_.stage == 1 ? GradientStorage::slots : GradientStorage::lent;
  }
  // Stage 1: parameter i's slot in the flat gradient buffer. Stage 2: throws.
  Buffer grad_slot(int replica, std::size_t index) const override;
  // Stage 2, for ParamRefs given without storage: where parameter i's gradient lives now (a
  // framework allocates a new one each micro-batch); the next grad_ready(i) reads it there.
  void lend_grad(std::size_t index, Buffer grad) override;
  std::vector<std::size_t> take_released() override;
  void withdraw_grads() override;
  // The bucket ranges (flat index, begin, end) in launch order, for tests.
  const std::vector<FlatBucket>& bucket_layout() const { return bucket_ranges_; }

 private:
  struct Bucket {
    FlatBucket range;
    std::vector<std::size_t> counts;  // per rank: its part of the bucket
    std::size_t pending = 0;
    int slot = -1;  // stage 2: the staging buffer in use
    WorkPtr work;
  };
  void launch_ready_buckets();  // with mutex_ held
  void launch(Bucket& b);
  void finish(Bucket& b);  // waits; stage 2: copies this rank's part to its slice
  void finish_all();
  Buffer own_part(const Bucket& b, Buffer bucket_data) const;  // within the bucket
  Buffer own_slice_part(const Bucket& b) const;                // the same within the slice
  Buffer flat_params(std::size_t f) const;
  Buffer grad_slice(std::size_t f) const;

  Communicator& comm_;
  std::vector<ParamRef> params_;
  std::vector<Buffer> buffers_;
  ZeroOptions options_;
  FlatLayout layout_;
  // On the communicator's device: the flat parameters (padded); stage 1's full flat gradients
  // (the loop's accumulation, never overwritten by a collective); the owned, reduced gradient
  // slices the optimizer reads (both stages).
  std::vector<DeviceBuffer> param_store_, flat_grads_, grad_slices_;
  std::array<DeviceBuffer, 2> staging_;  // stage 2; raw words, any dtype's bucket fits
  // Offload: pinned host copies of the owned parameter and gradient slices, per flat buffer.
  std::vector<DeviceBuffer> host_params_, host_grads_;
  bool offload_ = false;
  std::vector<FlatBucket> bucket_ranges_;
  std::vector<Bucket> buckets_;
  std::vector<std::vector<std::size_t>> buckets_of_;  // a split parameter is in several
  std::vector<std::size_t> release_in_;               // the bucket that takes its last piece
  std::vector<bool> ready_;
  std::size_t next_launch_ = 0;
  int next_slot_ = 0;
  std::array<Bucket*, 2> in_slot_{};
  bool sync_enabled_ = true;
  bool first_sync_of_step_ = true;  // no sync since the last optimizer step
  bool flat_parameters_ = false;
  // Stage 2 with gradients asked of it: they are lent, released once in a bucket (released_
  // until take_released), and a later backward of the step adds to the slice.
  bool lent_ = false;
  std::vector<std::size_t> released_;
  std::mutex mutex_;  // hooks may fire on autograd's threads
};

}  // namespace accel
