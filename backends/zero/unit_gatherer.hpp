#pragma once
// ZeRO-3's parameter gathering (FSDP's unit of all-gather). Each rank keeps only its slice of
// every flat buffer (flat_layout.hpp, the same slices as stages 1 and 2, so checkpoints and
// optimizer state reshard unchanged). Gathering a unit is one all-gather per run of its
// consecutive parameters in a flat buffer (one per flat buffer when the unit's parameters are
// consecutive), with per-rank parts: each rank's overlap with the run
// (Communicator::all_gather with counts).
//
//  - Slots: reshard_after_forward (default) keeps two gathered units at most, in two slots
//    the size of the largest unit: the one in use and the next one being prefetched. Without
//    it every unit has its own slot and stays gathered from its forward to its backward.
//    ZeroOptions::root_unit gives unit 0 (the root, gathered around the others) a third; a
//    model of one unit has one slot.
//  - Prefetch: the first step's gathers are recorded, and each is checked identical on every
//    rank by one small all-reduce before its all-gather (a rank-dependent order fails on every
//    rank, naming both units, instead of pairing the wrong collectives). Afterwards each
//    gather issues the one that followed it in the first step, into the free slot, so it
//    runs while the caller computes. A gather that differs from the prediction just waits.
//  - Persistent parameters (fewer elements than param_persistence_threshold) stay gathered:
//    refresh_persistent() all-gathers them once per step, after the optimizer updated slices.
//  - The framework's buffers (ParamRef::data) receive a unit's values at each gather; nothing
//    else in this class writes them. After use_views() they are not written: the framework
//    points its parameters at view(i), the values' place in the slot (or the persistent
//    storage).

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "backends/backend.hpp"
#include "backends/flat_layout.hpp"
#include "foundation/device_memory.hpp"

namespace accel {

class UnitGatherer {
 public:
  // owned[f]: this rank's slice of flat buffer f (layout.owned(f).count elements).
  UnitGatherer(Communicator& comm, const FlatLayout& layout, const std::vector<ParamRef>& params,
               const std::vector<DeviceBuffer>& owned, const ZeroOptions& options);
  ~UnitGatherer();

  std::size_t num_units() const { return units_.size(); }
  // Blocks until unit `unit` is whole in its parameters' buffers (see the header).
  void gather(std::size_t unit, UnitPass pass);
  void release(std::size_t unit, UnitPass pass);
  // This micro-batch's backward ends the step (sync enabled): its gathers prefetch no forward.
  void set_step_ends(bool ends) { step_ends_ = ends; }
  // The owned slices changed (an optimizer step, a load): nothing gathered is current any more.
  // Waits for prefetches in flight.
  void invalidate();
  // After the first optimizer step: the recorded order is final (see the header).
  void finish_recording() { recording_ = false; }
  // All-gathers the persistent parameters into their buffers.
  void refresh_persistent();
  bool persistent(std::size_t param) const { return persistent_[param]; }
  // Gathers leave the values in the slots only (see the header).
  void use_views() { views_ = true; }
  // Parameter `param`'s values in gathered storage: persistent ones always; the others while
  // their unit is gathered or kept (reshard_after_forward false); else a null buffer.
  Buffer view(std::size_t param) const;
  // Whether a unit with sharded parameters was gathered since the last invalidate(): a step
  // without any means the loop read parameters it holds only a slice of.
  bool gathered_since_invalidate() const { return gathered_ || units_without_shards(); }
  // Gathers that found their unit prefetched (for tests and benchmarks).
  std::uint64_t prefetch_hits() const { return prefetch_hits_; }
  // Bytes of gathered storage (slots and persistent parameters), for the memory accounting.
  std::size_t gathered_bytes() const;

 private:
  struct Range {  // a unit's elements [begin, end) of flat buffer `flat`, at `at` in a slot
    std::size_t flat = 0, begin = 0, end = 0, at = 0;
  };
  struct Unit {
    std::vector<std::size_t> params;  // not persistent, in parameter order
    std::vector<Range> ranges;
    std::size_t bytes = 0;  // in a slot
  };
  struct Slot {
    DeviceBuffer storage;
    long unit = -1;  // the unit it holds, or -1
    bool held = false;
    bool landed = false;         // copied into the parameters' buffers
    bool prefetched = false;     // issued ahead of its gather
    std::vector<WorkPtr> works;  // its gather in flight
  };
  void check_same_unit_everywhere(std::size_t unit, UnitPass pass);
  bool units_without_shards() const;         // every parameter persistent
  int free_slot_for(std::size_t unit);       // -1 when none
  Buffer owned_piece(const Range& r) const;  // this rank's part of r, in its owned slice
  void issue(std::size_t unit, int slot);
  void land(std::size_t unit);  // waits, copies into the parameters' buffers (without views)
  std::string describe(std::size_t unit) const;

  Communicator& comm_;
  const FlatLayout& layout_;
  const std::vector<ParamRef>& params_;
  const std::vector<DeviceBuffer>& owned_;
  const bool reshard_after_forward_;
  std::size_t shared_slots_ = 0;  // with reshard_after_forward: 2, or 1 for a single unit
  bool root_slot_ = false;        // slots_[shared_slots_] is unit 0's (ZeroOptions::root_unit)
  bool views_ = false;
  std::vector<bool> persistent_;
  std::vector<Unit> units_;
  std::vector<Slot> slots_;
  std::vector<int> slot_of_;  // per unit, -1 when not gathered
  // Persistent parameters: runs of consecutive ones per flat buffer, gathered into `kept_`.
  std::vector<Range> persistent_runs_;
  DeviceBuffer kept_;
  // The order of the first step, as (unit << 1 | pass), and what followed each entry.
  bool recording_ = true;
  bool step_ends_ = true;
  bool gathered_ = false;  // since the last invalidate()
  std::uint64_t prefetch_hits_ = 0;
  std::vector<std::uint64_t> order_;
  std::vector<long> next_;  // per (unit << 1 | pass): the entry that followed it, or -1
};

}  // namespace accel
