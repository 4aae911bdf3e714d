#pragma once
// An in-process Store: a map behind a mutex, with a condition variable for blocking get and
// wait. For tests, for ranks run as threads of one process, and as the key map inside the
// TCP store server.

#include <condition_variable>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "foundation/store/store.hpp"

namespace accel {

class MemoryStore final : public Store {
 public:
  MemoryStore() = default;

  // The overloads taking the default timeout, otherwise hidden by the overrides below.
  using Store::get;
  using Store::wait;

  void set(const std::string& key, const std::string& value) override;
  std::string get(const std::string& key, Milliseconds timeout) override;
  // The value is kept as decimal text, so get() after add() reads "5". A present value that
  // is not a decimal integer, or a sum that overflows, throws StoreError naming the key.
  std::int64_t add(const std::string& key, std::int64_t delta) override;
  std::string compare_set(const std::string& key, const std::string& expected,
                          const std::string& desired) override;
  void wait(const std::vector<std::string>& keys, Milliseconds timeout) override;
  bool check(const std::vector<std::string>& keys) override;
  bool delete_key(const std::string& key) override;

  // The value at key, or nullopt, without waiting.
  std::optional<std::string> try_get(const std::string& key);
  // The keys of `keys` that are absent right now, in the given order.
  std::vector<std::string> missing(const std::vector<std::string>& keys);
  std::size_t num_keys();

 private:
  std::vector<std::string> missing_locked(const std::vector<std::string>& keys) const;

  std::mutex mu_;
  std::condition_variable changed_;  // notified whenever a key is created or changed
  std::unordered_map<std::string, std::string> map_;
};

}  // namespace accel
