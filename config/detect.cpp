#include "config/detect.hpp"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <string_view>

#include "foundation/host_cores.hpp"

namespace accel::config {
namespace {

int count_gpu_devices() {
  // /dev/nvidia0, /dev/nvidia1, ... (not nvidiactl, nvidia-uvm): one per GPU the driver exposes.
  int n = 0;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/dev", ec)) {
    const std::string name = entry.path().filename().string();
    if (name.size() > 6 && name.starts_with("nvidia") &&
        std::all_of(name.begin() + 6, name.end(),
                    [](char c) { return std::isdigit(static_cast<unsigned char>(c)); }))
      ++n;
  }
  return n;
}

// How many devices CUDA_VISIBLE_DEVICES lets a process see: CUDA reads the list up to the
// first invalid entry ("-1" hides everything), ids or GPU-/MIG- UUIDs.
int count_visible(std::string_view list) {
  int n = 0;
  while (!list.empty()) {
    const auto comma = list.find(',');
    std::string_view item = list.substr(0, comma);
    while (!item.empty() && item.front() == ' ') item.remove_prefix(1);
    while (!item.empty() && item.back() == ' ') item.remove_suffix(1);
    const bool id = !item.empty() && std::all_of(item.begin(), item.end(), [](char c) {
      return std::isdigit(static_cast<unsigned char>(c));
    });
    if (!id && !item.starts_with("GPU-") && !item.starts_with("MIG-")) break;
    ++n;
    if (comma == std::string_view::npos) break;
    list.remove_prefix(comma + 1);
  }
  return n;
}

}  // namespace

Hardware detect_hardware() {
  Hardware hw;
  // The affinity mask, not the machine: under a cpuset (containers, taskset, Slurm) only
  // those cores are ours, and sizing the job by the machine would oversubscribe them.
  hw.cpu_cores = usable_cores();
  hw.gpus = count_gpu_devices();
  if (const char* visible = std::getenv("CUDA_VISIBLE_DEVICES"); visible != nullptr)
    hw.gpus = std::min(hw.gpus, count_visible(visible));
  return hw;
}

std::string describe(const Hardware& hw) {
  const std::string cores =
      std::to_string(hw.cpu_cores) + (hw.cpu_cores == 1 ? " CPU core" : " CPU cores");
  if (hw.gpus == 0) return cores + ", no GPU";
  return std::to_string(hw.gpus) + (hw.gpus == 1 ? " GPU, " : " GPUs, ") + cores;
}

}  // namespace accel::config
