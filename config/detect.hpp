#pragma once
// What this machine offers, for the defaults a config leaves open (how many processes, which
// device). Counted without CUDA: the config library must load where no driver is installed.

#include <string>

namespace accel::config {

struct Hardware {
  int cpu_cores = 1;  // usable by this process (its CPU affinity), at least 1
  int gpus = 0;       // NVIDIA devices, limited by CUDA_VISIBLE_DEVICES when set
};

Hardware detect_hardware();

// "16 CPU cores, no GPU" / "4 GPUs, 64 CPU cores": for messages saying what was detected.
std::string describe(const Hardware&);

}  // namespace accel::config
