#include "backends/zero/unit_gatherer.hpp"

#include <algorithm>
#include <functional>

#include "backends/comm/host_collectives.hpp"
#include "backends/replica_sync.hpp"
#include "foundation/error.hpp"

namespace accel {
namespace {

constexpr std::size_t kAlign = 64;  // bytes between ranges in a slot

std::size_t aligned(std::size_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }

// `count` elements of `dtype` at byte `at` of raw storage.
Buffer typed(const DeviceBuffer& storage, std::size_t at, std::size_t count, DType dtype) {
  const Buffer all = storage.view();
  return Buffer{static_cast<char*>(all.data) + at, count, dtype, all.device};
}

DeviceBuffer raw_storage(std::size_t bytes, MemoryKind memory, int device) {
  return DeviceBuffer((bytes + 7) / 8, DType::i64, memory, device);
}

const char* pass_name(UnitPass pass) { return pass == UnitPass::forward ? "forward" : "backward"; }

// Tied parameters (an embedding reused as the output projection) would be gathered and
// stepped as two: each rank's slices of both would drift apart. Refused, naming both.
void refuse_shared_values(const std::vector<ParamRef>& params) {
  std::vector<std::size_t> order(params.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  const auto begin = [&](std::size_t i) { return static_cast<const char*>(params[i].data.data); };
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    return std::less<const char*>()(begin(a), begin(b));
  });
  for (std::size_t k = 1; k < order.size(); ++k) {
    const std::size_t a = order[k - 1], b = order[k];
    if (params[a].data.count == 0 || params[b].data.count == 0) continue;
    if (!std::less<const char*>()(begin(b), begin(a) + params[a].data.bytes())) continue;
    throw InvalidArgument("ZeRO-3: '" + params[a].name + "' (unit " +
                          std::to_string(params[a].unit) + ") and '" + params[b].name + "' (unit " +
                          std::to_string(params[b].unit) +
                          ") share their values (tied parameters): give the strategy one of them");
  }
}

}  // namespace

UnitGatherer::UnitGatherer(Communicator& comm, const FlatLayout& layout,
                           const std::vector<ParamRef>& params,
                           const std::vector<DeviceBuffer>& owned, const ZeroOptions& options)
    : comm_(comm),
      layout_(layout),
      params_(params),
      owned_(owned),
      reshard_after_forward_(options.reshard_after_forward),
      persistent_(params.size()) {
  refuse_shared_values(params);
  std::size_t units = 1;
  for (std::size_t i = 0; i < params.size(); ++i) {
    persistent_[i] = params[i].data.count < options.param_persistence_threshold;
    units = std::max(units, params[i].unit + 1);
  }
  units_.resize(units);
  std::size_t kept_bytes = 0;
  // Walk each flat buffer in order: a unit's consecutive parameters form one range there
  // (persistent ones in its middle are gathered along, unused), and runs of persistent ones
  // are kept gathered.
  for (std::size_t f = 0; f < layout.groups().size(); ++f) {
    const FlatGroup& g = layout.groups()[f];
    const std::size_t esize = element_size(g.dtype);
    long current = -1;  // the unit whose range is open
    for (std::size_t i : g.params) {
      const std::size_t begin = layout.offset_of(i), end = begin + params[i].data.count;
      if (persistent_[i]) {
        if (persistent_runs_.empty() || persistent_runs_.back().flat != f ||
            persistent_runs_.back().end != begin) {
          if (!persistent_runs_.empty()) kept_bytes = aligned(kept_bytes);
          persistent_runs_.push_back({f, begin, begin, kept_bytes});
        }
        persistent_runs_.back().end = end;
        kept_bytes += params[i].data.count * esize;
        continue;
      }
      const std::size_t u = params[i].unit;
      if (long(u) != current) {
        current = long(u);
        units_[u].ranges.push_back({f, begin, end, 0});
      }
      units_[u].ranges.back().end = end;
      units_[u].params.push_back(i);
    }
  }
  const MemoryKind memory = replica_memory(comm);
  const int device = comm.cuda_device();
  root_slot_ = options.root_unit && units > 1 && reshard_after_forward_;
  std::size_t largest = 0;  // of the units sharing the two slots
  for (std::size_t u = 0; u < units; ++u) {
    Unit& unit = units_[u];
    for (Range& r : unit.ranges) {
      r.at = unit.bytes;
      unit.bytes = aligned(r.at + (r.end - r.begin) * element_size(layout.groups()[r.flat].dtype));
    }
    if (!(root_slot_ && u == 0)) largest = std::max(largest, unit.bytes);
  }
  if (reshard_after_forward_) {
    // Two shared slots (one in use, one prefetching), or one when one unit shares them.
    shared_slots_ = std::min<std::size_t>(2, units - (root_slot_ ? 1 : 0));
    for (std::size_t s = 0; s < shared_slots_; ++s)
      slots_.push_back({raw_storage(largest, memory, device), -1, false, false, false, {}});
    if (root_slot_)
      slots_.push_back({raw_storage(units_[0].bytes, memory, device), -1, false, false, false, {}});
  } else {
    for (const Unit& unit : units_)
      slots_.push_back({raw_storage(unit.bytes, memory, device), -1, false, false, false, {}});
  }
  slot_of_.assign(units, -1);
  next_.assign(2 * units, -1);
  if (kept_bytes > 0) kept_ = raw_storage(kept_bytes, memory, device);
}

UnitGatherer::~UnitGatherer() {
  for (Slot& s : slots_)
    for (const WorkPtr& w : s.works) try {
        w->wait();
      } catch (...) {
      }
}

std::size_t UnitGatherer::gathered_bytes() const {
  std::size_t bytes = kept_.view().bytes();
  for (const Slot& s : slots_) bytes += s.storage.view().bytes();
  return bytes;
}

bool UnitGatherer::units_without_shards() const {
  for (const Unit& u : units_)
    if (!u.ranges.empty()) return false;
  return true;
}

std::string UnitGatherer::describe(std::size_t unit) const {
  std::string out = "unit " + std::to_string(unit);
  if (unit < units_.size() && !units_[unit].params.empty())
    out += " ('" + params_[units_[unit].params.front()].name + "'...)";
  return out;
}

void UnitGatherer::check_same_unit_everywhere(std::size_t unit, UnitPass pass) {
  const auto code = std::int64_t(unit << 1 | (pass == UnitPass::backward ? 1 : 0));
  std::int64_t extremes[2] = {code, -code};  // max, -min
  all_reduce_values(comm_, buffer_of(std::span<std::int64_t>(extremes)), ReduceOp::max);
  if (extremes[0] == -extremes[1]) return;
  const auto name = [&](std::int64_t c) {
    return describe(std::size_t(c >> 1)) + " (" +
           pass_name(c & 1 ? UnitPass::backward : UnitPass::forward) + ")";
  };
  throw InvalidArgument("ZeRO-3: the ranks gather units in different orders: at gather #" +
                        std::to_string(order_.size() + 1) +
                        " of the first step one rank gathered " + name(-extremes[1]) +
                        " and another " + name(extremes[0]) +
                        "; every rank must run the same units in the same order");
}

int UnitGatherer::free_slot_for(std::size_t unit) {
  if (!reshard_after_forward_) return int(unit);
  if (root_slot_ && unit == 0) return slots_[shared_slots_].held ? -1 : int(shared_slots_);
  int pick = -1;
  for (std::size_t s = 0; s < shared_slots_; ++s) {
    if (slots_[s].held) continue;
    if (slots_[s].unit < 0) return int(s);
    pick = int(s);  // a prefetched unit nobody asked for yet: evicted
  }
  if (pick >= 0) {
    Slot& s = slots_[std::size_t(pick)];
    for (const WorkPtr& w : s.works) w->wait_stream(comm_.compute_stream(), comm_.timeout());
    s.works.clear();
    slot_of_[std::size_t(s.unit)] = -1;
    s.unit = -1;
  }
  return pick;
}

Buffer UnitGatherer::owned_piece(const Range& r) const {
  const DType dtype = layout_.groups()[r.flat].dtype;
  const Shard own = layout_.owned(r.flat);
  const std::size_t lo = std::clamp(r.begin, own.offset, own.offset + own.count);
  const std::size_t hi = std::clamp(r.end, own.offset, own.offset + own.count);
  const Buffer mine = owned_[r.flat].view();
  return Buffer{static_cast<char*>(mine.data) + (lo - own.offset) * element_size(dtype), hi - lo,
                dtype, mine.device};
}

void UnitGatherer::issue(std::size_t unit, int slot) {
  Slot& s = slots_[std::size_t(slot)];
  s.unit = long(unit);
  s.landed = false;
  s.prefetched = false;
  slot_of_[unit] = slot;
  for (const Range& r : units_[unit].ranges) {
    const DType dtype = layout_.groups()[r.flat].dtype;
    const Buffer input = owned_piece(r);
    s.works.push_back(comm_.all_gather(input, typed(s.storage, r.at, r.end - r.begin, dtype),
                                       layout_.owner_counts(r.flat, r.begin, r.end)));
  }
}

void UnitGatherer::land(std::size_t unit) {
  Slot& s = slots_[std::size_t(slot_of_[unit])];
  const DeviceStream stream = comm_.compute_stream();
  for (const WorkPtr& w : s.works) w->wait_stream(stream, comm_.timeout());
  s.works.clear();
  if (s.landed || views_) {
    s.landed = true;
    return;
  }
  for (const Range& r : units_[unit].ranges) {
    const DType dtype = layout_.groups()[r.flat].dtype;
    for (std::size_t i : units_[unit].params) {
      if (layout_.flat_of(i) != r.flat) continue;
      const std::size_t at = r.at + (layout_.offset_of(i) - r.begin) * element_size(dtype);
      copy_buffer(params_[i].data, typed(s.storage, at, params_[i].data.count, dtype), stream);
    }
  }
  s.landed = true;
}

void UnitGatherer::gather(std::size_t unit, UnitPass pass) {
  ACCEL_CHECK_ARG(unit < units_.size(), "ZeRO-3: no " + describe(unit) + " (the parameters name " +
                                            std::to_string(units_.size()) + " units)");
  const auto code = std::uint64_t(unit << 1 | (pass == UnitPass::backward ? 1 : 0));
  if (recording_) {
    check_same_unit_everywhere(unit, pass);
    if (!order_.empty()) next_[order_.back()] = long(code);
    order_.push_back(code);
  }
  if (units_[unit].ranges.empty()) return;  // every parameter persistent
  gathered_ = true;
  int slot = slot_of_[unit];
  if (slot >= 0 && slots_[std::size_t(slot)].held)
    throw InvalidArgument("ZeRO-3: " + describe(unit) + " gathered for its " + pass_name(pass) +
                          " while still gathered: release it first");
  if (slot < 0) {
    slot = free_slot_for(unit);
    if (slot < 0) {
      std::string held;
      for (const Slot& s : slots_)
        held += (held.empty() ? "" : " and ") + describe(std::size_t(s.unit));
      throw InvalidArgument("ZeRO-3: gathering " + describe(unit) + " while " + held +
                            " are gathered: at most two units are gathered at once (release one "
                            "first, or set reshard_after_forward false)");
    }
    issue(unit, slot);
  } else if (slots_[std::size_t(slot)].prefetched) {
    ++prefetch_hits_;
    slots_[std::size_t(slot)].prefetched = false;
  }
  land(unit);
  slots_[std::size_t(slot)].held = true;
  if (recording_) return;
  // Prefetch what followed last time, unless this backward ends the step (the parameters
  // change before the next forward).
  const long next = next_[code];
  if (next < 0) return;
  const auto next_unit = std::size_t(next) >> 1;
  const bool next_forward = (next & 1) == 0;
  if (pass == UnitPass::backward && next_forward && step_ends_) return;
  if (units_[next_unit].ranges.empty() || slot_of_[next_unit] >= 0) return;
  const int free = free_slot_for(next_unit);
  if (free < 0) return;
  issue(next_unit, free);
  slots_[std::size_t(free)].prefetched = true;
}

void UnitGatherer::release(std::size_t unit, UnitPass pass) {
  ACCEL_CHECK_ARG(unit < units_.size(), "ZeRO-3: no " + describe(unit) + " to release");
  if (units_[unit].ranges.empty()) return;
  const int slot = slot_of_[unit];
  if (slot < 0 || !slots_[std::size_t(slot)].held)
    throw InvalidArgument("ZeRO-3: " + describe(unit) + " released after its " + pass_name(pass) +
                          " but it is not gathered");
  Slot& s = slots_[std::size_t(slot)];
  s.held = false;
  if (!reshard_after_forward_ && pass == UnitPass::forward) return;  // kept for the backward
  s.unit = -1;
  slot_of_[unit] = -1;
}

Buffer UnitGatherer::view(std::size_t param) const {
  const ParamRef& p = params_[param];
  const std::size_t f = layout_.flat_of(param), offset = layout_.offset_of(param);
  const DType dtype = layout_.groups()[f].dtype;
  const auto in = [&](const std::vector<Range>& ranges, const DeviceBuffer& storage) {
    for (const Range& r : ranges)
      if (r.flat == f && offset >= r.begin && offset + p.data.count <= r.end)
        return typed(storage, r.at + (offset - r.begin) * element_size(dtype), p.data.count, dtype);
    return Buffer{nullptr, p.data.count, dtype, p.data.device};
  };
  if (p.data.count == 0) return Buffer{nullptr, 0, dtype, p.data.device};
  if (persistent_[param]) return in(persistent_runs_, kept_);
  const int slot = slot_of_[p.unit];
  if (slot < 0 || !slots_[std::size_t(slot)].landed)
    return Buffer{nullptr, p.data.count, dtype, p.data.device};
  return in(units_[p.unit].ranges, slots_[std::size_t(slot)].storage);
}

void UnitGatherer::invalidate() {
  std::exception_ptr error;
  for (Slot& s : slots_) {
    for (const WorkPtr& w : s.works) try {
        w->wait_stream(comm_.compute_stream(), comm_.timeout());
      } catch (...) {
        if (!error) error = std::current_exception();
      }
    s.works.clear();
    s.unit = -1;
    s.held = false;
  }
  std::fill(slot_of_.begin(), slot_of_.end(), -1);
  gathered_ = false;
  if (error) std::rethrow_exception(error);
}

void UnitGatherer::refresh_persistent() {
  const DeviceStream stream = comm_.compute_stream();
  std::vector<WorkPtr> works;
  for (const Range& r : persistent_runs_) {
    const DType dtype = layout_.groups()[r.flat].dtype;
    const Buffer input = owned_piece(r);
    works.push_back(comm_.all_gather(input, typed(kept_, r.at, r.end - r.begin, dtype),
                                     layout_.owner_counts(r.flat, r.begin, r.end)));
  }
  for (const WorkPtr& w : works) w->wait_stream(stream, comm_.timeout());
  if (views_) return;
  for (const Range& r : persistent_runs_) {
    const DType dtype = layout_.groups()[r.flat].dtype;
    for (std::size_t i : layout_.groups()[r.flat].params) {
      const std::size_t offset = layout_.offset_of(i);
      if (!persistent_[i] || offset < r.begin || offset >= r.end) continue;
      const std::size_t at = r.at + (offset - r.begin) * element_size(dtype);
      copy_buffer(params_[i].data, typed(kept_, at, params_[i].data.count, dtype), stream);
    }
  }
}

}  // namespace accel
