#pragma once
// A namespace inside another store: every key becomes "prefix/key". Lets independent users
// of one rendezvous store (each communicator, each restart generation) never collide.

#include <string>
#include <vector>

#include "foundation/store/store.hpp"

namespace accel {

class PrefixStore final : public Store {
 public:
  // Throws InvalidArgument when inner is null. Inherits inner's default timeout.
  PrefixStore(std::string prefix, StorePtr inner);

  using Store::get;
  using Store::wait;

  void set(const std::string& key, const std::string& value) override;
  std::string get(const std::string& key, Milliseconds timeout) override;
  std::int64_t add(const std::string& key, std::int64_t delta) override;
  std::string compare_set(const std::string& key, const std::string& expected,
                          const std::string& desired) override;
  void wait(const std::vector<std::string>& keys, Milliseconds timeout) override;
  bool check(const std::vector<std::string>& keys) override;
  bool delete_key(const std::string& key) override;

  const std::string& prefix() const { return prefix_; }
  const StorePtr& inner() const { return inner_; }

 private:
  std::string full(const std::string& key) const { return prefix_ + "/" + key; }
  std::vector<std::string> full(const std::vector<std::string>& keys) const;

  std::string prefix_;
  StorePtr inner_;
};

}  // namespace accel
