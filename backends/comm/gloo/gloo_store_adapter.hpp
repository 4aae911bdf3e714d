#pragma once
// Lets Gloo's rendezvous (connectFullMesh) exchange addresses through our Store, so every
// communicator bootstraps through the one store the launcher hosts.

#include <gloo/rendezvous/store.h>

#include "foundation/store/store.hpp"

namespace accel {

class GlooStoreAdapter final : public gloo::rendezvous::Store {
 public:
  GlooStoreAdapter(StorePtr store, Milliseconds timeout)
      : store_(std::move(store)), timeout_(timeout) {}

  void set(const std::string& key, const std::vector<char>& data) override;
  std::vector<char> get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override;

 private:
  StorePtr store_;
  Milliseconds timeout_;
};

}  // namespace accel
