#include "backends/optim/optimizer.hpp"

#include <cstring>

#include "backends/comm/error.hpp"

namespace accel {
namespace {

void put_u64(std::string& out, std::uint64_t v) { out.append(reinterpret_cast<const char*>(&v), 8); }

std::uint64_t get_u64(const std::string& in, std::size_t& at, const std::string& what) {
  if (at + 8 > in.size()) throw InvalidArgument("optimizer state: truncated at " + what);
  std::uint64_t v = 0;
  std::memcpy(&v, in.data() + at, 8);
  at += 8;
  return v;
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
    ACCEL_CHECK_ARG(s.values.count == s.grad.count,
                    std::string(name()) + ": segment " + std::to_string(k) +
                        " has a gradient of another size");
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
      if (slot.device() != segments[k].values.device) slot = slot.to(segments[k].values.device, ctx);
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
  std::size_t at = 0;
  const std::uint64_t steps = get_u64(bytes, at, "the step count");
  const std::uint64_t segments = get_u64(bytes, at, "the segment count");
  ACCEL_CHECK_ARG(segment_counts_.empty() || segments == segment_counts_.size(),
                  std::string(name()) + " state: " + std::to_string(segments) +
                      " segments, this optimizer has " + std::to_string(segment_counts_.size()));
  std::vector<std::vector<StateArray>> state;
  std::vector<std::size_t> counts;
  std::size_t state_bytes = 0;
  for (std::uint64_t k = 0; k < segments; ++k) {
    const std::string where = "segment " + std::to_string(k);
    const std::uint64_t count = get_u64(bytes, at, where);
    const std::uint64_t slots = get_u64(bytes, at, where);
    ACCEL_CHECK_ARG(segment_counts_.empty() || count == segment_counts_[k],
                    std::string(name()) + " state: " + where + " has " + std::to_string(count) +
                        " elements, this optimizer's has " + std::to_string(segment_counts_[k]));
    std::vector<StateArray> seg;
    for (std::uint64_t slot = 0; slot < slots; ++slot) {
      if (at + count * sizeof(float) > bytes.size())
        throw InvalidArgument(std::string(name()) + " state: truncated in " + where);
      // Host memory first; the next step moves it to its segment's device.
      seg.emplace_back(count, DeviceKind::cpu);
      std::memcpy(seg.back().data(), bytes.data() + at, count * sizeof(float));
      at += count * sizeof(float);
      state_bytes += count * sizeof(float);
    }
    state.push_back(std::move(seg));
    counts.push_back(count);
  }
  ACCEL_CHECK_ARG(at == bytes.size(), std::string(name()) + " state: " +
                                          std::to_string(bytes.size() - at) +
                                          " bytes left over");
  steps_ = steps;
  state_ = std::move(state);
  segment_counts_ = std::move(counts);
  state_bytes_ = state_bytes;
}

}  // namespace accel
