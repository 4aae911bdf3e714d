#include "foundation/socket.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <memory>
#include <optional>
#include <thread>

#include "foundation/error.hpp"

namespace accel {

Deadline deadline_after(Milliseconds timeout) {
  const auto now = SteadyClock::now();
  if (timeout <= Milliseconds::zero()) return now;
  // Compare in milliseconds so a huge timeout cannot overflow the clock's representation.
  const auto room =
      std::chrono::duration_cast<Milliseconds>(Deadline::max() - now) - Milliseconds(1);
  if (timeout >= room) return Deadline::max();
  return now + timeout;
}

Milliseconds time_left(Deadline deadline) {
  const auto now = SteadyClock::now();
  if (deadline <= now) return Milliseconds::zero();
  // Round up so a caller polling for "time_left" never busy-loops on a sub-ms remainder.
  return std::chrono::ceil<Milliseconds>(deadline - now);
}

std::string format_address(const std::string& host, int port) {
  return (host.empty() ? std::string("0.0.0.0") : host) + ":" + std::to_string(port);
}

Socket& Socket::operator=(Socket&& other) noexcept {
  if (this != &other) {
    close();
    fd_ = other.release();
  }
  return *this;
}

int Socket::release() noexcept {
  const int fd = fd_;
  fd_ = -1;
  return fd;
}

void Socket::close() noexcept {
  if (fd_ >= 0) {
    // close() may report EINTR, but on Linux the fd is released regardless; retrying
    // could close an fd another thread just received.
    ::close(fd_);
    fd_ = -1;
  }
}

void set_nodelay(int fd) {
  int one = 1;
  if (::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)) != 0)
    throw CommError("setsockopt(TCP_NODELAY) failed: " + errno_text(errno));
}

void set_nonblocking(int fd, bool on) {
  const int flags = ::fcntl(fd, F_GETFL, 0);
  if (flags < 0) throw CommError("fcntl(F_GETFL) failed: " + errno_text(errno));
  const int wanted = on ? (flags | O_NONBLOCK) : (flags & ~O_NONBLOCK);
  if (wanted != flags && ::fcntl(fd, F_SETFL, wanted) != 0)
    throw CommError("fcntl(F_SETFL) failed: " + errno_text(errno));
}

namespace {

int poll_timeout_ms(Deadline deadline) {
  if (deadline == Deadline::max()) return -1;
  return int(std::min<Milliseconds::rep>(time_left(deadline).count(), INT_MAX));
}

// Waits until fd reports one of `events` (or an error/hang-up, which the caller's next
// call then reports). False when the deadline passed first.
bool poll_until(int fd, short events, Deadline deadline) {
  for (;;) {
    pollfd p{fd, events, 0};
    const int rc = ::poll(&p, 1, poll_timeout_ms(deadline));
    if (rc > 0) return true;
    if (rc == 0) {
      if (SteadyClock::now() >= deadline) return false;
      continue;  // poll rounds down; wait out the remainder
    }
    if (errno != EINTR) throw CommError("poll failed: " + errno_text(errno));
  }
}

struct AddrInfoDeleter {
  void operator()(addrinfo* a) const { ::freeaddrinfo(a); }
};
using AddrInfoPtr = std::unique_ptr<addrinfo, AddrInfoDeleter>;

// getaddrinfo for IPv4 TCP; on failure returns null and the reason in *error.
AddrInfoPtr resolve(const std::string& host, int port, bool passive, std::string* error) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = passive ? AI_PASSIVE : 0;
  addrinfo* result = nullptr;
  const std::string service = std::to_string(port);
  const char* node = (passive && host.empty()) ? nullptr : host.c_str();
  const int rc = ::getaddrinfo(node, service.c_str(), &hints, &result);
  if (rc != 0) {
    *error = "cannot resolve '" + host +
             "': " + (rc == EAI_SYSTEM ? errno_text(errno) : std::string(::gai_strerror(rc)));
    return nullptr;
  }
  return AddrInfoPtr(result);
}

// Linux can "connect" a socket to itself when the target port is free and happens to be
// the ephemeral port chosen for the attempt (TCP simultaneous open); that is not a peer.
bool connected_to_self(int fd) {
  sockaddr_in local{}, remote{};
  socklen_t ll = sizeof(local), rl = sizeof(remote);
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &ll) != 0) return false;
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&remote), &rl) != 0) return false;
  return local.sin_port == remote.sin_port && local.sin_addr.s_addr == remote.sin_addr.s_addr;
}

// One attempt over every resolved address; the connected socket, or nullopt with the
// reason of the last failure in *error.
std::optional<Socket> try_connect(const std::string& host, int port, Deadline deadline,
                                  std::string* error) {
  AddrInfoPtr addrs = resolve(host, port, false, error);
  if (!addrs) return std::nullopt;
  for (addrinfo* a = addrs.get(); a != nullptr; a = a->ai_next) {
    Socket s(::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol));
    if (!s.valid()) {
      *error = "socket() failed: " + errno_text(errno);
      continue;
    }
    // Non-blocking connect so an unresponsive address cannot outlast the deadline.
    if (::connect(s.fd(), a->ai_addr, a->ai_addrlen) != 0) {
      if (errno != EINPROGRESS) {
        *error = errno_text(errno);
        continue;
      }
      if (!poll_until(s.fd(), POLLOUT, deadline)) {
        *error = "connection attempt timed out";
        continue;
      }
      int err = 0;
      socklen_t len = sizeof(err);
      if (::getsockopt(s.fd(), SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
      if (err != 0) {
        *error = errno_text(err);
        continue;
      }
    }
    if (connected_to_self(s.fd())) {
      *error = errno_text(ECONNREFUSED);
      continue;
    }
    set_nonblocking(s.fd(), false);
    set_nodelay(s.fd());
    return s;
  }
  return std::nullopt;
}

}  // namespace

Socket connect_tcp(const std::string& host, int port, const ConnectOptions& options) {
  const Deadline deadline = deadline_after(options.timeout);
  Milliseconds backoff = std::max(options.initial_backoff, Milliseconds(1));
  std::string last_error = "no attempt made";
  for (;;) {
    if (auto s = try_connect(host, port, deadline, &last_error)) return std::move(*s);
    const Milliseconds left = time_left(deadline);
    if (left <= Milliseconds::zero()) {
      throw CommError("could not reach the " + options.peer_name + " at " +
                      format_address(host, port) + " within " +
                      std::to_string(options.timeout.count()) + " ms: " + last_error);
    }
    std::this_thread::sleep_for(std::min(backoff, left));
    backoff = std::min(backoff * 2, std::max(options.max_backoff, options.initial_backoff));
  }
}

ListeningSocket listen_tcp(const std::string& host, int port, int backlog) {
  const std::string where = format_address(host, port);
  if (port < 0 || port > 65535)
    throw CommError("cannot listen on " + where + ": port must be in 0..65535");
  std::string error;
  AddrInfoPtr addrs = resolve(host, port, true, &error);
  if (!addrs) throw CommError("cannot listen on " + where + ": " + error);
  const addrinfo* a = addrs.get();
  Socket s(::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol));
  if (!s.valid())
    throw CommError("cannot listen on " + where + ": socket() failed: " + errno_text(errno));
  // Lets a restarted launcher rebind a port whose previous connections sit in TIME_WAIT;
  // on Linux it still refuses a port someone is actively listening on.
  int one = 1;
  ::setsockopt(s.fd(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (::bind(s.fd(), a->ai_addr, a->ai_addrlen) != 0) {
    const int err = errno;
    if (err == EADDRINUSE)
      throw CommError("cannot listen on " + where +
                      ": the port is already in use (by another process or an earlier run); "
                      "choose another port, or 0 for a free one");
    if (err == EADDRNOTAVAIL)
      throw CommError("cannot listen on " + where + ": no local interface has that address");
    throw CommError("cannot listen on " + where + ": bind failed: " + errno_text(err));
  }
  if (::listen(s.fd(), backlog) != 0)
    throw CommError("cannot listen on " + where + ": listen failed: " + errno_text(errno));
  sockaddr_in bound{};
  socklen_t len = sizeof(bound);
  if (::getsockname(s.fd(), reinterpret_cast<sockaddr*>(&bound), &len) != 0)
    throw CommError("cannot listen on " + where + ": getsockname failed: " + errno_text(errno));
  return ListeningSocket{std::move(s), int(ntohs(bound.sin_port))};
}

void send_all(int fd, const void* data, std::size_t n, Deadline deadline) {
  const char* p = static_cast<const char*>(data);
  std::size_t done = 0;
  while (done < n) {
    // MSG_NOSIGNAL: a vanished peer is an error here, not a SIGPIPE killing the process.
    const ssize_t rc = ::send(fd, p + done, n - done, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (rc > 0) {
      done += std::size_t(rc);
      continue;
    }
    if (rc < 0 && errno == EINTR) continue;
    if (rc < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (!poll_until(fd, POLLOUT, deadline))
        throw TimeoutError("deadline passed sending to " + peer_address(fd) + " (" +
                           std::to_string(done) + " of " + std::to_string(n) + " bytes sent)");
      continue;
    }
    throw CommError("sending to " + peer_address(fd) + " failed: " + errno_text(errno));
  }
}

void recv_all(int fd, void* data, std::size_t n, Deadline deadline) {
  char* p = static_cast<char*>(data);
  std::size_t done = 0;
  while (done < n) {
    const ssize_t rc = ::recv(fd, p + done, n - done, MSG_DONTWAIT);
    if (rc > 0) {
      done += std::size_t(rc);
      continue;
    }
    if (rc == 0)
      throw CommError("connection closed by " + peer_address(fd) + " (" + std::to_string(done) +
                      " of " + std::to_string(n) + " bytes received)");
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      if (!poll_until(fd, POLLIN, deadline))
        throw TimeoutError("deadline passed receiving from " + peer_address(fd) + " (" +
                           std::to_string(done) + " of " + std::to_string(n) + " bytes received)");
      continue;
    }
    throw CommError("receiving from " + peer_address(fd) + " failed: " + errno_text(errno));
  }
}

std::string peer_address(int fd) {
  sockaddr_in addr{};
  socklen_t len = sizeof(addr);
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0 ||
      addr.sin_family != AF_INET)
    return "unknown peer";
  char text[INET_ADDRSTRLEN] = {};
  ::inet_ntop(AF_INET, &addr.sin_addr, text, sizeof(text));
  return std::string(text) + ":" + std::to_string(ntohs(addr.sin_port));
}

}  // namespace accel
