// Prints the CPU kernels this process's LibTorch computes with, for scripts/cpu_variants.sh:
// "aten: AVX2" (ATen's dispatch, which ATEN_CPU_CAPABILITY sets) and "openblas: Haswell" (the
// kernel family of the OpenBLAS LibTorch loaded, which OPENBLAS_CORETYPE sets). Both fall
// back without a word when the asked one is unknown, so the script checks what was taken.

#include <dlfcn.h>

#include <cstdio>
#include <string>

#include <ATen/ATen.h>

int main() {
  const std::string config = at::show_config();
  const std::string key = "CPU capability usage: ";
  const auto at = config.find(key);
  std::printf(
      "aten: %s\n",
      at == std::string::npos
          ? "unknown"
          : config.substr(at + key.size(), config.find('\n', at) - at - key.size()).c_str());
  // Looked up, not linked: LibTorch may use another BLAS, and then there is nothing to name.
  using CoreName = char* (*)();
  const auto core = reinterpret_cast<CoreName>(::dlsym(RTLD_DEFAULT, "openblas_get_corename"));
  std::printf("openblas: %s\n", core ? core() : "none");
  return 0;
}
