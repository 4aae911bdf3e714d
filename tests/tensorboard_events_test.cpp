// TensorBoard event files (accelerate/trackers/tensorboard_events.hpp): the CRC-32C check
// value, one scalar Event's bytes derived by hand from the protobuf wire format, a file
// written and read back with every CRC checked, a damaged byte named, and a writer killed
// while writing leaving a file readable up to its last complete record; Google's protobuf
// decoding the same file, where Debian's python3-protobuf is installed.

#include <doctest/doctest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include "accelerate/trackers/tensorboard_events.hpp"
#include "foundation/error.hpp"
#include "tests/support/files.hpp"
#include "tests/support/skip.hpp"

using namespace accel;
using namespace accel::test;
namespace tb = accel::tensorboard;

namespace {
std::string only_file_in(const std::string& dir) {
  std::string found;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    CHECK(found.empty());
    found = e.path().string();
  }
  return found;
}
}  // namespace

TEST_CASE("CRC-32C has its check value; the TFRecord mask is applied") {
  CHECK(tb::crc32c("123456789") == 0xE3069283u);
  CHECK(tb::crc32c("") == 0u);
  const std::uint32_t c = tb::crc32c("123456789");
  CHECK(tb::masked_crc32c("123456789") == ((c >> 15) | (c << 17)) + 0xa282ead8u);
}

TEST_CASE("one scalar Event is the bytes the protobuf wire format gives") {
  // Event {wall_time (1, fixed64) 1.5, step (2, varint) 3, summary (5, bytes) {value (1,
  // bytes) {tag (1, bytes) "loss", simple_value (2, fixed32) 0.25f}}}: keys are
  // field << 3 | wire type; 1.5 is 0x3FF8000000000000 and 0.25f 0x3E800000, little-endian.
  const unsigned char expected[] = {0x09, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0xF8, 0x3F,  // 1
                                    0x10, 0x03,                                            // 2
                                    0x2A, 0x0D,                                            // 5
                                    0x0A, 0x0B,                                            // value
                                    0x0A, 0x04, 'l',  'o',  's',  's',                     // tag
                                    0x15, 0x00, 0x00, 0x80, 0x3E};                         // 0.25
  CHECK(tb::scalar_event(1.5, 3, "loss", 0.25f) ==
        std::string(reinterpret_cast<const char*>(expected), sizeof expected));
  // The record: the length, its masked CRC, the bytes, theirs.
  const std::string event = tb::scalar_event(1.5, 3, "loss", 0.25f);
  const std::string record = tb::frame_record(event);
  REQUIRE(record.size() == 8 + 4 + event.size() + 4);
  CHECK(record.substr(0, 8) == std::string("\x1a\0\0\0\0\0\0\0", 8));
  CHECK(record.substr(12, event.size()) == event);
}

TEST_CASE("an event file written is read back with every CRC checked; damage is named") {
  TempDir dir("accel_tb");
  const std::string logs = dir.file("logs/run");
  std::string path;
  {
    tb::EventFileWriter writer(logs);  // creates the directories
    path = writer.path();
    writer.add_scalar("loss", 0.5f, 0);
    writer.add_scalar("loss", 0.25f, 1);
    writer.add_scalar("accuracy", 0.875f, 1);
  }
  CHECK(only_file_in(logs) == path);
  const std::string name = std::filesystem::path(path).filename().string();
  CHECK(name.rfind("events.out.tfevents.", 0) == 0);
  CHECK(name.find("." + std::to_string(::getpid()) + ".") != std::string::npos);
  const tb::EventFileContents read = tb::read_event_file(path);
  CHECK(read.file_version == "brain.Event:2");
  CHECK_FALSE(read.truncated_tail);
  REQUIRE(read.scalars.size() == 3);
  CHECK(read.scalars[0].tag == "loss");
  CHECK(read.scalars[0].value == 0.5f);
  CHECK(read.scalars[1].step == 1);
  CHECK(read.scalars[2].tag == "accuracy");
  CHECK(read.scalars[2].value == 0.875f);
  CHECK(read.scalars[2].wall_time > 1.6e9);  // seconds since 1970

  // One byte of the second record's event changed: its CRC names the file and the offset.
  std::string bytes = read_file(path);
  const std::size_t first = 12 + tb::version_event(0).size() + 4;
  bytes[first + 12 + 3] ^= 0x40;
  write_file(path, bytes);
  const std::string expected =
      path + " at byte " + std::to_string(first) + ": the event's CRC-32C does not match";
  CHECK_THROWS_WITH_AS(tb::read_event_file(path), doctest::Contains(expected.c_str()), Error);
}

TEST_CASE("Google's protobuf decodes the file as TensorBoard's Event messages") {
  // tests/support/decode_tfevents.py builds Event, Summary and Summary.Value from descriptors
  // with Debian's python3-protobuf (scripts/setup.sh installs it) and prints what it decodes.
  const bool have = std::system("/usr/bin/python3 -c 'import google.protobuf' 2>/dev/null") == 0;
  if (skip_unless(have, "/usr/bin/python3 with google.protobuf (python3-protobuf) not found"))
    return;
  TempDir dir("accel_tb_protobuf");
  std::string path;
  {
    tb::EventFileWriter writer(dir.file("run"));
    path = writer.path();
    writer.add_scalar("loss", 0.5f, 0);
    writer.add_scalar("train/accuracy", 0.75f, 300);
    writer.add_text("config", "| lr | 0.1 |", 0);
    writer.add_hparams_start({{"lr", "0.05"}, {"model", "cnn, small"}, {"amp", "true"}});
    writer.add_hparams_end(tb::SessionStatus::kSuccess);
  }
  const std::string out = dir.file("decoded.txt");
  const std::string command = std::string("/usr/bin/python3 ") + ACCEL_SOURCE_DIR +
                              "/tests/support/decode_tfevents.py " + path + " > " + out;
  REQUIRE(std::system(command.c_str()) == 0);
  CHECK(read_file(out) ==
        "file_version brain.Event:2\n"
        "0 loss 0.5\n"
        "300 train/accuracy 0.75\n"
        "0 config text:text:7:'| lr | 0.1 |'\n"  // the text plugin, DT_STRING
        "0 _hparams_/session_start_info hparams start lr=number:0.05 "
        "model=string:'cnn, small' amp=bool:True\n"
        "0 _hparams_/session_end_info hparams end status=1\n");
  // Our reader sees the same hyperparameters.
  const auto read = tb::read_event_file(path);
  CHECK(read.hparams == tb::HParams{{"lr", "0.05"}, {"model", "cnn, small"}, {"amp", "true"}});
  CHECK(read.session_end_status == 1);
}

TEST_CASE("a writer killed while writing leaves a file readable up to its last record") {
  TempDir dir("accel_tb_kill");
  const std::string logs = dir.file("run");
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {  // writes until killed
    try {
      tb::EventFileWriter writer(logs);
      for (std::int64_t step = 0;; ++step) writer.add_scalar("loss", float(step), step);
    } catch (...) {
    }
    ::_exit(3);
  }
  // Until the file holds a few thousand records, then SIGKILL at an arbitrary moment.
  for (int i = 0; i < 2000; ++i) {
    std::error_code ec;
    if (std::filesystem::exists(logs, ec) && !std::filesystem::is_empty(logs, ec) &&
        std::filesystem::file_size(only_file_in(logs), ec) > 200000)
      break;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ::kill(child, SIGKILL);
  int status = 0;
  ::waitpid(child, &status, 0);
  CHECK(WIFSIGNALED(status));
  const std::string path = only_file_in(logs);
  const tb::EventFileContents read = tb::read_event_file(path);
  REQUIRE(read.scalars.size() > 100);
  for (std::size_t i = 0; i < read.scalars.size(); ++i)
    CHECK(read.scalars[i].step == std::int64_t(i));  // every complete record, in order

  // A record cut short (as a crash inside write() can leave): read up to the one before.
  const std::string bytes = read_file(path);
  const std::size_t cut = bytes.size() - 5;
  write_file(path, bytes.substr(0, cut));
  const tb::EventFileContents cut_read = tb::read_event_file(path);
  CHECK(cut_read.truncated_tail);
  CHECK(cut_read.scalars.size() + 1 >= read.scalars.size());
  CHECK(cut_read.scalars.size() <= read.scalars.size());
}
