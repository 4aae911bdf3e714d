#pragma once
// The rendezvous key-value store every communicator bootstraps through (Gloo addresses,
// the NCCL unique id, join and failure reports). Values are arbitrary bytes in a string.
// Implementations: TcpStore (tcp_store.hpp), PrefixStore and MemoryStore (in-process).

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "foundation/timeout.hpp"

namespace accel {

class Store {
 public:
  virtual ~Store() = default;

  virtual void set(const std::string& key, const std::string& value) = 0;
  // Blocks until the key exists; throws TimeoutError naming the key after `timeout`.
  virtual std::string get(const std::string& key, Milliseconds timeout) = 0;
  // Atomically adds delta to the integer stored at key (absent = 0); returns the new value.
  virtual std::int64_t add(const std::string& key, std::int64_t delta) = 0;
  // Sets key to desired if its current value equals expected (absent counts as equal to an
  // empty expected); returns the value stored afterwards (torch's TCPStore semantics).
  virtual std::string compare_set(const std::string& key, const std::string& expected,
                                  const std::string& desired) = 0;
  // Blocks until every key exists; throws TimeoutError naming the missing keys.
  virtual void wait(const std::vector<std::string>& keys, Milliseconds timeout) = 0;
  // True when every key exists, without waiting.
  virtual bool check(const std::vector<std::string>& keys) = 0;
  // Removes key; true when it existed.
  virtual bool delete_key(const std::string& key) = 0;

  std::string get(const std::string& key) { return get(key, timeout()); }
  void wait(const std::vector<std::string>& keys) { wait(keys, timeout()); }

  Milliseconds timeout() const { return timeout_; }
  void set_timeout(Milliseconds t) { timeout_ = t; }

 private:
  Milliseconds timeout_ = kDefaultCommTimeout;
};

using StorePtr = std::shared_ptr<Store>;

}  // namespace accel
