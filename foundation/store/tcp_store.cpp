#include "foundation/store/tcp_store.hpp"

#include <cstdlib>

#include "foundation/error.hpp"

namespace accel {

namespace sp = store_protocol;
namespace {

std::string quoted_list(const std::vector<std::string>& keys) {
  std::string out;
  for (const auto& k : keys) out += (out.empty() ? "'" : ", '") + k + "'";
  return out;
}

// The client waits this much longer than the server may park a request, so a server-side
// timeout arrives as a proper reply, while a dead or hung server still cannot hang us.
constexpr Milliseconds kReplyGrace = std::chrono::seconds(5);

Milliseconds plus_grace(Milliseconds t) {
  if (t < Milliseconds::zero()) t = Milliseconds::zero();
  return t >= Milliseconds::max() - kReplyGrace ? Milliseconds::max() : t + kReplyGrace;
}

std::string env_token() {
  const char* v = std::getenv("ACCEL_STORE_TOKEN");
  return v ? std::string(v) : std::string();
}

// Sends one frame and reads its reply on fd. Socket-level errors propagate as thrown by
// send_all/recv_all; a reply for another opcode is a ProtocolError.
sp::Reply exchange(int fd, const std::string& frame, sp::Op op, Deadline deadline) {
  send_all(fd, frame.data(), frame.size(), deadline);
  char header_bytes[sp::kHeaderSize];
  recv_all(fd, header_bytes, sizeof(header_bytes), deadline);
  const sp::FrameHeader header = sp::decode_header(std::string_view(header_bytes, sp::kHeaderSize));
  if (header.op != op)
    throw sp::ProtocolError("reply to " + std::string(sp::op_name(op)) + " came as " +
                            std::string(sp::op_name(header.op)));
  std::string payload(header.length, '\0');  // bounded by kMaxPayload via decode_header
  recv_all(fd, payload.data(), payload.size(), deadline);
  return sp::decode_reply(header, payload);
}

}  // namespace

TcpStore::TcpStore(std::string host, int port, TcpStoreOptions options)
    : host_(std::move(host)),
      port_(port),
      address_(format_address(host_, port)),
      token_(options.token ? *options.token : env_token()),
      connect_timeout_(options.connect_timeout) {
  set_timeout(options.timeout);
  std::lock_guard lock(mu_);
  connect_locked();
}

TcpStore::~TcpStore() = default;

void TcpStore::connect_locked() {
  Socket s;
  try {
    s = connect_tcp(host_, port_,
                    ConnectOptions{.timeout = connect_timeout_, .peer_name = "rendezvous store"});
  } catch (const CommError& e) {
    throw StoreError(e.what());
  }
  sp::Request hello;
  hello.op = sp::Op::hello;
  hello.token = token_;
  sp::Reply r;
  try {
    r = exchange(s.fd(), sp::encode_request(hello), sp::Op::hello,
                 deadline_after(connect_timeout_));
  } catch (const TimeoutError&) {
    throw StoreError("the rendezvous store at " + address_ + " did not answer HELLO within " +
                     std::to_string(connect_timeout_.count()) +
                     " ms (is something else listening on that port?)");
  } catch (const Error& e) {
    throw StoreError("handshake with the rendezvous store at " + address_ + " failed: " + e.what());
  }
  if (r.status != sp::Status::ok) {
    if (r.value.find("wrong store token") != std::string::npos)
      throw StoreError("store at " + address_ +
                       " refused this client: wrong or missing ACCEL_STORE_TOKEN");
    throw StoreError("store at " + address_ + " rejected the handshake: " + r.value);
  }
  socket_ = std::move(s);
}

sp::Reply TcpStore::request(const sp::Request& req, Milliseconds server_timeout) {
  // Encoding first: a value over the size limit is the caller's error and must not cost
  // the connection.
  const std::string frame = sp::encode_request(req);
  const std::string what =
      std::string(sp::op_name(req.op)) + (req.key.empty() ? std::string() : " '" + req.key + "'");
  std::lock_guard lock(mu_);
  if (!socket_.valid()) connect_locked();
  const Milliseconds limit = plus_grace(server_timeout);
  sp::Reply r;
  try {
    r = exchange(socket_.fd(), frame, req.op, deadline_after(limit));
  } catch (const TimeoutError&) {
    // The stream is mid-message now; start over on the next request.
    socket_.close();
    throw TimeoutError("the rendezvous store at " + address_ + " did not answer " + what +
                       " within " + std::to_string(limit.count()) +
                       " ms (server hung or unreachable)");
  } catch (const Error& e) {
    socket_.close();
    throw StoreError("lost the connection to the rendezvous store at " + address_ + " during " +
                     what + ": " + e.what());
  }
  if (r.status == sp::Status::error)
    throw StoreError("rendezvous store at " + address_ + ": " + r.value);
  return r;
}

void TcpStore::set(const std::string& key, const std::string& value) {
  sp::Request req;
  req.op = sp::Op::set;
  req.key = key;
  req.value = value;
  request(req, timeout());
}

std::string TcpStore::get(const std::string& key, Milliseconds timeout) {
  sp::Request req;
  req.op = sp::Op::get;
  req.key = key;
  req.timeout_ms = timeout.count();
  sp::Reply r = request(req, timeout);
  if (r.status == sp::Status::timeout)
    throw TimeoutError("timed out after " + std::to_string(timeout.count()) +
                       " ms waiting for key '" + key + "' in the rendezvous store at " + address_);
  return std::move(r.value);
}

std::int64_t TcpStore::add(const std::string& key, std::int64_t delta) {
  sp::Request req;
  req.op = sp::Op::add;
  req.key = key;
  req.delta = delta;
  return request(req, timeout()).number;
}

std::string TcpStore::compare_set(const std::string& key, const std::string& expected,
                                  const std::string& desired) {
  sp::Request req;
  req.op = sp::Op::compare_set;
  req.key = key;
  req.expected = expected;
  req.value = desired;
  return std::move(request(req, timeout()).value);
}

void TcpStore::wait(const std::vector<std::string>& keys, Milliseconds timeout) {
  sp::Request req;
  req.op = sp::Op::wait;
  req.keys = keys;
  req.timeout_ms = timeout.count();
  sp::Reply r = request(req, timeout);
  if (r.status == sp::Status::timeout)
    throw TimeoutError("timed out after " + std::to_string(timeout.count()) +
                       " ms waiting for keys in the rendezvous store at " + address_ +
                       "; missing: " + quoted_list(r.keys.empty() ? keys : r.keys));
}

bool TcpStore::check(const std::vector<std::string>& keys) {
  sp::Request req;
  req.op = sp::Op::check;
  req.keys = keys;
  return request(req, timeout()).flag;
}

bool TcpStore::delete_key(const std::string& key) {
  sp::Request req;
  req.op = sp::Op::delete_key;
  req.key = key;
  return request(req, timeout()).flag;
}

}  // namespace accel
