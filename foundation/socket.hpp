#pragma once
// The small amount of POSIX TCP the rendezvous store (and later the launcher's agents)
// needs: an owning fd, connecting with retry, listening on a chosen or free port, and
// sending/receiving whole buffers before a deadline. IPv4 only.
//
// Errors: transport failures throw CommError naming the address, a passed deadline throws
// TimeoutError. The store layer rewraps them as StoreError with its own wording.

#include <chrono>
#include <cstddef>
#include <string>

#include "foundation/store/store.hpp"

namespace accel {

using SteadyClock = std::chrono::steady_clock;
using Deadline = SteadyClock::time_point;

// now + timeout, saturating instead of overflowing for huge timeouts (Milliseconds::max()).
Deadline deadline_after(Milliseconds timeout);
// Milliseconds left until deadline, never negative.
Milliseconds time_left(Deadline deadline);

// "host:port", the one spelling every message uses.
std::string format_address(const std::string& host, int port);

// Owns one file descriptor; closes it on destruction. Move-only.
class Socket {
 public:
  Socket() = default;
  explicit Socket(int fd) noexcept : fd_(fd) {}
  ~Socket() { close(); }
  Socket(Socket&& other) noexcept : fd_(other.release()) {}
  Socket& operator=(Socket&& other) noexcept;
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;

  int fd() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  // Gives up ownership without closing.
  int release() noexcept;
  // Closes now (idempotent; never throws).
  void close() noexcept;

 private:
  int fd_ = -1;
};

// Small request/reply messages must not sit in Nagle's buffer waiting for an ACK.
void set_nodelay(int fd);
void set_nonblocking(int fd, bool on);

struct ConnectOptions {
  // Give up (CommError) when no attempt succeeded within this long.
  Milliseconds timeout = std::chrono::seconds(60);
  // Pause between failed attempts: starts here and doubles up to max_backoff, because the
  // listener (launcher, rank 0) usually starts a moment after its clients.
  Milliseconds initial_backoff = Milliseconds(10);
  Milliseconds max_backoff = Milliseconds(1000);
  // Who is being connected to, for the message: "could not reach the <peer_name> at ...".
  std::string peer_name = "peer";
};

// Connects to host:port (resolved with getaddrinfo each attempt, so a name that appears
// late still works), retrying refused/unreachable/unresolvable attempts with backoff until
// options.timeout. The returned socket is blocking, with TCP_NODELAY and close-on-exec.
// Throws CommError "could not reach the <peer_name> at HOST:PORT within N ms: <last error>".
Socket connect_tcp(const std::string& host, int port, const ConnectOptions& options = {});

struct ListeningSocket {
  Socket socket;
  int port = 0;  // the bound port: the requested one, or the one the kernel picked for 0
};

// Listens on host:port ("" or "0.0.0.0" = every interface; port 0 = any free port).
// The socket is non-blocking and close-on-exec. A busy port throws CommError naming
// host:port and saying it is in use.
ListeningSocket listen_tcp(const std::string& host, int port, int backlog = 512);

// Sends / receives exactly n bytes, polling so the deadline holds even on a stalled peer.
// Work on blocking and non-blocking sockets alike. A closed or failed connection throws
// CommError; a passed deadline throws TimeoutError (the stream is then mid-message and
// must not be reused).
void send_all(int fd, const void* data, std::size_t n, Deadline deadline);
void recv_all(int fd, void* data, std::size_t n, Deadline deadline);

// "a.b.c.d:port" of the socket's peer, or "unknown peer".
std::string peer_address(int fd);

}  // namespace accel
