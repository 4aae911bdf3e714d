#include "foundation/store/tcp_store.hpp"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <map>
#include <thread>
#include <unordered_map>

#include "foundation/error.hpp"
#include "foundation/store/memory_store.hpp"

namespace accel {

namespace sp = store_protocol;

namespace {

constexpr const char* kRefusedToken = "refused: wrong store token";

// One line on stderr in a single write(), so lines from several threads never interleave.
void log_line(const std::string& message) noexcept {
  try {
    const std::string line = "accel store: " + message + "\n";
    [[maybe_unused]] auto rc = ::write(STDERR_FILENO, line.data(), line.size());
  } catch (...) {
  }
}

// Compares without an early exit, so response timing does not reveal how much of a guessed
// token was right.
bool same_token(const std::string& a, const std::string& b) {
  unsigned diff = a.size() != b.size() ? 1u : 0u;
  const std::size_t n = std::max(a.size(), b.size());
  for (std::size_t i = 0; i < n; ++i) {
    const unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    const unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
    diff |= unsigned(x ^ y);
  }
  return diff == 0;
}

}  // namespace

namespace {

// A connection's replies may pile up only this far before the server stops reading its
// requests, so a client that never reads cannot grow the server's memory.
constexpr std::size_t kMaxPendingOutput = sp::kHeaderSize + sp::kMaxPayload;
constexpr std::size_t kReadChunk = 64 * 1024;
// Connections closed unauthenticated or refused at the connection limit are reported in one
// line at most this often, so a flood of connections cannot flood the launcher's stderr too.
constexpr Milliseconds kClosureReportInterval = std::chrono::seconds(10);

std::string ms_text(Milliseconds t) { return std::to_string(t.count()) + " ms"; }

struct ConnectionLimit {
  std::size_t max = 0;
  std::string origin;  // how it was chosen, for the messages
};

// The limit the options ask for, or the one derived from RLIMIT_NOFILE: the soft limit less
// a reserve for the host's own descriptors. The launcher needs a few per local worker (two
// pipes, a log file, two more pipe ends while it forks) plus its own handful, at every
// restart; a quarter of the limit, at least 64, covers dozens of workers on the common 1024.
ConnectionLimit connection_limit(std::size_t requested) {
  if (requested > 0) return {requested, "TcpStoreServerOptions::max_connections"};
  rlimit rl{};
  std::size_t soft = 1024;
  if (::getrlimit(RLIMIT_NOFILE, &rl) == 0)
    soft = rl.rlim_cur == RLIM_INFINITY ? std::size_t(1) << 20  // the kernel's default nr_open
                                        : std::size_t(rl.rlim_cur);
  const std::size_t reserve = std::min(soft / 2, std::max<std::size_t>(64, soft / 4));
  return {std::max<std::size_t>(1, soft - reserve),
          "the RLIMIT_NOFILE soft limit of " + std::to_string(soft) + " less " +
              std::to_string(reserve) + " descriptors kept free for this process; raise it " +
              "with `ulimit -n`"};
}

struct Connection {
  std::uint64_t id = 0;
  Socket socket;
  std::string peer;
  // Small frames only until HELLO is accepted: an unauthenticated peer cannot make the
  // server buffer a 16 MiB frame.
  sp::FrameReader in{sp::kMaxHelloPayload};
  std::string out;
  std::size_t out_sent = 0;
  bool greeted = false;
  bool closing = false;  // close once `out` is flushed (after a refusal or protocol error)
  bool dead = false;
  // A GET or WAIT waiting for keys.
  bool parked = false;
  sp::Op parked_op = sp::Op::get;
  std::vector<std::string> parked_keys;
  Deadline parked_deadline{};
  Deadline hello_deadline{};               // closed when not greeted by then
  std::optional<Deadline> frame_deadline;  // while a frame is partly buffered

  std::size_t pending_output() const { return out.size() - out_sent; }
};

}  // namespace

struct TcpStoreServer::Impl {
  std::string host;
  int port = 0;
  TcpStoreServerOptions options;  // the token and the limits
  ConnectionLimit limit;
  std::size_t live = 0;  // connections not yet dropped
  // Connections evicted or refused at the limit, or closed for want of HELLO, since the last
  // report; and when the next report may be written.
  std::size_t evicted_at_limit = 0;
  std::size_t refused_at_limit = 0;
  std::size_t silent_expired = 0;
  std::string first_silent_peer;
  Deadline next_closure_report{};
  Socket listener;
  Socket wake;  // eventfd: the destructor writes it to interrupt poll()
  std::atomic<bool> stopping{false};
  MemoryStore map;  // the key map; only the server thread touches it
  std::map<std::uint64_t, std::unique_ptr<Connection>> conns;
  // key -> parked connections whose request names that key.
  std::unordered_map<std::string, std::vector<std::uint64_t>> waiters;
  std::vector<std::uint64_t> runnable;  // unparked connections with frames left to handle
  std::uint64_t next_id = 1;
  Deadline accept_paused_until{};
  std::string scratch = std::string(kReadChunk, '\0');
  std::thread thread;

  void run() noexcept;
  void loop_once();
  void accept_all();
  bool evict_oldest_unauthenticated();
  void refuse_over_limit(Socket s);
  void report_closures(bool final_report = false);
  void expire_connections();
  void read_from(Connection& c);
  void flush(Connection& c);
  void process(Connection& c);
  void process_frames(Connection& c);
  void handle(Connection& c, const sp::Frame& frame);
  void reply(Connection& c, const sp::Reply& r);
  void refuse(Connection& c, const std::string& message, const std::string& log_reason);
  void drop(Connection& c, const std::string& log_reason);
  void park(Connection& c, sp::Op op, std::vector<std::string> keys, std::int64_t timeout_ms);
  void unpark(Connection& c);
  bool try_answer_parked(Connection& c);
  void key_changed(const std::string& key);
  void expire_parked();
  Connection* find(std::uint64_t id) {
    auto it = conns.find(id);
    return it == conns.end() ? nullptr : it->second.get();
  }
};

TcpStoreServer::TcpStoreServer(std::string host, int port, std::string token)
    : TcpStoreServer(std::move(host), port, TcpStoreServerOptions{.token = std::move(token)}) {}

TcpStoreServer::TcpStoreServer(std::string host, int port, TcpStoreServerOptions options)
    : impl_(std::make_unique<Impl>()) {
  impl_->host = std::move(host);
  impl_->limit = connection_limit(options.max_connections);
  impl_->options = std::move(options);
  try {
    ListeningSocket l = listen_tcp(impl_->host, port);
    impl_->listener = std::move(l.socket);
    impl_->port = l.port;
  } catch (const CommError& e) {
    throw StoreError(std::string("rendezvous store: ") + e.what());
  }
  impl_->wake = Socket(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  if (!impl_->wake.valid())
    throw StoreError("rendezvous store: eventfd failed: " + errno_text(errno));
  impl_->thread = std::thread([impl = impl_.get()] { impl->run(); });
}

TcpStoreServer::~TcpStoreServer() {
  impl_->stopping.store(true);
  const std::uint64_t one = 1;
  [[maybe_unused]] auto rc = ::write(impl_->wake.fd(), &one, sizeof(one));
  if (impl_->thread.joinable()) impl_->thread.join();
}

int TcpStoreServer::port() const { return impl_->port; }
const std::string& TcpStoreServer::host() const { return impl_->host; }
std::size_t TcpStoreServer::max_connections() const { return impl_->limit.max; }

void TcpStoreServer::Impl::run() noexcept {
  while (!stopping.load()) {
    try {
      loop_once();
    } catch (const std::exception& e) {
      // Something unexpected (out of memory, a failing poll): report it and keep serving,
      // since every rank depends on this thread; pause so a persistent fault cannot spin.
      log_line(std::string("server loop error: ") + e.what());
      std::this_thread::sleep_for(Milliseconds(10));
    }
  }
  try {
    report_closures(true);  // the server is going away: the last counts now
  } catch (...) {
  }
}

void TcpStoreServer::Impl::loop_once() {
  const auto now = SteadyClock::now();
  std::vector<pollfd> fds;
  std::vector<Connection*> polled;
  fds.reserve(conns.size() + 2);
  fds.push_back(pollfd{wake.fd(), POLLIN, 0});
  const bool accepting = now >= accept_paused_until;
  fds.push_back(pollfd{accepting ? listener.fd() : -1, POLLIN, 0});
  Deadline next_deadline = Deadline::max();
  for (auto& [id, c] : conns) {
    short events = POLLRDHUP;
    if (!c->closing && c->in.capacity_left() > 0) events |= POLLIN;
    if (c->pending_output() > 0) events |= POLLOUT;
    fds.push_back(pollfd{c->socket.fd(), events, 0});
    polled.push_back(c.get());
    if (c->parked) next_deadline = std::min(next_deadline, c->parked_deadline);
    if (!c->greeted) next_deadline = std::min(next_deadline, c->hello_deadline);
    if (c->frame_deadline) next_deadline = std::min(next_deadline, *c->frame_deadline);
  }
  if (!accepting) next_deadline = std::min(next_deadline, accept_paused_until);
  if (evicted_at_limit + refused_at_limit + silent_expired > 0)
    next_deadline = std::min(next_deadline, next_closure_report);

  int timeout_ms = -1;
  if (next_deadline != Deadline::max())
    timeout_ms = int(std::min<Milliseconds::rep>(time_left(next_deadline).count(), INT_MAX));
  const int rc = ::poll(fds.data(), fds.size(), timeout_ms);
  if (rc < 0) {
    if (errno == EINTR) return;
    throw StoreError("poll failed: " + errno_text(errno));
  }
  if (fds[0].revents != 0) {
    std::uint64_t drained;
    [[maybe_unused]] auto r = ::read(wake.fd(), &drained, sizeof(drained));
    if (stopping.load()) return;
  }
  if (fds[1].revents != 0) accept_all();

  for (std::size_t i = 0; i < polled.size(); ++i) {
    Connection& c = *polled[i];
    const short re = fds[i + 2].revents;
    if (re == 0 || c.dead) continue;
    if (re & POLLNVAL) {
      drop(c, "");
      continue;
    }
    if (fds[i + 2].events & POLLIN) {
      // recv reports a hang-up or error itself (0 bytes, or -1 with the error).
      if (re & (POLLIN | POLLERR | POLLHUP)) read_from(c);
    } else if (re & (POLLERR | POLLHUP | POLLRDHUP)) {
      // Not reading (buffer full or closing) and the peer hung up or failed: nothing more
      // can be exchanged, and poll would keep reporting it.
      drop(c, "");
      continue;
    }
    if (!c.dead && (re & POLLOUT)) flush(c);
    if (!c.dead) process(c);
  }
  expire_parked();
  expire_connections();
  report_closures();
  while (!runnable.empty()) {
    const std::uint64_t id = runnable.back();
    runnable.pop_back();
    if (Connection* c = find(id)) process(*c);
  }
  for (auto it = conns.begin(); it != conns.end();) {
    if (it->second->dead) {
      unpark(*it->second);
      it = conns.erase(it);
    } else {
      ++it;
    }
  }
}

void TcpStoreServer::Impl::accept_all() {
  for (;;) {
    Socket s(::accept4(listener.fd(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC));
    if (!s.valid()) {
      const int err = errno;
      if (err == EAGAIN || err == EWOULDBLOCK) return;
      if (err == EINTR || err == ECONNABORTED) continue;
      // Out of descriptors or memory: the pending connection stays queued, so stop polling
      // the listener for a moment instead of spinning on it.
      log_line("accept failed: " + errno_text(err) + "; pausing accepts for 100 ms");
      accept_paused_until = SteadyClock::now() + Milliseconds(100);
      return;
    }
    if (live >= limit.max && !evict_oldest_unauthenticated()) {
      refuse_over_limit(std::move(s));
      continue;
    }
    try {
      set_nodelay(s.fd());
    } catch (const CommError&) {
      // Latency only; the connection still works.
    }
    auto c = std::make_unique<Connection>();
    c->id = next_id++;
    c->peer = peer_address(s.fd());
    c->socket = std::move(s);
    c->hello_deadline = deadline_after(options.hello_timeout);
    ++live;
    conns.emplace(c->id, std::move(c));
  }
}

// At the limit, a connection that has not authenticated yet gives way to a new one: a
// client says HELLO as soon as it connects, so a flood of silent connections cannot keep
// the ranks out. Ids grow with accept order, so the first found is the oldest.
bool TcpStoreServer::Impl::evict_oldest_unauthenticated() {
  for (auto& [id, c] : conns) {
    if (c->dead || c->greeted) continue;
    drop(*c, "");
    ++evicted_at_limit;
    return true;
  }
  return false;
}

// Every connection has authenticated: the new one is told why and closed at once, without
// ever holding more than this moment's descriptor.
void TcpStoreServer::Impl::refuse_over_limit(Socket s) {
  const std::string frame = sp::encode_reply(
      sp::Reply::error(sp::Op::hello, "the store is at its limit of " + std::to_string(limit.max) +
                                          " connections (" + limit.origin + ")"));
  [[maybe_unused]] auto sent =
      ::send(s.fd(), frame.data(), frame.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
  // Read what the client already sent (its HELLO): closing with unread input would reset
  // the connection and could discard the reply before the client reads it.
  char sink[4096];
  for (int i = 0; i < 4 && ::recv(s.fd(), sink, sizeof(sink), MSG_DONTWAIT) > 0; ++i) {
  }
  ::shutdown(s.fd(), SHUT_WR);
  ++refused_at_limit;
}

// One line for the connections closed unauthenticated or refused since the last: the first
// at once, then at most one per interval (loop_once calls this every round, so a flood's
// tail is reported too).
void TcpStoreServer::Impl::report_closures(bool final_report) {
  if (evicted_at_limit + refused_at_limit + silent_expired == 0) return;
  const auto now = SteadyClock::now();
  if (now < next_closure_report && !final_report) return;
  const std::string at_limit =
      " at the limit of " + std::to_string(limit.max) + " connections (" + limit.origin + ")";
  std::string line;
  auto part = [&](std::size_t n, const std::string& what) {
    if (n > 0) line += (line.empty() ? "" : "; ") + std::to_string(n) + what;
  };
  part(silent_expired, " closed that did not complete HELLO within " +
                           ms_text(options.hello_timeout) + " (the first from " +
                           first_silent_peer + ")");
  part(evicted_at_limit, " that had not said HELLO closed to make room" + at_limit);
  part(refused_at_limit, " refused" + at_limit + ", every one authenticated");
  log_line("connections: " + line + " (since the last such line; at most one every " +
           ms_text(kClosureReportInterval) + ")");
  evicted_at_limit = refused_at_limit = silent_expired = 0;
  next_closure_report = now + kClosureReportInterval;
}

// Unauthenticated connections past hello_timeout and half-sent frames past frame_timeout.
// The silent ones are counted for report_closures, since a flood of them is the usual cause.
void TcpStoreServer::Impl::expire_connections() {
  const auto now = SteadyClock::now();
  for (auto& [id, c] : conns) {
    if (c->dead) continue;
    if (!c->greeted && c->hello_deadline <= now) {
      if (silent_expired++ == 0) first_silent_peer = c->peer;
      drop(*c, "");
    } else if (c->frame_deadline && *c->frame_deadline <= now) {
      drop(*c, "closing connection from " + c->peer + ": a frame was not completed within " +
                   ms_text(options.frame_timeout) + " (" + std::to_string(c->in.buffered()) +
                   " bytes of it arrived)");
    }
  }
}

void TcpStoreServer::Impl::read_from(Connection& c) {
  const std::size_t want = std::min(scratch.size(), c.in.capacity_left());
  if (want == 0) return;
  const ssize_t n = ::recv(c.socket.fd(), scratch.data(), want, MSG_DONTWAIT);
  if (n > 0) {
    c.in.append(std::string_view(scratch.data(), std::size_t(n)));
    return;
  }
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
  if (n == 0 && c.in.buffered() > 0 && !c.closing)
    drop(c, "connection from " + c.peer + " closed in the middle of a frame (" +
                std::to_string(c.in.buffered()) + " bytes buffered)");
  else
    drop(c, "");  // an ordinary disconnect, or a reset: nothing worth logging
}

void TcpStoreServer::Impl::flush(Connection& c) {
  while (c.pending_output() > 0) {
    const ssize_t n = ::send(c.socket.fd(), c.out.data() + c.out_sent, c.pending_output(),
                             MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      c.out_sent += std::size_t(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;  // poll for POLLOUT
    drop(c, "");
    return;
  }
  c.out.clear();
  c.out_sent = 0;
  if (c.closing) drop(c, "");
}

void TcpStoreServer::Impl::reply(Connection& c, const sp::Reply& r) {
  if (c.dead) return;
  std::string frame;
  try {
    frame = sp::encode_reply(r);
  } catch (const InvalidArgument& e) {
    frame = sp::encode_reply(sp::Reply::error(r.op, e.what()));
  }
  c.out += frame;
  flush(c);  // answer now rather than after another poll round trip
}

void TcpStoreServer::Impl::refuse(Connection& c, const std::string& message,
                                  const std::string& log_reason) {
  log_line(log_reason);
  c.closing = true;
  reply(c, sp::Reply::error(sp::Op::hello, message));
}

void TcpStoreServer::Impl::drop(Connection& c, const std::string& log_reason) {
  if (c.dead) return;
  if (!log_reason.empty()) log_line(log_reason);
  c.dead = true;
  --live;
  unpark(c);
  c.socket.close();
}

// Handles the frames buffered, then starts or stops the clock of a partly buffered one.
void TcpStoreServer::Impl::process(Connection& c) {
  process_frames(c);
  if (c.dead) return;
  if (!c.in.holds_partial_frame())
    c.frame_deadline.reset();
  else if (!c.frame_deadline)
    c.frame_deadline = deadline_after(options.frame_timeout);
}

void TcpStoreServer::Impl::process_frames(Connection& c) {
  while (!c.dead && !c.closing && !c.parked && c.pending_output() < kMaxPendingOutput) {
    std::optional<sp::Frame> frame;
    try {
      frame = c.in.next();
      if (!frame) return;
      c.frame_deadline.reset();  // the next frame's clock starts when its bytes are seen
      handle(c, *frame);
    } catch (const sp::ProtocolError& e) {
      // Tell the client why (best effort), then close only this connection.
      const std::string why = e.what();
      c.closing = true;
      const sp::Op op = frame ? frame->header.op : sp::Op::hello;
      reply(c, sp::Reply::error(op, "protocol error: " + why));
      log_line("closing connection from " + c.peer + ": " + why);
      drop(c, "");
      return;
    }
  }
}

void TcpStoreServer::Impl::handle(Connection& c, const sp::Frame& frame) {
  const sp::Op op = frame.header.op;
  if (!c.greeted) {
    if (op != sp::Op::hello) {
      // With a token, anything but a matching HELLO is refused before it touches a key;
      // without one, HELLO still has to come first so the versions were checked.
      if (!options.token.empty())
        refuse(c, kRefusedToken,
               "refused connection from " + c.peer + ": first frame was " +
                   std::string(sp::op_name(op)) + ", not HELLO with the store token");
      else
        refuse(c, "protocol error: the first frame must be HELLO",
               "closing connection from " + c.peer + ": first frame was " +
                   std::string(sp::op_name(op)) + ", not HELLO");
      return;
    }
    const sp::Request hello = sp::decode_request(frame.header, frame.payload);
    if (!options.token.empty() && !same_token(hello.token, options.token)) {
      refuse(c, kRefusedToken, "refused connection from " + c.peer + ": wrong store token");
      return;
    }
    c.greeted = true;
    c.in.raise_max_payload(sp::kMaxPayload);
    reply(c, sp::Reply::ok(sp::Op::hello));
    return;
  }

  sp::Request req = sp::decode_request(frame.header, frame.payload);
  sp::Reply r = sp::Reply::ok(op);
  switch (op) {
    case sp::Op::hello:
      break;  // a repeated HELLO is harmless
    case sp::Op::set:
      map.set(req.key, req.value);
      reply(c, r);
      key_changed(req.key);
      return;
    case sp::Op::get:
      park(c, op, {req.key}, req.timeout_ms);
      return;
    case sp::Op::add:
      try {
        r.number = map.add(req.key, req.delta);
      } catch (const StoreError& e) {
        reply(c, sp::Reply::error(op, e.what()));
        return;
      }
      reply(c, r);
      key_changed(req.key);
      return;
    case sp::Op::compare_set:
      r.value = map.compare_set(req.key, req.expected, req.value);
      reply(c, r);
      key_changed(req.key);
      return;
    case sp::Op::wait:
      park(c, op, std::move(req.keys), req.timeout_ms);
      return;
    case sp::Op::check:
      r.flag = map.check(req.keys);
      break;
    case sp::Op::delete_key:
      r.flag = map.delete_key(req.key);
      break;
  }
  reply(c, r);
}

// Answers a GET/WAIT now if its keys are there, else parks it until they arrive or the
// deadline passes. A timeout of 0 or less means "only if present now".
void TcpStoreServer::Impl::park(Connection& c, sp::Op op, std::vector<std::string> keys,
                                std::int64_t timeout_ms) {
  c.parked = true;
  c.parked_op = op;
  c.parked_keys = std::move(keys);
  c.parked_deadline = deadline_after(Milliseconds(std::max<std::int64_t>(timeout_ms, 0)));
  if (try_answer_parked(c)) return;
  if (timeout_ms <= 0) {
    const sp::Reply r = sp::Reply::timeout(op, map.missing(c.parked_keys));
    c.parked = false;
    c.parked_keys.clear();
    reply(c, r);
    return;
  }
  for (const auto& k : c.parked_keys) {
    auto& list = waiters[k];
    if (std::find(list.begin(), list.end(), c.id) == list.end()) list.push_back(c.id);
  }
}

void TcpStoreServer::Impl::unpark(Connection& c) {
  if (!c.parked) return;
  for (const auto& k : c.parked_keys) {
    auto it = waiters.find(k);
    if (it == waiters.end()) continue;
    auto& list = it->second;
    list.erase(std::remove(list.begin(), list.end(), c.id), list.end());
    if (list.empty()) waiters.erase(it);
  }
  c.parked = false;
  c.parked_keys.clear();
}

// Replies and unparks when every key of the parked request is present.
bool TcpStoreServer::Impl::try_answer_parked(Connection& c) {
  sp::Reply r = sp::Reply::ok(c.parked_op);
  if (c.parked_op == sp::Op::get) {
    auto value = map.try_get(c.parked_keys.front());
    if (!value) return false;
    r.value = std::move(*value);
  } else if (!map.check(c.parked_keys)) {
    return false;
  }
  unpark(c);
  reply(c, r);
  runnable.push_back(c.id);  // it may have further requests buffered
  return true;
}

void TcpStoreServer::Impl::key_changed(const std::string& key) {
  auto it = waiters.find(key);
  if (it == waiters.end()) return;
  // Copy: answering unparks, which edits this list.
  const std::vector<std::uint64_t> ids = it->second;
  for (std::uint64_t id : ids) {
    Connection* w = find(id);
    if (w && w->parked && !w->dead) try_answer_parked(*w);
  }
}

void TcpStoreServer::Impl::expire_parked() {
  const auto now = SteadyClock::now();
  for (auto& [id, c] : conns) {
    if (!c->parked || c->dead || c->parked_deadline > now) continue;
    const sp::Reply r = sp::Reply::timeout(c->parked_op, map.missing(c->parked_keys));
    unpark(*c);
    reply(*c, r);
    runnable.push_back(c->id);
  }
}

}  // namespace accel
