#include "accelerate/torch/prepared_script.hpp"

namespace accel {

torch::jit::IValue PreparedScriptModule::forward(std::vector<torch::jit::IValue> inputs) const {
  const AutocastGuard autocast(autocast_);
  torch::jit::IValue out = module_.forward(std::move(inputs));
  if (out.isTensor()) return detail::outputs_to_fp32(out.toTensor());
  return out;
}

}  // namespace accel
