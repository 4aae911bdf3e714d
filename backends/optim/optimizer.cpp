#include "backends/optim/optimizer.hpp"

#include <cstring>

#include "foundation/error.hpp"

namespace accel {
namespace {

void put_u64(std::string& out, std::uint64_t v) {
  out.append(reinterpret_cast<const char*>(&v), 8);
}

}  // namespace

void Optimizer::check_group(std::size_t group) const {
  ACCEL_CHECK_ARG(group < num_groups(), std::string(name()) + ": param group " +
                                            std::to_string(group) + " does not exist (" +
                                            std::to_string(num_groups()) + " groups)");
}

void Optimizer::step(const std::vector<ParamSegment>& segments, const DeviceContext& ctx) {
  // Checked first, so a bad segment changes nothing.
  for (std::size_t k = 0; k < segments.size(); ++k) {
    const ParamSegment& s = segments[k];
    check_group(s.group);
    ACCEL_CHECK_ARG(s.values.dtype == DType::f32 && s.grad.dtype == DType::f32,
                    std::string(name()) + ": segment " + std::to_string(k) + " (param group " +
                        std::to_string(s.group) + ") is " +
                        std::string(dtype_name(s.values.dtype)) +
                        "; the built-in optimizers update f32 parameters");
    ACCEL_CHECK_ARG(
        s.values.count == s.grad.count,
        std::string(name()) + ": segment " + std::to_string(k) + " has a gradient of another size");
    ACCEL_CHECK_ARG(s.values.device == s.grad.device,
                    std::string(name()) + ": segment " + std::to_string(k) +
                        " has its values and its gradient on different devices");
    ACCEL_CHECK_ARG(s.values.device == DeviceKind::cpu || cuda_kernels_built(),
                    std::string(name()) + ": segment " + std::to_string(k) +
                        " is in CUDA memory, and this build of accelerate-cpp has no CUDA "
                        "kernels (configured with ACCEL_WITH_CUDA=OFF or without nvcc)");
  }
  if (state_.empty() && segment_counts_.empty()) {
    // First step (or nothing loaded): allocate each segment's state, zeroed.
    for (const ParamSegment& s : segments) {
      std::vector<StateArray> slots;
      for (std::size_t slot = 0; slot < state_slots(s.group); ++slot) {
        slots.emplace_back(s.values.count, s.values.device, ctx);
        state_bytes_ += s.values.count * sizeof(float);
      }
      state_.push_back(std::move(slots));
      segment_counts_.push_back(s.values.count);
    }
  }
  ACCEL_CHECK_ARG(segment_counts_.size() == segments.size(),
                  std::string(name()) + ": stepped with " + std::to_string(segments.size()) +
                      " segments, its state has " + std::to_string(segment_counts_.size()));
  for (std::size_t k = 0; k < segments.size(); ++k)
    ACCEL_CHECK_ARG(segment_counts_[k] == segments[k].values.count,
                    std::string(name()) + ": segment " + std::to_string(k) + " has " +
                        std::to_string(segments[k].values.count) + " elements, its state " +
                        std::to_string(segment_counts_[k]));
  // State loaded from a checkpoint lands in host memory; it follows its segment to the GPU.
  for (std::size_t k = 0; k < segments.size(); ++k)
    for (StateArray& slot : state_[k])
      if (slot.device() != segments[k].values.device)
        slot = slot.to(segments[k].values.device, ctx);
  ++steps_;
  context_ = ctx;
  std::vector<float*> state;
  for (std::size_t k = 0; k < segments.size(); ++k) {
    state.clear();
    for (StateArray& slot : state_[k]) state.push_back(slot.data());
    update(segments[k], state, steps_, ctx);
  }
}

std::string Optimizer::save_state() const {
  std::string out;
  put_u64(out, steps_);
  put_u64(out, state_.size());
  for (std::size_t k = 0; k < state_.size(); ++k) {
    put_u64(out, segment_counts_[k]);
    put_u64(out, state_[k].size());
    for (const StateArray& slot : state_[k]) {
      const std::size_t at = out.size();
      out.resize(at + slot.count() * sizeof(float));
      slot.read(reinterpret_cast<float*>(out.data() + at), context_);  // from GPU memory too
    }
  }
  return out;
}

void Optimizer::load_state(const std::string& bytes) {
  const SavedOptimizerState saved = parse_optimizer_state(bytes, std::string(name()) + " state");
  ACCEL_CHECK_ARG(segment_counts_.empty() || saved.segments.size() == segment_counts_.size(),
                  std::string(name()) + " state: " + std::to_string(saved.segments.size()) +
                      " segments, this optimizer has " + std::to_string(segment_counts_.size()));
  std::vector<std::vector<StateArray>> state;
  std::vector<std::size_t> counts;
  std::size_t state_bytes = 0;
  for (std::size_t k = 0; k < saved.segments.size(); ++k) {
    const SavedOptimizerState::Segment& in = saved.segments[k];
    ACCEL_CHECK_ARG(segment_counts_.empty() || in.count == segment_counts_[k],
                    std::string(name()) + " state: segment " + std::to_string(k) + " has " +
                        std::to_string(in.count) + " elements, this optimizer's has " +
                        std::to_string(segment_counts_[k]));
    std::vector<StateArray> seg;
    for (std::uint64_t slot = 0; slot < in.slots; ++slot) {
      // Host memory first; the next step moves it to its segment's device.
      seg.emplace_back(in.count, DeviceKind::cpu);
      std::memcpy(seg.back().data(), in.data + slot * in.count * sizeof(float),
                  in.count * sizeof(float));
      state_bytes += in.count * sizeof(float);
    }
    state.push_back(std::move(seg));
    counts.push_back(in.count);
  }
  steps_ = saved.step;
  state_ = std::move(state);
  segment_counts_ = std::move(counts);
  state_bytes_ = state_bytes;
}

std::vector<float> SavedOptimizerState::Segment::slot(std::uint64_t s) const {
  std::vector<float> out(count);
  std::memcpy(out.data(), data + s * count * sizeof(float), count * sizeof(float));
  return out;
}

SavedOptimizerState parse_optimizer_state(std::string_view bytes, const std::string& what) {
  std::size_t at = 0;
  auto u64 = [&](const std::string& of) {
    if (at + 8 > bytes.size()) throw InvalidArgument(what + ": truncated at " + of);
    std::uint64_t v = 0;
    std::memcpy(&v, bytes.data() + at, 8);
    at += 8;
    return v;
  };
  SavedOptimizerState out;
  out.step = u64("the step count");
  const std::uint64_t segments = u64("the segment count");
  for (std::uint64_t k = 0; k < segments; ++k) {
    const std::string of = "segment " + std::to_string(k);
    SavedOptimizerState::Segment seg;
    seg.count = u64(of);
    seg.slots = u64(of);
    const std::size_t left = bytes.size() - at;  // (no product that could overflow)
    if (seg.slots > left || (seg.slots > 0 && seg.count > left / (seg.slots * sizeof(float))))
      throw InvalidArgument(what + ": truncated in " + of);
    seg.data = bytes.data() + at;
    at += seg.count * seg.slots * sizeof(float);
    out.segments.push_back(seg);
  }
  if (at != bytes.size())
    throw InvalidArgument(what + ": " + std::to_string(bytes.size() - at) + " bytes left over");
  return out;
}

}  // namespace accel
