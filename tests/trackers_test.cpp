// The built-in trackers (accelerate/trackers/tracker.hpp): what each writes for a run's
// configuration and two log calls, read back: CSV rows, JSONL objects (parsed by Python's json
// where /usr/bin/python3 is), TensorBoard scalars (read_event_file); an unknown name refused.

#include <doctest/doctest.h>

#include <cmath>
#include <cstdlib>
#include <string>

#include "accelerate/trackers/tensorboard_events.hpp"
#include "accelerate/trackers/tracker.hpp"
#include "core/error.hpp"
#include "tests/support/files.hpp"

using namespace accel;
using namespace accel::test;

namespace {
void run(GeneralTracker& tracker) {
  tracker.store_init_configuration({{"lr", "0.05"}, {"model", "cnn, small"}});
  tracker.log({{"loss", 0.5}, {"lr", 0.1}}, 0);
  tracker.log({{"loss", 0.25}, {"accuracy", 1.0 / 3}}, 1);
  tracker.finish();
}
}  // namespace

TEST_CASE("csv: metrics as step,name,value rows, exact values; the configuration quoted") {
  TempDir dir("accel_trackers");
  {
    auto csv = make_tracker("csv", dir.file("run"));
    CHECK(csv->name() == "csv");
    run(*csv);
  }
  CHECK(read_file(dir.file("run/metrics.csv")) ==
        "step,name,value\n0,loss,0.5\n0,lr,0.1\n1,loss,0.25\n1,accuracy,0.3333333333333333\n");
  CHECK(std::strtod("0.3333333333333333", nullptr) == 1.0 / 3);  // the shortest exact text
  CHECK(read_file(dir.file("run/config.csv")) == "name,value\nlr,0.05\nmodel,\"cnn, small\"\n");
  {
    auto again = make_tracker("csv", dir.file("run"));  // a resumed run appends, one header
    again->log({{"loss", 0.125}}, 2);
  }
  CHECK(read_file(dir.file("run/metrics.csv")).find("step,name,value\n", 1) == std::string::npos);
  CHECK(read_file(dir.file("run/metrics.csv")).find("\n2,loss,0.125\n") != std::string::npos);
}

TEST_CASE("jsonl: one object per log call; NaN as null; Python's json reads every line") {
  TempDir dir("accel_trackers");
  {
    auto jsonl = make_tracker("jsonl", dir.file("run"));
    run(*jsonl);
    jsonl->log({{"loss", std::nan("")}, {"with \"quote\"", 2}}, 2);
  }
  CHECK(read_file(dir.file("run/metrics.jsonl")) ==
        "{\"step\": 0, \"loss\": 0.5, \"lr\": 0.1}\n"
        "{\"step\": 1, \"loss\": 0.25, \"accuracy\": 0.3333333333333333}\n"
        "{\"step\": 2, \"loss\": null, \"with \\\"quote\\\"\": 2}\n");
  CHECK(read_file(dir.file("run/config.json")) ==
        "{\"lr\": \"0.05\", \"model\": \"cnn, small\"}\n");
  if (std::system("test -x /usr/bin/python3") == 0) {
    const std::string check =
        "/usr/bin/python3 -c \"import json,sys; "
        "[json.loads(l) for l in open(sys.argv[1])]; "
        "json.load(open(sys.argv[2]))\" " +
        dir.file("run/metrics.jsonl") + " " + dir.file("run/config.json");
    CHECK(std::system(check.c_str()) == 0);
  }
}

TEST_CASE("tensorboard: each logged value is a scalar event of its step") {
  TempDir dir("accel_trackers");
  {
    auto tb = make_tracker("tensorboard", dir.file("logs/project"));
    run(*tb);
  }
  std::string path;
  for (const auto& e : std::filesystem::directory_iterator(dir.file("logs/project")))
    path = e.path().string();
  const auto read = tensorboard::read_event_file(path);
  REQUIRE(read.scalars.size() == 4);
  CHECK(read.scalars[1].tag == "lr");
  CHECK(read.scalars[1].value == 0.1f);
  CHECK(read.scalars[3].tag == "accuracy");
  CHECK(read.scalars[3].step == 1);
}

TEST_CASE("an unknown tracker is refused, naming the known ones") {
  TempDir dir("accel_trackers");
  CHECK_THROWS_WITH_AS(make_tracker("wandb", dir.file("run")),
                       doctest::Contains("unknown tracker 'wandb' (known: tensorboard, csv, jsonl"),
                       InvalidArgument);
  CHECK(builtin_trackers() == std::vector<std::string>{"tensorboard", "csv", "jsonl"});
}
