#include "foundation/store/store_join.hpp"

#include "foundation/error.hpp"

namespace accel {

std::vector<int> join_on_store(Store& store, const std::string& prefix, int rank, int world,
                               Milliseconds timeout) {
  store.set(prefix + std::to_string(rank), "1");
  std::vector<std::string> keys;
  for (int r = 0; r < world; ++r) keys.push_back(prefix + std::to_string(r));
  try {
    store.wait(keys, timeout);
    return {};
  } catch (const TimeoutError&) {
    std::vector<int> missing;
    for (int r = 0; r < world; ++r)
      if (!store.check({keys[std::size_t(r)]})) missing.push_back(r);
    return missing;
  }
}

}  // namespace accel
