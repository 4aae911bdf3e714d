#pragma once
// The rendezvous store over TCP: one server (hosted by the launcher, or by rank 0 without
// one) holds the key map; every rank's TcpStore client talks to it with the framed protocol
// of store_protocol.hpp.
//
//   accel::TcpStoreServer server("0.0.0.0", 29500, token);        // launcher
//   accel::TcpStore store(master_addr, master_port);               // each worker
//   store.set("rank0/addr", addr);
//   auto peer = store.get("rank1/addr");                           // blocks until set

#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "foundation/socket.hpp"
#include "foundation/store/store.hpp"
#include "foundation/store/store_protocol.hpp"

namespace accel {

// What keeps one hostile or broken client from costing the store's host (the launcher)
// memory or descriptors. The defaults suit a store serving thousands of ranks' clients.
struct TcpStoreServerOptions {
  // A non-empty token is a shared secret: a connection whose HELLO carries another token is
  // refused before it can read or write any key.
  std::string token;
  // The most connections served at once; 0 = derived from the RLIMIT_NOFILE soft limit S at
  // construction: S minus a reserve of max(64, S/4) (at most S/2) descriptors kept free for
  // the host's own work (worker pipes, logs, a restart): 768 of 1024. At the limit a new
  // connection takes the place of the oldest one that has not said HELLO yet; when all have,
  // it is refused with a message naming the limit.
  std::size_t max_connections = 0;
  // From accept to an accepted HELLO: a connection that has not authenticated by then is
  // closed. Authenticated connections may stay idle for the job's life (workers do).
  Milliseconds hello_timeout = std::chrono::seconds(30);
  // From a frame's first byte to its last: a half-sent frame is not held longer.
  Milliseconds frame_timeout = std::chrono::seconds(60);
};

// The server: a single background thread polling every connection (non-blocking sockets),
// so one slow or hostile client never stalls the others. Blocking GET/WAIT requests are
// parked and answered when their keys arrive, or with a timeout reply at their deadline.
// Until its HELLO is accepted a connection may send frames of at most
// store_protocol::kMaxHelloPayload bytes. A connection sending a malformed frame, or
// breaking a limit of TcpStoreServerOptions, is closed (reason logged on stderr, prefixed
// "accel store:"); everyone else keeps being served.
class TcpStoreServer {
 public:
  // Listens on host:port ("0.0.0.0" = every interface; port 0 = a free port, see port()).
  // Throws StoreError when it cannot listen (a busy port names host:port).
  TcpStoreServer(std::string host, int port, TcpStoreServerOptions options);
  TcpStoreServer(std::string host, int port, std::string token = {});
  // Stops the thread and closes every connection; never throws.
  ~TcpStoreServer();
  TcpStoreServer(const TcpStoreServer&) = delete;
  TcpStoreServer& operator=(const TcpStoreServer&) = delete;

  int port() const;
  const std::string& host() const;
  // The connection limit in effect (options.max_connections, or the derived one).
  std::size_t max_connections() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

struct TcpStoreOptions {
  // Shared secret sent in HELLO; nullopt = the ACCEL_STORE_TOKEN environment variable
  // (empty when unset).
  std::optional<std::string> token;
  // How long to keep retrying the first connection: workers often start before the store.
  Milliseconds connect_timeout = std::chrono::seconds(60);
  // The default timeout of get()/wait() (Store::timeout()), and how long any other request
  // waits for its reply.
  Milliseconds timeout = kDefaultCommTimeout;
};

// The client. Thread-safe: one request/reply at a time under a mutex, so a blocking get()
// holds up the other threads' requests on this client until it returns (use one client per
// thread when that matters). After a lost connection or a reply that never came, the next
// request reconnects.
class TcpStore final : public Store {
 public:
  // Connects (retrying with backoff until options.connect_timeout) and says HELLO.
  // Throws StoreError: "could not reach the rendezvous store at HOST:PORT within N ms: ..."
  // or "store at HOST:PORT refused this client: wrong or missing ACCEL_STORE_TOKEN".
  TcpStore(std::string host, int port, TcpStoreOptions options = {});
  ~TcpStore() override;

  using Store::get;
  using Store::wait;

  void set(const std::string& key, const std::string& value) override;
  // Throws TimeoutError naming the key and the store's address.
  std::string get(const std::string& key, Milliseconds timeout) override;
  // A present non-integer value throws StoreError naming the key.
  std::int64_t add(const std::string& key, std::int64_t delta) override;
  std::string compare_set(const std::string& key, const std::string& expected,
                          const std::string& desired) override;
  // Throws TimeoutError naming the keys still missing and the store's address.
  void wait(const std::vector<std::string>& keys, Milliseconds timeout) override;
  bool check(const std::vector<std::string>& keys) override;
  bool delete_key(const std::string& key) override;

  const std::string& host() const { return host_; }
  int port() const { return port_; }

 private:
  // One request/reply; server_timeout is how long the server may park it (get/wait).
  store_protocol::Reply request(const store_protocol::Request& request,
                                Milliseconds server_timeout);
  void connect_locked();

  std::string host_;
  int port_ = 0;
  std::string address_;  // "host:port" for messages
  std::string token_;
  Milliseconds connect_timeout_;
  std::mutex mu_;
  Socket socket_;  // invalid after a failure; the next request reconnects
};

}  // namespace accel
