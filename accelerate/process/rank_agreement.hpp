#pragma once
// What every rank of a job must have the same of, checked before the ranks exchange data
// shaped by it (as PyTorch's DDP verifies parameter shapes across processes at construction):
// the parameters, the strategy, accumulation and mixed precision at prepare, the sampler's
// dataset size, batch size and seed at make_sampler. Ranks that differ would otherwise pair
// collectives of different sizes and train on silently, or fail later naming nothing.

#include <string>
#include <vector>

#include "backends/comm/communicator.hpp"
#include "foundation/error.hpp"

namespace accel {

// One thing that must agree: what it is and this rank's value, as the error shows them.
struct AgreedValue {
  std::string what;   // "gradient_accumulation_steps", "parameter 'fc1.weight' shape"
  std::string value;  // "4", "[64, 784]"
};

// Ranks that must agree do not (thrown on every rank, with the same message).
class RankMismatchError : public Error {
 public:
  using Error::Error;
};

// Every rank calls it with its values, in the same order (a list may be shorter on one rank,
// e.g. fewer parameters: put the count first, so that is what the message names). One
// all-gather of 16 bytes per rank when all agree; otherwise every rank throws
// RankMismatchError "CONTEXT: rank R: WHAT is X, rank 0 has Y" for the lowest rank R that
// differs (and lists the others).
void check_ranks_agree(Communicator& comm, const std::vector<AgreedValue>& values,
                       const std::string& context);

// "[64, 784]".
std::string shape_text(const std::vector<std::int64_t>& shape);
// A double as the shortest text that reads back as the same value ("0.01", "1e-08").
std::string exact_text(double value);

}  // namespace accel
