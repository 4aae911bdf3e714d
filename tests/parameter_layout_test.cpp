// parameters.layout (accelerate/checkpointing/parameter_layout.hpp) in one process: the blobs a
// ZeRO job of any world size writes reassemble into the parameters, the text round-trips, the first
// format still reads, and what does not fit is reported naming the blob or the line.

#include <doctest/doctest.h>

#include <map>
#include <numeric>

#include "accelerate/checkpointing/checkpoint_manifest.hpp"
#include "accelerate/checkpointing/parameter_layout.hpp"

using namespace accel;

namespace {

// Three parameters in two groups, sizes that divide by no world size, one f64 among f32s (two
// flat buffers in group 0), and a buffer.
struct Model {
  std::vector<float> w = std::vector<float>(35), b = std::vector<float>(7);
  std::vector<double> s = std::vector<double>(5);
  std::vector<float> running = std::vector<float>(3);
  Model() {
    std::iota(w.begin(), w.end(), 1.0f);
    std::iota(b.begin(), b.end(), 100.0f);
    std::iota(s.begin(), s.end(), 200.0);
    std::iota(running.begin(), running.end(), 300.0f);
  }
  std::vector<ParamRef> params() {
    return {{"fc.weight", buffer_of(std::span(w)), {}, 0, {5, 7}},
            {"fc.bias", buffer_of(std::span(b)), {}, 1},
            {"scale", buffer_of(std::span(s)), {}, 0}};
  }
  std::vector<Buffer> buffers() { return {buffer_of(std::span(running))}; }
};

std::string join(const std::vector<std::span<const char>>& pieces) {
  std::string out;
  for (const auto& p : pieces) out.append(p.data(), p.size());
  return out;
}

template <typename T>
std::string bytes_of(const std::vector<T>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}

}  // namespace

TEST_CASE("slices written at any world size reassemble into the parameters") {
  Model m;
  const auto params = m.params();
  const auto buffers = m.buffers();
  for (const bool sharded : {false, true})
    for (int world : {1, 2, 3, 4, 8, 64}) {
      CAPTURE(sharded);
      CAPTURE(world);
      const ParameterLayout layout =
          describe_parameters(params, buffers, sharded ? "zero2" : "ddp", world, sharded);
      std::map<std::string, std::string> blobs;
      for (const std::string& blob : layout_blobs(layout))
        blobs[blob] = join(blob_pieces(layout, blob, params, buffers));
      if (sharded) CHECK(blobs[kParametersBlob] == bytes_of(m.running));
      // What is saved is read back through the text.
      const ParameterLayout read = parse_layout(format_layout(layout), "L");
      CHECK(format_layout(read) == format_layout(layout));
      CHECK(layout_difference(read, params, buffers) == "");
      const FullParameters full = reassemble_parameters(
          read, [&](const std::string& b) { return blobs.at(b); }, "DIR");
      REQUIRE(full.params.size() == 3);
      CHECK(full.params[0] == bytes_of(m.w));
      CHECK(full.params[1] == bytes_of(m.b));
      CHECK(full.params[2] == bytes_of(m.s));
      REQUIRE(full.buffers.size() == 1);
      CHECK(full.buffers[0] == bytes_of(m.running));
      CHECK(read.params[0].shape == std::vector<std::int64_t>{5, 7});
      CHECK(read.params[1].shape == std::vector<std::int64_t>{7});
    }
}

TEST_CASE("the first layout format (no shapes, values in parameter order) still reads") {
  Model m;
  const std::string text =
      "param 0 f32 35 fc.weight\nparam 1 f32 7 fc.bias\nparam 2 f64 5 scale\n"
      "buffer 0 f32 3\n";
  const ParameterLayout layout = parse_layout(text, "L");
  CHECK(layout.version == 1);
  CHECK(layout_difference(layout, m.params(), m.buffers()) == "");  // shapes not compared
  const std::string blob = bytes_of(m.w) + bytes_of(m.b) + bytes_of(m.s) + bytes_of(m.running);
  const FullParameters full = reassemble_parameters(
      layout, [&](const std::string&) { return blob; }, "DIR");
  CHECK(full.params[2] == bytes_of(m.s));
  CHECK(full.buffers[0] == bytes_of(m.running));
}

TEST_CASE("a layout or blob that does not fit is reported by name") {
  Model m;
  const auto params = m.params();
  const ParameterLayout layout = describe_parameters(params, m.buffers(), "zero2", 2, true);
  std::map<std::string, std::string> blobs;
  for (const std::string& blob : layout_blobs(layout))
    blobs[blob] = join(blob_pieces(layout, blob, params, m.buffers()));
  blobs["parameters.rank1"].pop_back();
  CHECK_THROWS_WITH_AS(reassemble_parameters(
                           layout, [&](const std::string& b) { return blobs.at(b); }, "DIR"),
                       doctest::Contains("DIR/parameters.rank1: "), CheckpointError);

  auto other = m.params();
  other[0].shape = {7, 5};
  CHECK(layout_difference(layout, other, m.buffers()) ==
        "the checkpoint has 'param 0 f32 35 fc.weight shape [5,7]', this job has 'param 0 f32 35 "
        "fc.weight shape [7,5]'");

  CHECK_THROWS_WITH_AS(parse_layout("layout 2\nflat 0 0 f32 4\nparam 0 f32 5 0 0 0 [5] x\n", "L"),
                       doctest::Contains("L: line 3"), CheckpointError);
  CHECK_THROWS_WITH_AS(parse_layout("layout 2\nflat 0 0 f32 4\nslice other 0 0 4\n", "L"),
                       doctest::Contains("not a parameters blob"), CheckpointError);
  const ParameterLayout gap =
      parse_layout("layout 2\nflat 0 0 f32 4\nslice parameters 0 0 3\n", "L");
  CHECK_THROWS_WITH_AS(
      reassemble_parameters(
          gap, [](const std::string&) { return std::string(12, '\0'); }, "DIR"),
      doctest::Contains(
          "DIR/parameters.layout: the slices cover 3 of the 4 elements of flat buffer 0"),
      CheckpointError);
}

TEST_CASE("a front end's buffer names and shapes and tied parameters' other names round-trip") {
  Model m;
  TensorNames names;
  names.buffers = {{"bn.running_mean", {3}}};
  names.aliases = {{0, "head.weight"}};
  names.modules = {"fc", "drop"};
  const ParameterLayout layout =
      describe_parameters(m.params(), m.buffers(), "zero3", 2, true, names);
  const std::string text = format_layout(layout);
  CHECK(text.find("buffer 0 f32 3 [3] bn.running_mean\n") != std::string::npos);
  CHECK(text.find("alias 0 head.weight\n") != std::string::npos);
  CHECK(text.find("module drop\n") != std::string::npos);
  const ParameterLayout read = parse_layout(text, "L");
  REQUIRE(read.buffers.size() == 1);
  CHECK(read.buffers[0].name == "bn.running_mean");
  CHECK(read.buffers[0].shape == std::vector<std::int64_t>{3});
  REQUIRE(read.aliases.size() == 1);
  CHECK(read.aliases[0].param == 0);
  CHECK(read.aliases[0].name == "head.weight");
  CHECK(read.modules == std::vector<std::string>{"fc", "drop"});
  CHECK(format_layout(read) == text);
  // Without names (the raw API) the records are as before.
  CHECK(format_layout(describe_parameters(m.params(), m.buffers(), "zero3", 2, true))
            .find("buffer 0 f32 3\n") != std::string::npos);
  names.buffers = {{"bn.running_mean", {2}}};
  CHECK_THROWS_WITH_AS(describe_parameters(m.params(), m.buffers(), "zero3", 2, true, names),
                       doctest::Contains("buffer 'bn.running_mean': shape [2]"), InvalidArgument);
  CHECK_THROWS_WITH_AS(parse_layout("layout 2\nflat 0 0 f32 4\nalias 0 x\n", "L"),
                       doctest::Contains("L: line 3"), CheckpointError);
  CHECK_THROWS_WITH_AS(parse_layout("layout 2\nbuffer 0 f32 3 [2] b\n", "L"),
                       doctest::Contains("the shape holding the count"), CheckpointError);
}
