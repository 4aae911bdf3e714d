#pragma once
// ZeRO (DeepSpeed's Zero Redundancy Optimizer), stages 1, 2 and 3: the optimizer updates only
// this rank's slice of each flat (param group, dtype) buffer (flat_layout.hpp), so optimizer
// state exists for that slice only. Stages 1 and 2 keep the full parameters on every rank.
//  - stage 1: full flat gradient buffers (backend.hpp's "slots"); at the boundary they are
//    reduce-scattered (average) in buckets during backward into this rank's gradient slice,
//    out of place, so a later backward still adds to what the loop accumulated;
//  - stage 2: only the owned slices and two staging buckets; gradients are lent (backend.hpp's
//    "lent") and released once their bucket copied them in.
//  - between boundaries nothing moves (no_sync); the slice gets exactly DDP's average of the
//    accumulated gradients (DeepSpeed's stage 2 reduces every micro-batch: K times the bytes);
//  - several backwards per step sum as autograd does: kept gradients re-average into the
//    slice at each sync, released ones add each sync's average after the first;
//  - stage 3: gradients as stage 2, and the parameters sharded too: this rank keeps only its
//    slices, a unit's values are gathered around its forward and its backward
//    (unit_gatherer.hpp), and after the optimizer step only the persistent parameters are
//    gathered. Per step: one reduce-scatter and two all-gathers of the parameters' bytes (one
//    with reshard_after_forward false). The slices and their checkpoints are stage 2's.
//  - reduce-scatters carry per-rank parts (Communicator::reduce_scatter with counts), strictly
//    in bucket order; after_optimizer_step() all-gathers each flat parameter buffer (no copy
//    for parameters living in it: use_param_slots()). Per step: the bytes of one all-reduce.
// Devices: buffers live where the communicator works; copies and waits are ordered on the
// compute stream. offload_optimizer = cpu with GPU parameters: segments() are pinned host
// copies of the slices (the optimizer and its state on the host); with CPU parameters it
// changes nothing (rank 0 notes so at prepare()).

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "backends/backend.hpp"
#include "backends/flat_layout.hpp"
#include "backends/zero/unit_gatherer.hpp"
#include "foundation/device_memory.hpp"

namespace accel {

class ZeroStrategy final : public Strategy {
 public:
  ZeroStrategy(Communicator& comm, std::vector<ParamRef> params, std::vector<Buffer> buffers = {},
               ZeroOptions options = {});
  ~ZeroStrategy() override;

  std::string_view name() const override;
  int stage() const { return options_.stage; }
  // Broadcasts parameters and buffers from rank 0 and fills the flat parameter buffers.
  void prepare() override;
  void grad_ready(std::size_t index) override;
  // At a boundary (sync enabled): finishes the reduce-scatters, the slices hold the averages.
  void sync_gradients() override;
  void set_sync_enabled(bool enabled) override;
  bool sync_enabled() const override { return sync_enabled_; }
  void sync_buffers() override;
  const std::vector<ParamRef>& params() const override { return params_; }

  // One segment per flat buffer: this rank's slice of the parameters and its gradient.
  std::vector<ParamSegment> segments() const override;
  bool gradients_sharded() const override { return true; }
  int gradient_replicas() const override { return replicas_ ? replicas_->world_size() : 1; }
  void after_optimizer_step() override;
  void reload_parameters() override;
  std::size_t gradient_bytes() const override;

  const FlatLayout& layout() const { return layout_; }
  // Whether segments() are pinned host copies (offload_optimizer cpu, parameters on a GPU).
  bool offloads_optimizer() const { return offload_; }
  // Stage 3 (see the header).
  bool parameters_sharded() const override { return options_.stage == 3; }
  void gather_unit(std::size_t unit, UnitPass pass) override;
  void release_unit(std::size_t unit, UnitPass pass) override;
  // Stage 3 for a framework whose parameters live in the gathered storage (backend.hpp).
  void use_gathered_views() override;
  Buffer gathered_view(std::size_t index) const override;
  void load_parameters(const std::vector<Buffer>& values) override;
  // Stage 3: bytes of gathered parameter storage (two units' slots and the persistent ones).
  std::size_t gathered_parameter_bytes() const;
  // Stage 3: gathers whose unit had been prefetched.
  std::uint64_t prefetch_hits() const { return gatherer_ ? gatherer_->prefetch_hits() : 0; }
  // Parameter i's place in its flat parameter buffer (same dtype and count); stage 3 has none.
  bool has_param_slots() const override { return options_.stage != 3; }
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
  void withdraw_grad(std::size_t index) override;
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
  void average_across_replicas();  // HYBRID_SHARD's second step of a sync
  // Stage 3: this rank's parts of each parameter's full values (index for index).
  void copy_owned_parts_in(const std::vector<Buffer>& values);
  // The part of parameter `index` this rank's slices hold: where it starts in the parameter
  // and in the slice, and how long it is (0: none of it).
  struct OwnedPiece {
    std::size_t in_param = 0, in_slice = 0, count = 0;
  };
  OwnedPiece owned_piece(std::size_t index) const;
  void copy_owned_to_host();
  Buffer own_part(const Bucket& b, Buffer bucket_data) const;  // within the bucket
  Buffer own_slice_part(const Bucket& b) const;                // the same within the slice
  Buffer flat_params(std::size_t f) const;                     // stages 1 and 2
  Buffer owned_params(std::size_t f) const;  // this rank's slice (all stage 3 keeps)
  Buffer grad_slice(std::size_t f) const;

  Communicator& comm_;   // every rank: the start from rank 0's values, the buffers
  Communicator& shard_;  // the ranks sharing the slices (comm_, or HYBRID_SHARD's machine)
  Communicator* replicas_ = nullptr;  // HYBRID_SHARD: the same slice on every machine
  std::vector<ParamRef> params_;
  std::vector<Buffer> buffers_;
  ZeroOptions options_;
  FlatLayout layout_;
  // On the communicator's device: the flat parameters (padded); stage 1's full flat gradients
  // (the loop's accumulation, never overwritten by a collective); the owned, reduced gradient
  // slices the optimizer reads (both stages).
  // Stage 3's param_store_ holds the owned slices only.
  std::vector<DeviceBuffer> param_store_, flat_grads_, grad_slices_;
  std::unique_ptr<UnitGatherer> gatherer_;  // stage 3
  std::array<DeviceBuffer, 2> staging_;     // stage 2; raw words, any dtype's bucket fits
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
  // Every lent gradient was withdrawn since the last sync: what the slices hold is stale, and
  // the next sync's reductions replace it instead of adding to it.
  bool slices_withdrawn_ = true;
  bool flat_parameters_ = false;
  bool gathered_views_ = false;  // stage 3: the ParamRefs' buffers are not the framework's
  // Stage 2 with gradients asked of it: they are lent, released once in a bucket (released_
  // until take_released), and a later backward adds to the slice until the loop withdraws
  // them (its zero_grad), as autograd adds into .grad().
  bool lent_ = false;
  std::vector<std::size_t> released_;
  std::mutex mutex_;  // hooks may fire on autograd's threads
};

}  // namespace accel
