#include "foundation/store/store_protocol.hpp"

#include <algorithm>
#include <cstdio>

namespace accel::store_protocol {

std::string_view op_name(Op op) {
  switch (op) {
    case Op::hello:
      return "HELLO";
    case Op::set:
      return "SET";
    case Op::get:
      return "GET";
    case Op::add:
      return "ADD";
    case Op::compare_set:
      return "COMPARE_SET";
    case Op::wait:
      return "WAIT";
    case Op::check:
      return "CHECK";
    case Op::delete_key:
      return "DELETE";
  }
  return "?";
}

namespace {

bool known_op(std::uint8_t v) {
  return v >= std::uint8_t(Op::hello) && v <= std::uint8_t(Op::delete_key);
}

bool known_status(std::uint8_t v) { return v <= std::uint8_t(Status::error); }

std::string hex32(std::uint32_t v) {
  char text[16];
  std::snprintf(text, sizeof(text), "0x%08x", v);
  return text;
}

void put_u32(std::string& out, std::uint32_t v) {
  out.push_back(char(v >> 24));
  out.push_back(char(v >> 16));
  out.push_back(char(v >> 8));
  out.push_back(char(v));
}

std::uint32_t get_u32(const char* p) {
  return std::uint32_t(std::uint8_t(p[0])) << 24 | std::uint32_t(std::uint8_t(p[1])) << 16 |
         std::uint32_t(std::uint8_t(p[2])) << 8 | std::uint32_t(std::uint8_t(p[3]));
}

// Appends payload fields.
class Writer {
 public:
  void str(std::string_view s) {
    put_u32(out_, std::uint32_t(s.size()));
    out_.append(s);
  }
  void i64(std::int64_t v) {
    const auto u = std::uint64_t(v);
    put_u32(out_, std::uint32_t(u >> 32));
    put_u32(out_, std::uint32_t(u));
  }
  void boolean(bool b) { out_.push_back(b ? 1 : 0); }
  void list(const std::vector<std::string>& items) {
    put_u32(out_, std::uint32_t(items.size()));
    for (const auto& s : items) str(s);
  }
  // Header + payload; the payload must fit `limit`.
  std::string frame(Op op, Status status, const std::string& what,
                    std::uint32_t limit = kMaxPayload) {
    if (out_.size() > limit)
      throw InvalidArgument(what + " is " + std::to_string(out_.size()) +
                            " bytes on the wire; the store's limit is " + std::to_string(limit) +
                            " bytes");
    const auto header = encode_header(FrameHeader{op, status, std::uint32_t(out_.size())});
    std::string frame(header.data(), header.size());
    frame += out_;
    return frame;
  }

 private:
  std::string out_;
};

// Reads payload fields, refusing to read past the end; every length is checked against
// what is left before anything is allocated for it.
class Reader {
 public:
  Reader(std::string_view payload, Op op) : p_(payload), op_(op) {}

  std::string str() {
    const std::uint32_t n = u32();
    need(n, "string field");
    std::string s(p_.substr(0, n));
    p_.remove_prefix(n);
    return s;
  }
  std::int64_t i64() {
    const std::uint64_t hi = u32();
    const std::uint64_t lo = u32();
    return std::int64_t(hi << 32 | lo);
  }
  bool boolean() {
    need(1, "bool field");
    const char c = p_[0];
    p_.remove_prefix(1);
    if (c != 0 && c != 1) fail("bool field holds " + std::to_string(int(std::uint8_t(c))));
    return c == 1;
  }
  std::vector<std::string> list() {
    const std::uint32_t count = u32();
    // Each entry needs at least its 4-byte length, so a count the payload cannot hold is
    // rejected here rather than trusted for a reservation.
    if (std::size_t(count) > p_.size() / 4)
      fail("key list claims " + std::to_string(count) + " entries in " + std::to_string(p_.size()) +
           " bytes");
    std::vector<std::string> items;
    items.reserve(count);
    for (std::uint32_t i = 0; i < count; ++i) items.push_back(str());
    return items;
  }
  void finish() {
    if (!p_.empty()) fail(std::to_string(p_.size()) + " unexpected trailing bytes");
  }

 private:
  std::uint32_t u32() {
    need(4, "length or integer field");
    const std::uint32_t v = get_u32(p_.data());
    p_.remove_prefix(4);
    return v;
  }
  void need(std::size_t n, const char* what) {
    if (p_.size() < n)
      fail(std::string("truncated ") + what + " (needs " + std::to_string(n) + " bytes, " +
           std::to_string(p_.size()) + " left)");
  }
  [[noreturn]] void fail(const std::string& why) {
    throw ProtocolError("malformed " + std::string(op_name(op_)) + " payload: " + why);
  }

  std::string_view p_;
  Op op_;
};

}  // namespace

std::array<char, kHeaderSize> encode_header(const FrameHeader& header) {
  std::string out;
  out.reserve(kHeaderSize);
  put_u32(out, kMagic);
  out.push_back(char(kVersion >> 8));
  out.push_back(char(kVersion & 0xff));
  out.push_back(char(header.op));
  out.push_back(char(header.status));
  put_u32(out, header.length);
  std::array<char, kHeaderSize> bytes{};
  out.copy(bytes.data(), kHeaderSize);
  return bytes;
}

FrameHeader decode_header(std::string_view bytes, std::uint32_t max_payload) {
  if (bytes.size() < kHeaderSize)
    throw ProtocolError("truncated frame header (" + std::to_string(bytes.size()) + " of " +
                        std::to_string(kHeaderSize) + " bytes)");
  const std::uint32_t magic = get_u32(bytes.data());
  if (magic != kMagic)
    throw ProtocolError("bad magic " + hex32(magic) + " (expected " + hex32(kMagic) +
                        "; not an accel store client?)");
  const std::uint16_t version =
      std::uint16_t(std::uint16_t(std::uint8_t(bytes[4])) << 8 | std::uint8_t(bytes[5]));
  if (version != kVersion)
    throw ProtocolError("unsupported protocol version " + std::to_string(version) +
                        " (this side speaks " + std::to_string(kVersion) + ")");
  const auto op = std::uint8_t(bytes[6]);
  if (!known_op(op)) throw ProtocolError("unknown opcode " + std::to_string(op));
  const auto status = std::uint8_t(bytes[7]);
  if (!known_status(status)) throw ProtocolError("unknown status " + std::to_string(status));
  const std::uint32_t length = get_u32(bytes.data() + 8);
  if (length > max_payload)
    throw ProtocolError(
        std::string(op_name(Op(op))) + " payload length " + std::to_string(length) +
        " exceeds the limit of " + std::to_string(max_payload) + " bytes" +
        (max_payload < kMaxPayload ? " for a connection that has not said HELLO" : ""));
  return FrameHeader{Op(op), Status(status), length};
}

std::string encode_request(const Request& r) {
  Writer w;
  switch (r.op) {
    case Op::hello:
      w.str(r.token);
      break;
    case Op::set:
      w.str(r.key);
      w.str(r.value);
      break;
    case Op::get:
      w.str(r.key);
      w.i64(r.timeout_ms);
      break;
    case Op::add:
      w.str(r.key);
      w.i64(r.delta);
      break;
    case Op::compare_set:
      w.str(r.key);
      w.str(r.expected);
      w.str(r.value);
      break;
    case Op::wait:
      w.list(r.keys);
      w.i64(r.timeout_ms);
      break;
    case Op::check:
      w.list(r.keys);
      break;
    case Op::delete_key:
      w.str(r.key);
      break;
  }
  if (r.op == Op::hello)
    return w.frame(r.op, Status::ok, "the HELLO carrying ACCEL_STORE_TOKEN", kMaxHelloPayload);
  const std::string what = std::string("store request ") + std::string(op_name(r.op)) +
                           (r.key.empty() ? std::string() : " for key '" + r.key + "'");
  return w.frame(r.op, Status::ok, what);
}

std::string encode_reply(const Reply& r) {
  Writer w;
  switch (r.status) {
    case Status::timeout:
      w.list(r.keys);
      break;
    case Status::error:
      w.str(r.value);
      break;
    case Status::ok:
      switch (r.op) {
        case Op::get:
        case Op::compare_set:
          w.str(r.value);
          break;
        case Op::add:
          w.i64(r.number);
          break;
        case Op::check:
        case Op::delete_key:
          w.boolean(r.flag);
          break;
        case Op::hello:
        case Op::set:
        case Op::wait:
          break;
      }
      break;
  }
  return w.frame(r.op, r.status, "store reply to " + std::string(op_name(r.op)));
}

Request decode_request(const FrameHeader& header, std::string_view payload) {
  Reader in(payload, header.op);
  Request r;
  r.op = header.op;
  switch (r.op) {
    case Op::hello:
      r.token = in.str();
      break;
    case Op::set:
      r.key = in.str();
      r.value = in.str();
      break;
    case Op::get:
      r.key = in.str();
      r.timeout_ms = in.i64();
      break;
    case Op::add:
      r.key = in.str();
      r.delta = in.i64();
      break;
    case Op::compare_set:
      r.key = in.str();
      r.expected = in.str();
      r.value = in.str();
      break;
    case Op::wait:
      r.keys = in.list();
      r.timeout_ms = in.i64();
      break;
    case Op::check:
      r.keys = in.list();
      break;
    case Op::delete_key:
      r.key = in.str();
      break;
  }
  in.finish();
  return r;
}

Reply decode_reply(const FrameHeader& header, std::string_view payload) {
  Reader in(payload, header.op);
  Reply r;
  r.op = header.op;
  r.status = header.status;
  switch (r.status) {
    case Status::timeout:
      r.keys = in.list();
      break;
    case Status::error:
      r.value = in.str();
      break;
    case Status::ok:
      switch (r.op) {
        case Op::get:
        case Op::compare_set:
          r.value = in.str();
          break;
        case Op::add:
          r.number = in.i64();
          break;
        case Op::check:
        case Op::delete_key:
          r.flag = in.boolean();
          break;
        case Op::hello:
        case Op::set:
        case Op::wait:
          break;
      }
      break;
  }
  in.finish();
  return r;
}

void FrameReader::raise_max_payload(std::uint32_t max_payload) {
  max_payload_ = std::max(max_payload_, max_payload);
}

void FrameReader::append(std::string_view bytes) {
  if (bytes.size() > capacity_left())
    throw InvalidArgument("FrameReader::append: " + std::to_string(bytes.size()) +
                          " bytes exceed the " + std::to_string(capacity_left()) + " left");
  // Drop the consumed prefix before growing, so the buffer never holds more than
  // kCapacity live bytes plus what is being appended.
  if (start_ > 0) {
    buffer_.erase(0, start_);
    start_ = 0;
  }
  buffer_.append(bytes);
}

std::optional<Frame> FrameReader::next() {
  const std::size_t have = buffered();
  if (have < kHeaderSize) return std::nullopt;
  const std::string_view view(buffer_.data() + start_, have);
  const FrameHeader header = decode_header(view, max_payload_);
  if (have < kHeaderSize + header.length) return std::nullopt;
  Frame frame{header, std::string(view.substr(kHeaderSize, header.length))};
  start_ += kHeaderSize + header.length;
  if (start_ == buffer_.size()) {
    // Give back the memory of a large frame instead of holding it for the connection's life.
    if (buffer_.capacity() > (1u << 20)) std::string().swap(buffer_);
    buffer_.clear();
    start_ = 0;
  }
  return frame;
}

bool FrameReader::holds_partial_frame() const {
  const std::size_t have = buffered();
  if (have == 0) return false;
  if (have < kHeaderSize) return true;
  // Only the length field matters here; a bad header is next()'s to report.
  return have < kHeaderSize + get_u32(buffer_.data() + start_ + 8);
}

}  // namespace accel::store_protocol
