// The rendezvous stores: the Store contract run against MemoryStore, PrefixStore and
// TcpStore (server in-process on 127.0.0.1, port 0), the wire protocol on plain bytes, and
// the TCP server's robustness: tokens, malformed frames on raw sockets, unreachable and busy
// ports, many concurrent clients, the limits on unauthenticated connections (frame size,
// connection count, timeouts), and a flood of a real `accel launch`'s store.
//
// No timing is asserted beyond "it failed with a timeout"; deadlines only keep a broken
// build from hanging.

#include <doctest/doctest.h>

#include <sys/resource.h>
#include <sys/socket.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "foundation/error.hpp"
#include "foundation/socket.hpp"
#include "foundation/store/memory_store.hpp"
#include "foundation/store/prefix_store.hpp"
#include "foundation/store/store_protocol.hpp"
#include "foundation/store/tcp_store.hpp"
#include "tests/support/files.hpp"
#include "tests/support/ranks.hpp"
#include "tests/support/skip.hpp"

namespace accel {
namespace {

using namespace std::chrono_literals;
namespace sp = store_protocol;

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// One store under test: `client()` hands out another handle on the same key space (a new
// connection for TCP, the same object in-process), so "another rank" can be simulated.
struct Backend {
  std::string name;
  std::function<StorePtr()> client;
  std::shared_ptr<void> keep_alive;  // the server, or the shared in-process store
  std::string address;               // what TCP error messages must name; empty in-process
};

TcpStoreOptions quick_options(std::string token = "") {
  TcpStoreOptions o;
  o.token = std::move(token);
  o.connect_timeout = 5s;
  o.timeout = 10s;
  return o;
}

std::vector<Backend> backends() {
  std::vector<Backend> out;
  {
    auto mem = std::make_shared<MemoryStore>();
    out.push_back(Backend{"memory", [mem] { return StorePtr(mem); }, mem, ""});
  }
  {
    auto mem = std::make_shared<MemoryStore>();
    auto prefixed = std::make_shared<PrefixStore>("job7", mem);
    out.push_back(Backend{"prefix", [prefixed] { return StorePtr(prefixed); }, prefixed, ""});
  }
  {
    auto server = std::make_shared<TcpStoreServer>("127.0.0.1", 0);
    const int port = server->port();
    out.push_back(Backend{
        "tcp",
        [port] { return StorePtr(std::make_shared<TcpStore>("127.0.0.1", port, quick_options())); },
        server, "127.0.0.1:" + std::to_string(port)});
  }
  return out;
}

// --------------------------------------------------------------------------------------
// The Store contract, for every backend.

TEST_CASE("store: set then get, overwrite, binary and empty values") {
  for (auto& b : backends()) {
    INFO("backend ", b.name);
    auto s = b.client();
    s->set("a", "1");
    CHECK(s->get("a", 1s) == "1");
    s->set("a", "2");
    CHECK(s->get("a", 1s) == "2");
    const std::string binary("\0\x01\xff\0tail", 8);
    s->set("bin", binary);
    CHECK(s->get("bin", 1s) == binary);
    s->set("empty", "");
    CHECK(s->get("empty", 1s).empty());
    // Another handle sees the same keys.
    CHECK(b.client()->get("a", 1s) == "2");
  }
}

TEST_CASE("store: get blocks until another rank sets the key") {
  for (auto& b : backends()) {
    INFO("backend ", b.name);
    auto reader = b.client();
    auto writer = b.client();
    std::thread t([&] {
      std::this_thread::sleep_for(100ms);
      writer->set("late", "here");
    });
    CHECK(reader->get("late", 10s) == "here");
    t.join();
  }
}

TEST_CASE("store: get times out with an error naming the key") {
  for (auto& b : backends()) {
    INFO("backend ", b.name);
    auto s = b.client();
    try {
      s->get("never-set-key", 100ms);
      FAIL("get returned for a key nobody set");
    } catch (const TimeoutError& e) {
      CHECK(contains(e.what(), "never-set-key"));
      if (!b.address.empty()) CHECK(contains(e.what(), b.address));
    }
    // The default-timeout overload uses the store's timeout.
    s->set_timeout(100ms);
    CHECK_THROWS_AS(s->get("never-set-key"), TimeoutError);
    // The handle keeps working after a timeout.
    s->set("after-timeout", "ok");
    CHECK(s->get("after-timeout", 1s) == "ok");
  }
}

TEST_CASE("store: add is atomic across threads and clients") {
  for (auto& b : backends()) {
    INFO("backend ", b.name);
    constexpr int kThreads = 8, kAdds = 50;
    std::vector<std::thread> threads;
    std::vector<std::vector<std::int64_t>> seen(kThreads);
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {
        auto s = b.client();
        for (int i = 0; i < kAdds; ++i) seen[t].push_back(s->add("counter", 1));
      });
    }
    for (auto& t : threads) t.join();
    auto s = b.client();
    CHECK(s->add("counter", 0) == kThreads * kAdds);
    CHECK(s->get("counter", 1s) == std::to_string(kThreads * kAdds));
    // Every add returned a distinct intermediate value: none was lost or duplicated.
    std::set<std::int64_t> all;
    for (auto& v : seen) all.insert(v.begin(), v.end());
    CHECK(all.size() == std::size_t(kThreads * kAdds));
    CHECK(s->add("neg", -5) == -5);
    CHECK(s->add("neg", 2) == -3);

    s->set("text", "not a number");
    try {
      s->add("text", 1);
      FAIL("add on a non-integer value succeeded");
    } catch (const StoreError& e) {
      CHECK(contains(e.what(), "text"));
    }
    // The connection survives an error reply.
    CHECK(s->add("neg", 1) == -2);
  }
}

TEST_CASE("store: compare_set follows torch's TCPStore semantics") {
  for (auto& b : backends()) {
    INFO("backend ", b.name);
    auto s = b.client();
    // Absent key with an empty expected value: set.
    CHECK(s->compare_set("cs", "", "first") == "first");
    CHECK(s->get("cs", 1s) == "first");
    // Mismatch: unchanged, the current value is returned.
    CHECK(s->compare_set("cs", "wrong", "second") == "first");
    CHECK(s->get("cs", 1s) == "first");
    // Match: swapped.
    CHECK(s->compare_set("cs", "first", "second") == "second");
    CHECK(s->get("cs", 1s) == "second");
    // Absent key with a non-empty expected value: not set, expected echoed back.
    CHECK(s->compare_set("cs-absent", "x", "y") == "x");
    CHECK_FALSE(s->check({"cs-absent"}));
  }
}

TEST_CASE("store: wait blocks for every key and its timeout names the missing ones") {
  for (auto& b : backends()) {
    INFO("backend ", b.name);
    auto s = b.client();
    auto writer = b.client();
    std::thread t([&] {
      std::this_thread::sleep_for(50ms);
      writer->set("w1", "x");
      std::this_thread::sleep_for(50ms);
      writer->set("w2", "y");
    });
    s->wait({"w1", "w2"}, 10s);
    CHECK(s->check({"w1", "w2"}));
    t.join();
    s->wait({}, 10ms);  // nothing to wait for

    s->set("present-key", "1");
    try {
      s->wait({"present-key", "absent-key"}, 100ms);
      FAIL("wait returned with a key missing");
    } catch (const TimeoutError& e) {
      CHECK(contains(e.what(), "absent-key"));
      CHECK_FALSE(contains(e.what(), "present-key"));
      if (!b.address.empty()) CHECK(contains(e.what(), b.address));
    }
  }
}

TEST_CASE("store: check and delete_key") {
  for (auto& b : backends()) {
    INFO("backend ", b.name);
    auto s = b.client();
    CHECK_FALSE(s->check({"d"}));
    CHECK(s->check({}));
    s->set("d", "v");
    s->set("e", "v");
    CHECK(s->check({"d", "e"}));
    CHECK_FALSE(s->check({"d", "e", "f"}));
    CHECK(s->delete_key("d"));
    CHECK_FALSE(s->delete_key("d"));
    CHECK_FALSE(s->check({"d"}));
    CHECK_THROWS_AS(s->get("d", 50ms), TimeoutError);
  }
}

TEST_CASE("prefix store: keys land under prefix/ in the inner store") {
  auto inner = std::make_shared<MemoryStore>();
  PrefixStore p("gen3", inner);
  p.set("k", "v");
  CHECK(inner->get("gen3/k", 1s) == "v");
  CHECK(p.add("n", 2) == 2);
  CHECK(inner->get("gen3/n", 1s) == "2");
  inner->set("gen3/w", "1");
  p.wait({"w"}, 1s);
  CHECK(p.check({"k", "n", "w"}));
  CHECK_FALSE(inner->check({"k"}));
  PrefixStore nested("inner", std::make_shared<PrefixStore>("outer", inner));
  nested.set("x", "1");
  CHECK(inner->check({"outer/inner/x"}));
  CHECK_THROWS_AS(PrefixStore("p", nullptr), InvalidArgument);
}

// --------------------------------------------------------------------------------------
// The wire protocol without sockets.

sp::Request round_trip(const sp::Request& r) {
  const std::string frame = sp::encode_request(r);
  const sp::FrameHeader h = sp::decode_header(frame);
  CHECK(h.length == frame.size() - sp::kHeaderSize);
  return sp::decode_request(h, std::string_view(frame).substr(sp::kHeaderSize));
}

sp::Reply round_trip(const sp::Reply& r) {
  const std::string frame = sp::encode_reply(r);
  const sp::FrameHeader h = sp::decode_header(frame);
  return sp::decode_reply(h, std::string_view(frame).substr(sp::kHeaderSize));
}

TEST_CASE("protocol: requests and replies round-trip") {
  sp::Request r;
  r.op = sp::Op::hello;
  r.token = "t0k";
  CHECK(round_trip(r).token == "t0k");

  r = {};
  r.op = sp::Op::set;
  r.key = "k";
  r.value = std::string("v\0v", 3);
  auto back = round_trip(r);
  CHECK(back.key == "k");
  CHECK(back.value == r.value);

  r = {};
  r.op = sp::Op::get;
  r.key = "g";
  r.timeout_ms = 123456789012;
  CHECK(round_trip(r).timeout_ms == 123456789012);

  r = {};
  r.op = sp::Op::add;
  r.key = "a";
  r.delta = -42;
  CHECK(round_trip(r).delta == -42);

  r = {};
  r.op = sp::Op::compare_set;
  r.key = "c";
  r.expected = "old";
  r.value = "new";
  back = round_trip(r);
  CHECK(back.expected == "old");
  CHECK(back.value == "new");

  r = {};
  r.op = sp::Op::wait;
  r.keys = {"x", "", "z"};
  r.timeout_ms = -1;
  back = round_trip(r);
  CHECK(back.keys == r.keys);
  CHECK(back.timeout_ms == -1);

  r = {};
  r.op = sp::Op::delete_key;
  r.key = "d";
  CHECK(round_trip(r).key == "d");

  sp::Reply rep = sp::Reply::ok(sp::Op::get);
  rep.value = "value";
  CHECK(round_trip(rep).value == "value");
  rep = sp::Reply::ok(sp::Op::add);
  rep.number = std::numeric_limits<std::int64_t>::min();
  CHECK(round_trip(rep).number == std::numeric_limits<std::int64_t>::min());
  rep = sp::Reply::ok(sp::Op::check);
  rep.flag = true;
  CHECK(round_trip(rep).flag);
  rep = sp::Reply::timeout(sp::Op::wait, {"m1", "m2"});
  CHECK(round_trip(rep).keys == rep.keys);
  rep = sp::Reply::error(sp::Op::add, "bad things");
  auto rb = round_trip(rep);
  CHECK(rb.status == sp::Status::error);
  CHECK(rb.value == "bad things");
}

TEST_CASE("protocol: the header reads 'ACST' and bad headers are rejected") {
  const auto h = sp::encode_header(sp::FrameHeader{sp::Op::get, sp::Status::ok, 5});
  const std::string bytes(h.data(), h.size());
  CHECK(bytes.substr(0, 4) == "ACST");

  auto corrupt = [&](std::size_t at, char value) {
    std::string b = bytes;
    b[at] = value;
    return b;
  };
  CHECK_THROWS_AS(sp::decode_header(corrupt(0, 'X')), sp::ProtocolError);  // magic
  CHECK_THROWS_AS(sp::decode_header(corrupt(5, 2)), sp::ProtocolError);    // version 2
  CHECK_THROWS_AS(sp::decode_header(corrupt(6, 0)), sp::ProtocolError);    // opcode 0
  CHECK_THROWS_AS(sp::decode_header(corrupt(6, 99)), sp::ProtocolError);   // opcode 99
  CHECK_THROWS_AS(sp::decode_header(corrupt(7, 9)), sp::ProtocolError);    // status
  CHECK_THROWS_AS(sp::decode_header(bytes.substr(0, 11)), sp::ProtocolError);
  const auto big =
      sp::encode_header(sp::FrameHeader{sp::Op::set, sp::Status::ok, sp::kMaxPayload + 1});
  try {
    sp::decode_header(std::string_view(big.data(), big.size()));
    FAIL("oversized length accepted");
  } catch (const sp::ProtocolError& e) {
    CHECK(contains(e.what(), "exceeds"));
  }
  const auto max = sp::encode_header(sp::FrameHeader{sp::Op::set, sp::Status::ok, sp::kMaxPayload});
  CHECK(sp::decode_header(std::string_view(max.data(), max.size())).length == sp::kMaxPayload);
}

TEST_CASE("protocol: truncated, overrunning and trailing payload fields are rejected") {
  sp::Request r;
  r.op = sp::Op::set;
  r.key = "key";
  r.value = "value";
  const std::string frame = sp::encode_request(r);
  const sp::FrameHeader h = sp::decode_header(frame);
  const std::string payload = frame.substr(sp::kHeaderSize);
  for (std::size_t n = 0; n < payload.size(); ++n)
    CHECK_THROWS_AS(sp::decode_request(h, payload.substr(0, n)), sp::ProtocolError);
  CHECK_THROWS_AS(sp::decode_request(h, payload + "x"), sp::ProtocolError);
  // A string length pointing past the end.
  std::string overrun = payload;
  overrun[3] = char(200);
  CHECK_THROWS_AS(sp::decode_request(h, overrun), sp::ProtocolError);
  // A key list claiming four billion entries is refused without reserving for them.
  const std::string huge_list("\xff\xff\xff\xff", 4);
  CHECK_THROWS_AS(sp::decode_request(sp::FrameHeader{sp::Op::check, sp::Status::ok, 4}, huge_list),
                  sp::ProtocolError);
  // A bool that is neither 0 nor 1.
  CHECK_THROWS_AS(sp::decode_reply(sp::FrameHeader{sp::Op::check, sp::Status::ok, 1}, "\x07"),
                  sp::ProtocolError);
}

TEST_CASE("protocol: values over the frame limit are refused when encoding") {
  sp::Request r;
  r.op = sp::Op::set;
  r.key = "too-big";
  r.value.assign(sp::kMaxPayload, 'x');
  try {
    sp::encode_request(r);
    FAIL("oversized request encoded");
  } catch (const InvalidArgument& e) {
    CHECK(contains(e.what(), "too-big"));
  }
}

TEST_CASE("protocol: FrameReader cuts a byte stream into frames however it is split") {
  sp::Request a;
  a.op = sp::Op::set;
  a.key = "k1";
  a.value = "v1";
  sp::Request b;
  b.op = sp::Op::get;
  b.key = "k2";
  b.timeout_ms = 7;
  const std::string stream = sp::encode_request(a) + sp::encode_request(b);

  // Byte by byte.
  sp::FrameReader reader;
  std::vector<sp::Frame> frames;
  for (char c : stream) {
    reader.append(std::string_view(&c, 1));
    while (auto f = reader.next()) frames.push_back(std::move(*f));
  }
  REQUIRE(frames.size() == 2);
  CHECK(sp::decode_request(frames[0].header, frames[0].payload).value == "v1");
  CHECK(sp::decode_request(frames[1].header, frames[1].payload).timeout_ms == 7);
  CHECK(reader.buffered() == 0);

  // All at once.
  sp::FrameReader whole;
  whole.append(stream);
  CHECK(whole.next().has_value());
  CHECK(whole.next().has_value());
  CHECK_FALSE(whole.next().has_value());

  // A bad header is reported as soon as its 12 bytes are in.
  sp::FrameReader bad;
  bad.append(std::string(sp::kHeaderSize, 'Z'));
  CHECK_THROWS_AS(bad.next(), sp::ProtocolError);

  // Input beyond one maximum frame is refused.
  sp::FrameReader full;
  CHECK(full.capacity_left() == sp::kHeaderSize + sp::kMaxPayload);
  CHECK_THROWS_AS(full.append(std::string(full.capacity_left() + 1, 'x')), InvalidArgument);
}

TEST_CASE("protocol: a FrameReader's smaller limit refuses a big header at once, until raised") {
  sp::FrameReader reader(sp::kMaxHelloPayload);
  CHECK(reader.capacity_left() == sp::kHeaderSize + sp::kMaxHelloPayload);
  const auto big = sp::encode_header(sp::FrameHeader{sp::Op::hello, sp::Status::ok, 16u << 20});
  reader.append(std::string_view(big.data(), big.size()));
  try {
    reader.next();
    FAIL("a 16 MiB header was accepted under a 4 KiB limit");
  } catch (const sp::ProtocolError& e) {
    CHECK(contains(e.what(), "16777216"));
    CHECK(contains(e.what(), "4096"));
    CHECK(contains(e.what(), "HELLO"));
  }

  sp::FrameReader raised(sp::kMaxHelloPayload);
  raised.raise_max_payload(sp::kMaxPayload);
  CHECK(raised.capacity_left() == sp::kHeaderSize + sp::kMaxPayload);
  raised.append(std::string_view(big.data(), big.size()));
  CHECK_FALSE(raised.next().has_value());  // valid, waiting for the payload
  CHECK(raised.holds_partial_frame());
}

TEST_CASE("protocol: holds_partial_frame is true only inside a frame") {
  sp::Request set;
  set.op = sp::Op::set;
  set.key = "k";
  set.value = "value";
  const std::string frame = sp::encode_request(set);
  sp::FrameReader reader;
  CHECK_FALSE(reader.holds_partial_frame());
  reader.append(frame.substr(0, 5));  // inside the header
  CHECK(reader.holds_partial_frame());
  reader.append(frame.substr(5, 10));  // inside the payload
  CHECK(reader.holds_partial_frame());
  reader.append(frame.substr(15));  // complete: not partial, though not consumed yet
  CHECK_FALSE(reader.holds_partial_frame());
  CHECK(reader.next().has_value());
  CHECK_FALSE(reader.holds_partial_frame());
}

TEST_CASE("protocol: a token too long for HELLO is refused when encoding, naming the variable") {
  sp::Request hello;
  hello.op = sp::Op::hello;
  hello.token.assign(sp::kMaxHelloPayload, 't');  // + its 4-byte length: over the limit
  try {
    sp::encode_request(hello);
    FAIL("an oversized HELLO was encoded");
  } catch (const InvalidArgument& e) {
    CHECK(contains(e.what(), "ACCEL_STORE_TOKEN"));
    CHECK(contains(e.what(), "4096"));
  }
  hello.token.resize(sp::kMaxHelloPayload - 4);
  CHECK(sp::encode_request(hello).size() == sp::kHeaderSize + sp::kMaxHelloPayload);
}

// --------------------------------------------------------------------------------------
// The TCP server and client.

// A raw connection that speaks whatever bytes a test wants.
Socket raw_connect(int port) {
  ConnectOptions o;
  o.timeout = 5s;
  return connect_tcp("127.0.0.1", port, o);
}

void send_bytes(const Socket& s, const std::string& bytes) {
  send_all(s.fd(), bytes.data(), bytes.size(), deadline_after(5s));
}

std::string hello_frame(const std::string& token = "") {
  sp::Request r;
  r.op = sp::Op::hello;
  r.token = token;
  return sp::encode_request(r);
}

sp::Reply read_reply(const Socket& s) {
  char header[sp::kHeaderSize];
  recv_all(s.fd(), header, sizeof(header), deadline_after(5s));
  const auto h = sp::decode_header(std::string_view(header, sizeof(header)));
  std::string payload(h.length, '\0');
  recv_all(s.fd(), payload.data(), payload.size(), deadline_after(5s));
  return sp::decode_reply(h, payload);
}

// True when the server closed the connection (EOF or reset) within a generous deadline;
// whatever it sent first (an error reply) is skipped.
bool closed_by_server(const Socket& s) {
  std::string sink(64 * 1024, '\0');
  const Deadline deadline = deadline_after(5s);
  for (;;) {
    try {
      recv_all(s.fd(), sink.data(), sink.size(), deadline);
    } catch (const TimeoutError&) {
      return false;
    } catch (const CommError&) {
      return true;
    }
  }
}

void check_still_serving(int port, const std::string& key) {
  TcpStore good("127.0.0.1", port, quick_options());
  good.set(key, "fine");
  CHECK(good.get(key, 1s) == "fine");
}

TEST_CASE("tcp store: a server with a token refuses a wrong or missing one") {
  TcpStoreServer server("127.0.0.1", 0, "s3cret");
  for (const std::string bad : {"wrong", ""}) {
    INFO("token '", bad, "'");
    try {
      TcpStore client("127.0.0.1", server.port(), quick_options(bad));
      FAIL("a client with the wrong token was accepted");
    } catch (const StoreError& e) {
      CHECK(contains(e.what(), "refused this client"));
      CHECK(contains(e.what(), "ACCEL_STORE_TOKEN"));
      CHECK(contains(e.what(), "127.0.0.1:" + std::to_string(server.port())));
    }
  }
  // A raw connection skipping HELLO gets the refusal and is closed before touching a key.
  {
    Socket raw = raw_connect(server.port());
    sp::Request set;
    set.op = sp::Op::set;
    set.key = "sneaky";
    set.value = "1";
    send_bytes(raw, sp::encode_request(set));
    const sp::Reply r = read_reply(raw);
    CHECK(r.status == sp::Status::error);
    CHECK(contains(r.value, "wrong store token"));
    CHECK(closed_by_server(raw));
  }
  TcpStore client("127.0.0.1", server.port(), quick_options("s3cret"));
  client.set("k", "v");
  CHECK(client.get("k", 1s) == "v");
  CHECK_FALSE(client.check({"sneaky"}));

  // With no explicit token the client reads ACCEL_STORE_TOKEN.
  ::setenv("ACCEL_STORE_TOKEN", "s3cret", 1);
  TcpStoreOptions from_env;
  from_env.connect_timeout = 5s;
  CHECK_NOTHROW(TcpStore("127.0.0.1", server.port(), from_env));
  ::unsetenv("ACCEL_STORE_TOKEN");
  CHECK_THROWS_AS(TcpStore("127.0.0.1", server.port(), from_env), StoreError);
}

TEST_CASE("tcp store: a server without a token still wants HELLO first") {
  TcpStoreServer server("127.0.0.1", 0);
  // Any token is fine when the server has none.
  CHECK_NOTHROW(TcpStore("127.0.0.1", server.port(), quick_options("whatever")));
  Socket raw = raw_connect(server.port());
  sp::Request get;
  get.op = sp::Op::check;
  get.keys = {"x"};
  send_bytes(raw, sp::encode_request(get));
  CHECK(read_reply(raw).status == sp::Status::error);
  CHECK(closed_by_server(raw));
  check_still_serving(server.port(), "after-no-hello");
}

TEST_CASE("tcp store: malformed input closes only that connection") {
  TcpStoreServer server("127.0.0.1", 0);
  const int port = server.port();
  // A well-behaved client connected throughout, with a parked GET in flight.
  TcpStore bystander("127.0.0.1", port, quick_options());
  std::thread waiting([&] {
    try {
      CHECK(bystander.get("released", 10s) == "yes");
    } catch (const std::exception& e) {
      FAIL_CHECK("bystander: " << e.what());
    }
  });

  SUBCASE("random bytes") {
    Socket raw = raw_connect(port);
    std::mt19937 rng(1234);
    std::string junk(4096, '\0');
    for (auto& c : junk) c = char(rng());
    send_bytes(raw, junk);
    CHECK(closed_by_server(raw));
  }
  SUBCASE("bad magic after a good HELLO") {
    Socket raw = raw_connect(port);
    send_bytes(raw, hello_frame());
    CHECK(read_reply(raw).status == sp::Status::ok);
    std::string frame = hello_frame();
    frame[0] = 'X';
    send_bytes(raw, frame);
    CHECK(closed_by_server(raw));
  }
  SUBCASE("bad version") {
    Socket raw = raw_connect(port);
    std::string frame = hello_frame();
    frame[5] = 9;
    send_bytes(raw, frame);
    CHECK(closed_by_server(raw));
  }
  SUBCASE("unknown opcode") {
    Socket raw = raw_connect(port);
    send_bytes(raw, hello_frame());
    CHECK(read_reply(raw).status == sp::Status::ok);
    std::string frame = hello_frame();
    frame[6] = 77;
    send_bytes(raw, frame);
    CHECK(closed_by_server(raw));
  }
  SUBCASE("oversized length, header only") {
    Socket raw = raw_connect(port);
    send_bytes(raw, hello_frame());
    CHECK(read_reply(raw).status == sp::Status::ok);
    const auto h = sp::encode_header(sp::FrameHeader{sp::Op::set, sp::Status::ok, 0xffffffffu});
    send_bytes(raw, std::string(h.data(), h.size()));
    CHECK(closed_by_server(raw));
  }
  SUBCASE("truncated payload fields") {
    Socket raw = raw_connect(port);
    send_bytes(raw, hello_frame());
    CHECK(read_reply(raw).status == sp::Status::ok);
    // A SET whose key length claims more bytes than the frame carries.
    std::string payload(
        "\x00\x00\x01\x00"
        "abc",
        7);
    const auto h = sp::encode_header(
        sp::FrameHeader{sp::Op::set, sp::Status::ok, std::uint32_t(payload.size())});
    send_bytes(raw, std::string(h.data(), h.size()) + payload);
    CHECK(closed_by_server(raw));
  }
  SUBCASE("a frame cut off mid-payload, then the connection dropped") {
    Socket raw = raw_connect(port);
    send_bytes(raw, hello_frame());
    CHECK(read_reply(raw).status == sp::Status::ok);
    sp::Request set;
    set.op = sp::Op::set;
    set.key = "half";
    set.value = std::string(1000, 'v');
    const std::string frame = sp::encode_request(set);
    send_bytes(raw, frame.substr(0, 100));
    // The server waits for the rest without blocking anyone else.
    check_still_serving(port, "during-partial-frame");
    raw.close();
  }
  SUBCASE("a parked GET whose client vanishes") {
    Socket raw = raw_connect(port);
    send_bytes(raw, hello_frame());
    CHECK(read_reply(raw).status == sp::Status::ok);
    sp::Request get;
    get.op = sp::Op::get;
    get.key = "released";
    get.timeout_ms = 10000;
    send_bytes(raw, sp::encode_request(get));
    std::this_thread::sleep_for(50ms);
    raw.close();
  }

  check_still_serving(port, "after-malformed");
  TcpStore releaser("127.0.0.1", port, quick_options());
  releaser.set("released", "yes");
  waiting.join();
}

TEST_CASE("tcp store: pipelined requests on one connection are answered in order") {
  TcpStoreServer server("127.0.0.1", 0);
  Socket raw = raw_connect(server.port());
  sp::Request set;
  set.op = sp::Op::set;
  set.key = "p";
  set.value = "1";
  sp::Request get;
  get.op = sp::Op::get;
  get.key = "p";
  get.timeout_ms = 1000;
  sp::Request add;
  add.op = sp::Op::add;
  add.key = "n";
  add.delta = 3;
  send_bytes(raw, hello_frame() + sp::encode_request(set) + sp::encode_request(get) +
                      sp::encode_request(add));
  CHECK(read_reply(raw).op == sp::Op::hello);
  CHECK(read_reply(raw).op == sp::Op::set);
  CHECK(read_reply(raw).value == "1");
  CHECK(read_reply(raw).number == 3);
}

TEST_CASE("tcp store: nobody listening fails within the connect timeout, naming the address") {
  int port = 0;
  {
    ListeningSocket l = listen_tcp("127.0.0.1", 0);
    port = l.port;
  }  // closed again: nothing listens there now
  TcpStoreOptions o;
  o.token = "";
  o.connect_timeout = 300ms;
  const auto start = SteadyClock::now();
  try {
    TcpStore client("127.0.0.1", port, o);
    FAIL("connected to a port nobody listens on");
  } catch (const StoreError& e) {
    CHECK(contains(e.what(),
                   "could not reach the rendezvous store at 127.0.0.1:" + std::to_string(port)));
    CHECK(contains(e.what(), "300 ms"));
  }
  CHECK(SteadyClock::now() - start < 30s);  // generous: only guards against a hang
}

TEST_CASE("tcp store: a busy port is a StoreError naming host:port") {
  TcpStoreServer first("127.0.0.1", 0);
  try {
    TcpStoreServer second("127.0.0.1", first.port());
    FAIL("two servers bound the same port");
  } catch (const StoreError& e) {
    CHECK(contains(e.what(), "127.0.0.1:" + std::to_string(first.port())));
    CHECK(contains(e.what(), "in use"));
  }
}

TEST_CASE("tcp store: a vanished server is an error, not a hang") {
  auto server = std::make_unique<TcpStoreServer>("127.0.0.1", 0);
  TcpStoreOptions o = quick_options();
  o.connect_timeout = 200ms;
  TcpStore client("127.0.0.1", server->port(), o);
  client.set("k", "v");
  server.reset();
  CHECK_THROWS_AS(client.set("k", "w"), StoreError);
  CHECK_THROWS_AS(client.get("k", 100ms), StoreError);  // reconnecting fails too
}

// The server's reply to the first thing a raw connection sent, as a test result rather than
// an exception: a server that never answers (it is waiting for a payload) fails here.
std::optional<sp::Reply> try_read_reply(const Socket& s) {
  try {
    return read_reply(s);
  } catch (const Error& e) {
    MESSAGE("no reply: " << e.what());
    return std::nullopt;
  }
}

TEST_CASE("tcp store: until HELLO a connection may send only a small frame") {
  TcpStoreServer server("127.0.0.1", 0, "s3cret");
  // A header announcing a 16 MiB HELLO, or a 1 MiB SET, is refused as soon as its 12 bytes
  // are in: nothing is buffered for a payload nobody authenticated.
  for (const sp::Op op : {sp::Op::hello, sp::Op::set}) {
    INFO("first frame ", sp::op_name(op));
    Socket raw = raw_connect(server.port());
    const std::uint32_t length = op == sp::Op::hello ? 16u << 20 : 1u << 20;
    const auto h = sp::encode_header(sp::FrameHeader{op, sp::Status::ok, length});
    send_bytes(raw, std::string(h.data(), h.size()));
    const auto r = try_read_reply(raw);
    REQUIRE(r.has_value());
    CHECK(r->status == sp::Status::error);
    CHECK(contains(r->value, std::to_string(length)));
    CHECK(contains(r->value, "limit of 4096 bytes for a connection that has not said HELLO"));
    CHECK(closed_by_server(raw));
  }
  // After HELLO the full limit applies.
  TcpStore client("127.0.0.1", server.port(), quick_options("s3cret"));
  const std::string big(1u << 20, 'b');
  client.set("big", big);
  CHECK(client.get("big", 1s) == big);
}

TEST_CASE("tcp store: at the connection limit silent connections give way, greeted ones stay") {
  TcpStoreServerOptions options;
  options.token = "s3cret";
  options.max_connections = 4;
  TcpStoreServer server("127.0.0.1", 0, options);
  CHECK(server.max_connections() == 4);
  std::vector<Socket> silent;
  for (int i = 0; i < 4; ++i) silent.push_back(raw_connect(server.port()));
  // Each rank's client gets in, in place of the oldest connection that has not said HELLO.
  std::vector<std::unique_ptr<TcpStore>> ranks;
  for (int i = 0; i < 4; ++i) {
    ranks.push_back(
        std::make_unique<TcpStore>("127.0.0.1", server.port(), quick_options("s3cret")));
    ranks.back()->set("rank" + std::to_string(i), "in");
    CHECK(closed_by_server(silent[std::size_t(i)]));
  }
  // Every slot holds an authenticated client now: the next one is refused, told why.
  try {
    TcpStore extra("127.0.0.1", server.port(), quick_options("s3cret"));
    FAIL("a fifth connection was served under a limit of 4");
  } catch (const StoreError& e) {
    CHECK(contains(e.what(), "limit of 4 connections"));
    CHECK(contains(e.what(), "max_connections"));
  }
  for (auto& r : ranks) CHECK(r->get("rank0", 1s) == "in");  // nobody authenticated was lost
  // A slot given back is served again (the server may see the close a moment after the
  // next connect, so a refusal is retried).
  ranks.pop_back();
  std::unique_ptr<TcpStore> late;
  for (int attempt = 0; attempt < 100 && !late; ++attempt) {
    try {
      late = std::make_unique<TcpStore>("127.0.0.1", server.port(), quick_options("s3cret"));
    } catch (const StoreError&) {
      std::this_thread::sleep_for(20ms);
    }
  }
  REQUIRE(late);
  CHECK(late->get("rank3", 1s) == "in");
}

TEST_CASE("tcp store: the connection limit follows RLIMIT_NOFILE, keeping a reserve free") {
  rlimit saved{};
  REQUIRE(::getrlimit(RLIMIT_NOFILE, &saved) == 0);
  auto limit_under = [&](rlim_t soft) {
    rlimit low = saved;
    low.rlim_cur = std::min(soft, saved.rlim_max);
    REQUIRE(::setrlimit(RLIMIT_NOFILE, &low) == 0);
    const std::size_t n = TcpStoreServer("127.0.0.1", 0).max_connections();
    ::setrlimit(RLIMIT_NOFILE, &saved);
    return n;
  };
  if (saved.rlim_max < 4096) {
    MESSAGE("hard RLIMIT_NOFILE " << saved.rlim_max << " < 4096: only the lower limits checked");
  } else {
    CHECK(limit_under(4096) == 3072);  // a quarter kept free
  }
  CHECK(limit_under(1024) == 768);
  CHECK(limit_under(256) == 192);  // at least 64 kept free
  CHECK(limit_under(100) == 50);   // but never more than half
}

TEST_CASE("tcp store: no HELLO in time closes a connection; an idle greeted one stays") {
  TcpStoreServerOptions options;
  options.token = "s3cret";
  options.hello_timeout = 200ms;
  TcpStoreServer server("127.0.0.1", 0, options);
  Socket idle = raw_connect(server.port());
  Socket half_hello = raw_connect(server.port());
  send_bytes(half_hello, hello_frame("s3cret").substr(0, 7));
  TcpStore client("127.0.0.1", server.port(), quick_options("s3cret"));
  CHECK(closed_by_server(idle));
  CHECK(closed_by_server(half_hello));
  // The authenticated client idled past hello_timeout too, and is still served.
  std::this_thread::sleep_for(400ms);
  client.set("k", "v");
  CHECK(client.get("k", 1s) == "v");
}

TEST_CASE("tcp store: a frame left half-sent is closed after frame_timeout") {
  TcpStoreServerOptions options;
  options.frame_timeout = 200ms;
  TcpStoreServer server("127.0.0.1", 0, options);
  Socket raw = raw_connect(server.port());
  send_bytes(raw, hello_frame());
  REQUIRE(read_reply(raw).status == sp::Status::ok);
  // Idle between frames is fine, however long: the clock runs only inside a frame.
  std::this_thread::sleep_for(400ms);
  sp::Request check;
  check.op = sp::Op::check;
  check.keys = {"half"};
  send_bytes(raw, sp::encode_request(check));
  const auto r = try_read_reply(raw);
  REQUIRE(r.has_value());
  CHECK(r->status == sp::Status::ok);
  // Half a SET, then nothing.
  sp::Request set;
  set.op = sp::Op::set;
  set.key = "half";
  set.value = std::string(1000, 'v');
  send_bytes(raw, sp::encode_request(set).substr(0, 100));
  CHECK(closed_by_server(raw));
  TcpStore client("127.0.0.1", server.port(), quick_options());
  CHECK_FALSE(client.check({"half"}));
}

// Lowers this process's soft RLIMIT_NOFILE (what a child started meanwhile inherits) and
// restores it.
struct SoftFdLimit {
  rlimit saved{};
  explicit SoftFdLimit(rlim_t soft) {
    REQUIRE(::getrlimit(RLIMIT_NOFILE, &saved) == 0);
    rlimit low = saved;
    low.rlim_cur = std::min(soft, saved.rlim_max);
    REQUIRE(::setrlimit(RLIMIT_NOFILE, &low) == 0);
  }
  ~SoftFdLimit() { ::setrlimit(RLIMIT_NOFILE, &saved); }
};

TEST_CASE("accel launch: a flood of idle connections to its store cannot stop a restart") {
  // The launcher runs under a soft limit of 256 descriptors (its store then serves 192
  // connections); 300 silent connections are opened to its store during the first attempt,
  // then a rank fails, and the restart needs new pipes for both workers.
  constexpr int kFlood = 300;
  rlimit mine{};
  REQUIRE(::getrlimit(RLIMIT_NOFILE, &mine) == 0);
  if (test::skip_unless(mine.rlim_max >= kFlood + 100,
                        "the hard RLIMIT_NOFILE is too low for a flood of " +
                            std::to_string(kFlood) + " connections"))
    return;
  test::TempDir dir("store_flood");
  const std::string store_file = dir / "store", go_file = dir / "go";
  // Attempt 0: rank 0 publishes the store's port and token, both wait for the flood, then
  // rank 0 fails. Attempt 1 succeeds.
  const std::string script =
      "d=$FLOOD_DIR; if [ \"$ACCEL_RESTART_COUNT\" = 0 ]; then"
      "  [ \"$RANK\" = 0 ] && echo \"$MASTER_PORT $ACCEL_STORE_TOKEN\" > $d/store.tmp"
      "  && mv $d/store.tmp $d/store;"
      "  while [ ! -e $d/go ]; do sleep 0.05; done;"
      "  [ \"$RANK\" = 0 ] && exit 3; exec sleep 600; "
      "fi; echo ok restart=$ACCEL_RESTART_COUNT";
  launch::GroupResult result;
  std::thread launcher;
  {
    SoftFdLimit low(256);
    launcher = std::thread([&] {
      result = test::run_accel(
          {"launch", "--num_processes", "2", "--main_process_port", "0", "--multi_cpu",
           "--max_restarts", "1", "--grace_period", "1", "sh", "-c", script},
          {{"FLOOD_DIR", dir.path.string()}});
    });
    // Back to this process's own limit once the launcher is running (it keeps the low one).
    const Deadline up = deadline_after(60s);
    while (!std::filesystem::exists(store_file) && SteadyClock::now() < up)
      std::this_thread::sleep_for(20ms);
  }
  int port = 0;
  std::string token;
  std::istringstream(test::read_file(store_file)) >> port >> token;
  if (port > 0) {
    std::vector<Socket> flood;
    for (int i = 0; i < kFlood; ++i) flood.push_back(raw_connect(port));
    // A rank's client still gets in (it is accepted after the whole flood, so by now the
    // store has taken or turned away every one of those).
    try {
      TcpStore rank("127.0.0.1", port, quick_options(token));
      rank.set("during-flood", "ok");
      CHECK(rank.get("during-flood", 1s) == "ok");
    } catch (const StoreError& e) {
      FAIL_CHECK("a rank's client could not use the flooded store: " << std::string(e.what()));
    }
    test::write_file(go_file, "");
  }
  launcher.join();
  const launch::WorkerExit& out = result.workers.at(0);
  INFO(out.output);
  REQUIRE(port > 0);
  CHECK(out.exit_code == 0);
  CHECK(contains(out.output, "rank 0 exited with code 3"));
  CHECK(contains(out.output, "restarting every worker (restart 1 of 1)"));
  CHECK(contains(out.output, "[rank 0] ok restart=1"));
  CHECK(contains(out.output, "[rank 1] ok restart=1"));
  CHECK(contains(out.output, "at the limit of 192 connections"));
  CHECK_FALSE(contains(out.output, "Too many open files"));
}

TEST_CASE("tcp store: 50 concurrent clients rendezvous") {
  TcpStoreServer server("127.0.0.1", 0);
  constexpr int kClients = 50;
  std::vector<std::string> all_keys;
  for (int i = 0; i < kClients; ++i) all_keys.push_back("rank/" + std::to_string(i));
  std::atomic<int> ok{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < kClients; ++i) {
    threads.emplace_back([&, i] {
      try {
        TcpStore s("127.0.0.1", server.port(), quick_options());
        s.set(all_keys[i], std::to_string(i));
        s.add("joined", 1);
        s.wait(all_keys, 10s);
        const int peer = (i + 1) % kClients;
        if (s.get(all_keys[peer], 1s) == std::to_string(peer)) ++ok;
      } catch (const std::exception& e) {
        MESSAGE("client " << i << ": " << e.what());
      }
    });
  }
  for (auto& t : threads) t.join();
  CHECK(ok.load() == kClients);
  TcpStore s("127.0.0.1", server.port(), quick_options());
  CHECK(s.get("joined", 1s) == std::to_string(kClients));
}

}  // namespace
}  // namespace accel
