// The built-in trackers (accelerate/trackers/tracker.hpp): what each writes for a run's
// configuration and two log calls, read back: CSV rows, JSONL objects (parsed by Python's json
// where /usr/bin/python3 is), TensorBoard scalars (read_event_file), MLflow's file store
// (meta.yaml, params/, metrics/ lines); an unknown name refused.
// And the Accelerator driving them: log_with's trackers and the loop's own under
// logging_dir/project_name, init_trackers / log / end_training, misuse and bad names refused.

#include <doctest/doctest.h>

#include <yaml-cpp/yaml.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "accelerate/accelerator.hpp"
#include "accelerate/trackers/tensorboard_events.hpp"
#include "accelerate/trackers/tracker.hpp"
#include "foundation/error.hpp"
#include "tests/support/files.hpp"
#include "tests/support/ranks.hpp"
#include "tests/support/verdicts.hpp"

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

TEST_CASE(
    "tensorboard: each logged value is a scalar event of its step, the configuration as hparams "
    "and text") {
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
  // The configuration: a Markdown table in the TEXT tab.
  REQUIRE(read.texts.size() == 1);
  CHECK(read.texts[0].tag == "config");
  CHECK(read.texts[0].text ==
        "| name | value |\n|---|---|\n| lr | 0.05 |\n| model | cnn, small |\n");
  // And as the hparams plugin's session (the HPARAMS tab): lr a number, model a string;
  // finish() ended the session as a success.
  CHECK(read.hparams == tensorboard::HParams{{"lr", "0.05"}, {"model", "cnn, small"}});
  CHECK(read.session_end_status == int(tensorboard::SessionStatus::kSuccess));
}

TEST_CASE("an unknown tracker is refused, naming the known ones") {
  TempDir dir("accel_trackers");
  CHECK_THROWS_WITH_AS(make_tracker("wandb", dir.file("run")),
                       doctest::Contains("unknown tracker 'wandb' (known: tensorboard, csv, jsonl"),
                       InvalidArgument);
  CHECK(builtin_trackers() == std::vector<std::string>{"tensorboard", "csv", "jsonl", "mlflow"});
}

namespace {
// A loop's own sink: remembers what it was given.
struct Recorder : GeneralTracker {
  std::string name() const override { return "recorder"; }
  void store_init_configuration(const TrackerConfig& c) override { config = c; }
  void log(const TrackerValues& v, std::int64_t step) override {
    for (const auto& [k, x] : v)
      logged.push_back(k + "@" + std::to_string(step) + "=" + std::to_string(x));
  }
  void finish() override { finished = true; }
  TrackerConfig config;
  std::vector<std::string> logged;
  bool finished = false;
};
}  // namespace

TEST_CASE("the Accelerator starts log_with's trackers and the loop's own under logging_dir") {
  TempDir dir("accel_trackers");
  auto recorder = std::make_shared<Recorder>();
  AcceleratorOptions options;
  options.communicator = "local";
  options.log_with = "csv,jsonl";
  options.project_dir = dir.file("project");
  options.trackers = {recorder};
  Accelerator acc(options);
  CHECK(acc.logging_dir() == dir.file("project"));  // logging_dir defaults to project_dir
  CHECK_THROWS_WITH_AS(acc.log({{"loss", 1.0}}, 0), doctest::Contains("call init_trackers"),
                       InvalidArgument);
  acc.init_trackers("run1", {{"lr", "0.1"}});
  CHECK(acc.tracker_names() == std::vector<std::string>{"csv", "jsonl", "recorder"});
  acc.log({{"loss", 0.5}}, 3);
  acc.end_training();
  CHECK(recorder->finished);
  CHECK(recorder->config == TrackerConfig{{"lr", "0.1"}});
  CHECK(recorder->logged == std::vector<std::string>{"loss@3=0.500000"});
  CHECK(read_file(dir.file("project/run1/metrics.csv")) == "step,name,value\n3,loss,0.5\n");
  CHECK(read_file(dir.file("project/run1/metrics.jsonl")) == "{\"step\": 3, \"loss\": 0.5}\n");
  CHECK_THROWS_WITH_AS(acc.log({{"loss", 1.0}}, 4), doctest::Contains("end_training() ended"),
                       InvalidArgument);
}

TEST_CASE("main process only unless asked: two real ranks, log_with csv and a per-rank tracker") {
  // trackers_worker: log_with csv (built-in: rank 0 only) and its own tracker whose
  // main_process_only() is false, writing run/rank<R>; each rank logs its rank at steps 0..2.
  TempDir dir("accel_trackers");
  const auto result = run_ranks(2, "trackers_worker", {"--project_dir", dir.file("project")});
  INFO(describe(result));
  REQUIRE(result.exit_code() == 0);
  const Verdicts verdicts(result);
  CHECK_VERDICT(verdicts, "the trackers this rank runs", 2);
  CHECK(verdicts.detail("the trackers this rank runs", 0) == "csv per_rank_csv");
  CHECK(verdicts.detail("the trackers this rank runs", 1) == "per_rank_csv");
  const std::string main_rows = "step,name,value\n0,rank,0\n1,rank,0\n2,rank,0\n";
  CHECK(read_file(dir.file("project/run/metrics.csv")) == main_rows);  // rank 0's values only
  CHECK(read_file(dir.file("project/run/rank0/metrics.csv")) == main_rows);
  CHECK(read_file(dir.file("project/run/rank1/metrics.csv")) ==
        "step,name,value\n0,rank,1\n1,rank,1\n2,rank,1\n");
  CHECK(read_file(dir.file("project/run/rank1/config.csv")) == "name,value\nworld,2\n");
}

TEST_CASE("log_with names what it does not know, as a config error") {
  AcceleratorOptions options;
  options.communicator = "local";
  options.log_with = "tensorboard,wandb";
  CHECK_THROWS_WITH(Accelerator{options}, doctest::Contains("key 'log_with': the wandb tracker "
                                                            "is not available"));
  options.log_with = "tensorbord";
  CHECK_THROWS_WITH(Accelerator{options}, doctest::Contains("'tensorbord' is not a tracker"));
}

TEST_CASE("mlflow: MLflow's file store layout, read back; a second run joins the experiment") {
  TempDir dir("accel_trackers");
  namespace fs = std::filesystem;
  {
    auto mlflow = make_tracker("mlflow", dir.file("fashion"));
    CHECK(mlflow->name() == "mlflow");
    run(*mlflow);
  }
  const fs::path store = dir.file("fashion/mlruns");
  // Experiment 0 is MLflow's Default; the project is experiment 1, named after it. Read as
  // MLflow reads them (YAML; ids and names are strings).
  CHECK(YAML::LoadFile((store / "0/meta.yaml").string())["name"].as<std::string>() == "Default");
  const YAML::Node experiment = YAML::LoadFile((store / "1/meta.yaml").string());
  CHECK(experiment["experiment_id"].as<std::string>() == "1");
  CHECK(experiment["name"].as<std::string>() == "fashion");
  CHECK(experiment["lifecycle_stage"].as<std::string>() == "active");
  CHECK(experiment["creation_time"].as<long long>() > 1600000000000LL);
  std::vector<fs::path> runs;
  for (const auto& e : fs::directory_iterator(store / "1"))
    if (e.is_directory()) runs.push_back(e.path());
  REQUIRE(runs.size() == 1);
  const fs::path run_dir = runs[0];
  const std::string run_id = run_dir.filename().string();
  CHECK(run_id.size() == 32);
  const YAML::Node meta = YAML::LoadFile((run_dir / "meta.yaml").string());
  CHECK(meta["run_id"].as<std::string>() == run_id);
  CHECK(meta["run_name"].as<std::string>() == run_id.substr(0, 8));
  CHECK(meta["experiment_id"].as<std::string>() == "1");
  CHECK(meta["status"].as<int>() == 3);  // FINISHED by finish()
  CHECK(meta["end_time"].as<long long>() >= meta["start_time"].as<long long>());
  CHECK(meta["tags"].IsSequence());
  CHECK(read_file((run_dir / "params/lr").string()) == "0.05");
  CHECK(read_file((run_dir / "params/model").string()) == "cnn, small");
  // metrics/<key>: "<timestamp ms> <value> <step>" per log call.
  const auto rows = [&](const std::string& key) {
    std::vector<std::pair<double, long>> out;
    std::istringstream in(read_file((run_dir / "metrics" / key).string()));
    long long stamp = 0;
    double value = 0;
    long step = 0;
    while (in >> stamp >> value >> step) {
      CHECK(stamp > 1600000000000LL);  // milliseconds since 1970
      out.emplace_back(value, step);
    }
    return out;
  };
  CHECK(rows("loss") == std::vector<std::pair<double, long>>{{0.5, 0}, {0.25, 1}});
  CHECK(rows("accuracy") == std::vector<std::pair<double, long>>{{1.0 / 3, 1}});
  // A second run of the project: the same experiment, another run.
  make_tracker("mlflow", dir.file("fashion"))->log({{"loss", 1.0}}, 0);
  std::size_t count = 0;
  for (const auto& e : fs::directory_iterator(store / "1")) count += e.is_directory();
  CHECK(count == 2);
  CHECK(!fs::exists(store / "2"));
}

TEST_CASE("mlflow: a project name YAML would read as something else stays its string") {
  TempDir dir("accel_trackers");
  namespace fs = std::filesystem;
  for (const std::string name : {"exp: 2", "2", "- list", "#hash", "it's"}) {
    CAPTURE(name);
    make_tracker("mlflow", dir.file(name))->log({{"loss", 1.0}}, 0);
    const fs::path store = dir.file(name + "/mlruns");
    const YAML::Node experiment = YAML::LoadFile((store / "1/meta.yaml").string());
    CHECK(experiment["name"].IsScalar());
    CHECK(experiment["name"].as<std::string>() == name);
    // The second run finds the experiment by that name again (no experiment 2).
    make_tracker("mlflow", dir.file(name))->log({{"loss", 1.0}}, 0);
    CHECK(!fs::exists(store / "2"));
  }
}
