#pragma once
// The hand-written MLP's parameters as the Accelerator sees them: one ParamRef per weight and
// bias, named PREFIX<l>.weight / PREFIX<l>.bias, each weight shaped [out, in] as
// torch::nn::Linear's (row-major), so `accel merge-weights` writes an archive that loads into
// Linear layers registered under those names. Biases go into param group `bias_group`. Layer l
// is ZeRO-3's unit l (the other strategies ignore units).

#include <cstddef>
#include <span>
#include <string>
#include <vector>

#include "backends/backend.hpp"
#include "examples/raw_mlp/mlp.hpp"

namespace raw_mlp {

inline std::vector<accel::ParamRef> param_refs(Mlp& m, const std::string& prefix = "layer",
                                               std::size_t bias_group = 0) {
  std::vector<accel::ParamRef> params;
  for (std::size_t l = 0; l < m.layers().size(); ++l) {
    Layer& L = m.layers()[l];
    const std::string name = prefix + std::to_string(l);
    params.push_back({name + ".weight",
                      accel::buffer_of(std::span(L.weight)),
                      accel::buffer_of(std::span(L.weight_grad)),
                      0,
                      {L.out, L.in},
                      l});
    params.push_back({name + ".bias",
                      accel::buffer_of(std::span(L.bias)),
                      accel::buffer_of(std::span(L.bias_grad)),
                      bias_group,
                      {},
                      l});
  }
  return params;
}

}  // namespace raw_mlp
