#pragma once
// The strategy interface: how model state is laid out and synchronised across ranks (DDP,
// ZeRO, DataParallel, or nothing for a single process). The front end (Accelerator) drives a
// Strategy through these calls and nothing else, so a training loop does not change when the
// config picks another strategy. Strategies see parameters as typed buffer views, never as
// framework tensors: LibTorch and raw C++ loops are served alike. Adding a strategy: a folder
// in backends/, its options below, one line in strategy_factory.cpp.
//
// Gradient storage (the contract between a strategy and the front end):
//  - a ParamRef's grad with data is the loop's own buffer, valid for the strategy's life: the
//    strategy reads it at grad_ready / sync_gradients and writes the synchronised gradient
//    back there or into segments();
//  - a ParamRef's grad without data (gradient_wanted(data): dtype, count, device only) asks the
//    strategy for storage, and gradient_storage() says what it gives:
//      slots: grad_slot(replica, i), allocated by the constructor, valid until destruction;
//             the framework makes its gradient live there (DDP's bucket view, ZeRO-1's flat
//             buffer, DataParallel's per-replica storage);
//      lent:  no storage (ZeRO-2): the framework allocates a gradient per backward and lends
//             it, lend_grad(i, grad), before grad_ready(i); once the strategy copied it,
//             take_released() lists i and the framework frees it ("released"). A parameter
//             with nothing lent counts as zero. What a released gradient contributed stays
//             in the strategy's shards until the loop resets it: withdraw_grad(i) for one
//             parameter (a module's zero_grad()), withdraw_grads() for all (the optimizer's).
//
// Parameter units (ZeRO-3, parameters_sharded()): each rank keeps only its slice of the
// parameters; a unit's full values exist only between gather_unit(u, pass) and
// release_unit(u, pass), which the framework calls around the unit's forward and again around
// its backward (ParamRef::unit says which unit a parameter is in; the other strategies keep
// every parameter whole and ignore both calls, so a loop written with them runs anywhere).
#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "backends/comm/communicator.hpp"
#include "foundation/error.hpp"
#include "foundation/reduce.hpp"

namespace accel {

// What grad_ready says when a parameter is reported twice before the sync, with the usual
// cause and its fix (the strategies' one message).
inline std::string ready_twice_problem(const std::string& strategy, const std::string& param) {
  return strategy + ": the gradient of '" + param +
         "' was reported ready twice before the gradients were synchronised: a backward ran "
         "through the prepared model without the accelerator (loss.backward() called directly, "
         "e.g. for the loss of another model that flows through this one), and then another. "
         "Call acc.backward(loss) for every backward through a prepared model, and prepare every "
         "model whose loss needs one (raw API: report each gradient once per micro-batch, then "
         "sync_gradients())";
}

// Which strategy make_strategy builds (the config's distributed_type picks it).
enum class StrategyKind {
  ddp,           // also the world of one and every other multi-process type
  zero,          // ZeroOptions::stage
  data_parallel  // one process, DataParallelOptions::replicas replicas on threads
};

// A gradient the strategy is asked to store (see the contract above).
inline Buffer gradient_wanted(const Buffer& data) {
  return Buffer{nullptr, data.count, data.dtype, data.device};
}

// What a strategy gives for gradients asked of it (see the contract above).
enum class GradientStorage { slots, lent };

// Which pass a unit's parameters are gathered for (see the contract above).
enum class UnitPass { forward, backward };

// One trainable parameter: its values and its gradient (same dtype, count and device), and
// the optimizer param group it belongs to (ZeRO lays out one flat buffer per group and dtype).
struct ParamRef {
  std::string name;
  Buffer data;
  Buffer grad;
  std::size_t group = 0;
  // The tensor's shape, recorded in checkpoints so `accel merge-weights` can rebuild it (the
  // LibTorch adapter fills it in). Empty means one dimension of data.count elements.
  std::vector<std::int64_t> shape;
  // ZeRO-3's unit (see the contract above). All in unit 0: the model is one unit.
  std::size_t unit = 0;
};

// A run of parameter values and their synchronised gradient that this rank's optimizer
// updates: DDP hands out every full parameter, ZeRO this rank's slice of each flat
// (group, dtype) buffer. Element-wise optimizers give the same result either way.
struct ParamSegment {
  std::size_t group = 0;
  Buffer values;
  Buffer grad;
  // Where values start among the group's parameters laid end to end in parameter order (the
  // same coordinates under every strategy and world size: checkpoints reshard by them; a
  // ZeRO slice may reach past the end into padding).
  std::size_t offset = 0;
};

// ---- each strategy's options (make_strategy passes the one its kind names)

struct DdpOptions {
  std::size_t bucket_cap_bytes = 25u << 20;
  std::size_t first_bucket_bytes = 1u << 20;
  bool broadcast_buffers = true;  // re-broadcast buffers (e.g. BatchNorm statistics) each step
};

// Where the optimizer state lives (the config's offload_optimizer_device).
enum class OffloadDevice { none, cpu };

struct ZeroOptions {
  int stage = 2;  // 1, 2 or 3
  // cpu with parameters on a GPU: the optimizer steps pinned host copies of this rank's
  // slices (zero_strategy.hpp); with CPU parameters it changes nothing (a note says so).
  OffloadDevice offload_optimizer = OffloadDevice::none;
  std::size_t bucket_cap_bytes = 25u << 20;  // gradient reduce-scatter buckets
  bool broadcast_buffers = true;             // as DdpOptions::broadcast_buffers
  // Stage 3: parameters with fewer elements stay gathered on every rank (DeepSpeed's
  // stage3_param_persistence_threshold); a unit's others are gathered while it runs.
  std::size_t param_persistence_threshold = 100000;
  // Stage 3: free a unit's gathered parameters after its forward, gathering them again for
  // its backward (FSDP's reshard_after_forward); false keeps them from forward to backward.
  bool reshard_after_forward = true;
  // Stage 3: unit 0 is the model's root (the LibTorch adapter: the parameters outside every
  // child unit), gathered from the model's forward to the end of its backward around the
  // others: a slot of its own beside the two the child units share.
  bool root_unit = false;
  // HYBRID_SHARD (FSDP's): shard over `shard_group` (this machine's ranks) and replicate over
  // `replica_group` (the ranks of this local index on every machine), both the caller's and
  // alive as long as the strategy: the slices are 1/shard_group's size, gradients are
  // reduce-scattered within the machine and their slices averaged across machines. Null: the
  // whole communicator is one shard group.
  Communicator* shard_group = nullptr;
  Communicator* replica_group = nullptr;
};

struct DataParallelOptions {
  int replicas = 1;  // K, replica 0 included
  // Empty: CPU replicas. Else the CUDA device of each replica (K entries; devices may repeat,
  // several replicas sharing a GPU), which its parameters and gradients must be on.
  std::vector<int> cuda_devices;
  // Runs once on each worker thread k before its first task (the LibTorch adapter sets the
  // worker's intra-op thread count there).
  std::function<void(int)> worker_init;
  // Replicas 1..K-1: parameters (matching replica 0's one for one) and buffers.
  std::vector<std::vector<ParamRef>> replica_params;
  std::vector<std::vector<Buffer>> replica_buffers;
};

struct StrategyOptions {
  StrategyKind kind = StrategyKind::ddp;
  DdpOptions ddp;
  ZeroOptions zero;  // zero.stage from the config's zero_stage
  // replicas from the config's data_parallel_replicas; the front end adds the copies.
  DataParallelOptions data_parallel;
};

// Replicas of the model in this process (DataParallel): the front end runs each replica's
// forward and backward through run(), and weights each replica's gradient by its share of the
// batch; the strategy sums them into replica 0 at sync_gradients().
// How `rows` rows are split between `replicas` replicas: torch.chunk's rule (what
// torch.nn.DataParallel scatters by): contiguous chunks of ceil(rows / replicas) rows, the last
// one shorter, so fewer replicas get rows when rows does not fill them (10 over 4: 3, 3, 3, 1;
// 6 over 4: 2, 2, 2, 0). Always `replicas` entries, empty ones at the end.
std::vector<Shard> chunk_rows(std::size_t rows, int replicas);

class ReplicaSet {
 public:
  virtual ~ReplicaSet() = default;
  virtual int count() const = 0;  // K, replica 0 (the prepared model) included
  // Runs fn(k) for every replica k on its worker thread (replica k's CUDA device current for
  // GPU replicas) and returns when all are done.
  virtual void run(const std::function<void(int)>& fn) = 0;
  // The weight of each replica's gradient in the next reductions (K values; default all 1).
  virtual void set_weights(std::vector<double> weights) = 0;
};

class Strategy {
 public:
  virtual ~Strategy() = default;
  virtual std::string_view name() const = 0;

  // Once, before training: every rank starts from the same parameters.
  virtual void prepare() = 0;

  // During backward: the gradient of parameter `index` is final for this iteration. May
  // start communication right away (overlap with the rest of backward).
  virtual void grad_ready(std::size_t index) = 0;

  // After backward: when it returns, every gradient is synchronised (for DDP: the average
  // over ranks). Parameters that reported no gradient this iteration count as zero.
  virtual void sync_gradients() = 0;

  // Gradient accumulation: while off, grad_ready and sync_gradients do nothing and gradients
  // simply accumulate locally (PyTorch's no_sync).
  virtual void set_sync_enabled(bool enabled) = 0;
  virtual bool sync_enabled() const = 0;

  // Broadcasts the non-trainable buffers (e.g. BatchNorm statistics) from rank 0.
  virtual void sync_buffers() = 0;

  // The parameters as prepared (names, full views).
  virtual const std::vector<ParamRef>& params() const = 0;

  // ---- the optimizer step (the hook that lets one loop run under DDP and ZeRO alike)
  // What this rank's optimizer updates after a sync, in a fixed order (param group, then
  // parameter order) and with views that stay valid: see ParamSegment.
  virtual std::vector<ParamSegment> segments() const = 0;
  // Whether segments() hold only this rank's part of the gradients, so a global quantity (the
  // gradient norm) needs a sum over ranks.
  virtual bool gradients_sharded() const = 0;
  // How many ranks hold each gradient slice (ZeRO's HYBRID_SHARD: one per machine); a sum over
  // all ranks counts each that many times.
  virtual int gradient_replicas() const { return 1; }
  // After the optimizer updated segments(): ZeRO all-gathers the updated parameters into
  // every rank's full copy; DDP has nothing to do.
  virtual void after_optimizer_step() = 0;
  // The parameters' values were changed from outside (a checkpoint was loaded into them):
  // ZeRO copies them into its flat buffers; DDP holds no copy.
  virtual void reload_parameters() {}

  // ---- storage the strategy provides (see the contract at the top)
  // For ParamRefs given without gradient storage.
  virtual GradientStorage gradient_storage() const = 0;
  // slots: where parameter `index`'s gradient of `replica` lives (replica 0 unless
  // replicas() says otherwise); same dtype, count and device as the parameter.
  virtual Buffer grad_slot(int replica, std::size_t index) const;
  // lent: the framework's gradient of parameter `index` for this backward.
  virtual void lend_grad(std::size_t index, Buffer grad);
  // lent: the parameters whose lent gradient the strategy no longer reads, since the last call.
  virtual std::vector<std::size_t> take_released() { return {}; }
  // lent: the loop reset parameter `index`'s gradient: nothing is lent for it any more, and
  // what it contributed since its last reset is forgotten (it counts as zero from here).
  virtual void withdraw_grad(std::size_t /*index*/) {}
  // lent: withdraw_grad for every parameter (the framework freed every lent gradient).
  virtual void withdraw_grads() {}
  // Whether the strategy keeps the parameters' values in storage of its own (ZeRO's flat
  // buffers) that the framework may make its parameters live in: param_slot(i) is parameter
  // i's place, and after use_param_slots() the strategy writes updated values only there.
  virtual bool has_param_slots() const { return false; }
  virtual Buffer param_slot(std::size_t index) const;
  virtual void use_param_slots();
  // The replicas of the model in this process (DataParallel), or null.
  virtual ReplicaSet* replicas() { return nullptr; }

  // ---- parameter units (see the contract at the top)
  // Whether each rank keeps only its slice of the parameters (ZeRO-3): the ParamRefs' own
  // buffers then hold a unit's values only while it is gathered, and checkpoints take the
  // values from segments().
  virtual bool parameters_sharded() const { return false; }
  // Blocks until unit `unit`'s parameters are whole in their ParamRefs' buffers.
  virtual void gather_unit(std::size_t /*unit*/, UnitPass /*pass*/) {}
  // The pass of unit `unit` is over: its gathered parameters may be freed.
  virtual void release_unit(std::size_t /*unit*/, UnitPass /*pass*/) {}
  // A framework that makes its parameters live in the gathered storage itself (the LibTorch
  // adapter) instead of receiving copies in the ParamRefs' buffers, which it frees: after
  // use_gathered_views() gathered_view(i) is where parameter i's values are while its unit
  // is gathered (always, for one that stays gathered), and a null buffer otherwise; a load
  // hands the full values to load_parameters (index for index), which keeps this rank's parts.
  virtual void use_gathered_views();
  virtual Buffer gathered_view(std::size_t index) const;
  virtual void load_parameters(const std::vector<Buffer>& values);

  // Gradient memory this strategy allocated, in bytes (DDP: its buckets; ZeRO-1: the flat
  // gradient buffers; ZeRO-2: the owned slices and two buckets).
  virtual std::size_t gradient_bytes() const = 0;
};

inline std::string_view strategy_kind_name(StrategyKind kind) {
  switch (kind) {
    case StrategyKind::ddp:
      return "ddp";
    case StrategyKind::zero:
      return "zero";
    case StrategyKind::data_parallel:
      return "data_parallel";
  }
  return "unknown";
}

// What a strategy does not provide is a programming error of the front end's: it asked
// without checking gradient_storage() / has_param_slots().
inline void Strategy::use_gathered_views() {
  throw InvalidArgument(std::string(name()) + " does not shard parameters (ZeRO-3 does)");
}
inline Buffer Strategy::gathered_view(std::size_t) const {
  throw InvalidArgument(std::string(name()) + " does not shard parameters (ZeRO-3 does)");
}
inline void Strategy::load_parameters(const std::vector<Buffer>&) {
  throw InvalidArgument(std::string(name()) + " does not shard parameters (ZeRO-3 does)");
}
inline Buffer Strategy::grad_slot(int, std::size_t) const {
  throw InvalidArgument(std::string(name()) + " keeps no gradient slots");
}
inline void Strategy::lend_grad(std::size_t, Buffer) {
  throw InvalidArgument(std::string(name()) + " takes no lent gradients");
}
inline Buffer Strategy::param_slot(std::size_t) const {
  throw InvalidArgument(std::string(name()) + " keeps no parameter storage");
}
inline void Strategy::use_param_slots() {
  throw InvalidArgument(std::string(name()) + " keeps no parameter storage");
}

}  // namespace accel
