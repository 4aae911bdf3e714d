#pragma once
// The TCP store's wire format, kept free of sockets so every encode/decode path is unit
// tested on plain bytes.
//
// Frame = 12-byte header + payload, all integers big-endian (network order, so the magic
// reads "ACST" in a packet dump):
//   u32 magic | u16 version | u8 opcode | u8 status | u32 payload length
// Requests carry status 0; a reply echoes the request's opcode and carries a Status.
// Payload fields: a string is u32 length + bytes, a key list is u32 count + strings, an
// integer is 8 bytes (two's complement), a bool is 1 byte.
//
//   request                              reply (ok)       timeout reply      error reply
//   HELLO       token                    -                -                  message
//   SET         key, value               -                -                  message
//   GET         key, timeout_ms          value            missing keys       message
//   ADD         key, delta               new value        -                  message
//   COMPARE_SET key, expected, desired   stored value     -                  message
//   WAIT        keys, timeout_ms         -                missing keys       message
//   CHECK       keys                     bool             -                  message
//   DELETE      key                      bool (existed)   -                  message

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "foundation/error.hpp"

namespace accel::store_protocol {

inline constexpr std::uint32_t kMagic = 0x41435354;  // 'ACST'
inline constexpr std::uint16_t kVersion = 1;
inline constexpr std::size_t kHeaderSize = 12;
// The largest payload either side accepts. A header announcing more is rejected before
// anything is allocated for it, so a stray or hostile peer cannot make the server reserve
// gigabytes. Values (NCCL ids, addresses) are far smaller.
inline constexpr std::uint32_t kMaxPayload = 16u << 20;
// The largest payload of a connection's frames until its HELLO was accepted (the token and
// its length field), so an unauthenticated peer can make the server buffer only this much.
inline constexpr std::uint32_t kMaxHelloPayload = 4096;

enum class Op : std::uint8_t {
  hello = 1,
  set = 2,
  get = 3,
  add = 4,
  compare_set = 5,
  wait = 6,
  check = 7,
  delete_key = 8,
};
std::string_view op_name(Op op);  // "GET", "COMPARE_SET", ...

enum class Status : std::uint8_t { ok = 0, timeout = 1, error = 2 };

// Malformed bytes on the wire: bad magic/version/opcode/status, an oversized length, or
// fields that overrun or underfill the payload.
class ProtocolError : public StoreError {
 public:
  using StoreError::StoreError;
};

struct FrameHeader {
  Op op = Op::hello;
  Status status = Status::ok;
  std::uint32_t length = 0;  // payload bytes
};

std::array<char, kHeaderSize> encode_header(const FrameHeader& header);
// Validates magic, version, opcode, status and length <= max_payload; throws ProtocolError.
FrameHeader decode_header(std::string_view bytes,  // bytes.size() must be >= kHeaderSize
                          std::uint32_t max_payload = kMaxPayload);

struct Request {
  Op op = Op::hello;
  std::string token;              // hello
  std::string key;                // set, get, add, compare_set, delete_key
  std::string value;              // set: the value; compare_set: the desired value
  std::string expected;           // compare_set
  std::int64_t delta = 0;         // add
  std::vector<std::string> keys;  // wait, check
  std::int64_t timeout_ms = 0;    // get, wait
};

struct Reply {
  Op op = Op::hello;
  Status status = Status::ok;
  std::string value;              // ok get/compare_set: the value; error: the message
  std::int64_t number = 0;        // ok add: the new value
  bool flag = false;              // ok check/delete_key
  std::vector<std::string> keys;  // timeout: the keys still missing

  static Reply ok(Op op) {
    Reply r;
    r.op = op;
    return r;
  }
  static Reply error(Op op, std::string message) {
    Reply r = ok(op);
    r.status = Status::error;
    r.value = std::move(message);
    return r;
  }
  static Reply timeout(Op op, std::vector<std::string> missing) {
    Reply r = ok(op);
    r.status = Status::timeout;
    r.keys = std::move(missing);
    return r;
  }
};

// Whole frames (header + payload). Throws InvalidArgument when the payload would exceed
// kMaxPayload (a value too large for the store), naming the key, or a HELLO kMaxHelloPayload
// (a token too long), naming ACCEL_STORE_TOKEN.
std::string encode_request(const Request& request);
std::string encode_reply(const Reply& reply);

// Payload decoding for a header already validated; throws ProtocolError on truncated or
// trailing bytes.
Request decode_request(const FrameHeader& header, std::string_view payload);
Reply decode_reply(const FrameHeader& header, std::string_view payload);

struct Frame {
  FrameHeader header;
  std::string payload;
};

// Cuts a byte stream into frames. Holds at most one frame of max_payload: the server asks
// capacity_left() before reading, so a connection's buffered input stays bounded.
class FrameReader {
 public:
  explicit FrameReader(std::uint32_t max_payload = kMaxPayload) : max_payload_(max_payload) {}

  // Raises the limit (the server does after HELLO); lowering it below what is buffered would
  // strand bytes, so it may only grow.
  void raise_max_payload(std::uint32_t max_payload);
  std::size_t buffered() const { return buffer_.size() - start_; }
  std::size_t capacity_left() const { return kHeaderSize + max_payload_ - buffered(); }
  // Appends stream bytes; throws InvalidArgument if they exceed capacity_left().
  void append(std::string_view bytes);
  // The next complete frame, or nullopt when more bytes are needed. A bad header (one
  // announcing more than max_payload included) throws ProtocolError as soon as its 12
  // bytes are in, before its payload is awaited.
  std::optional<Frame> next();
  // Whether the bytes buffered end inside a frame (its header or payload still incomplete).
  bool holds_partial_frame() const;

 private:
  std::string buffer_;
  std::size_t start_ = 0;  // consumed prefix, dropped lazily to avoid quadratic erasing
  std::uint32_t max_payload_;
};

}  // namespace accel::store_protocol
