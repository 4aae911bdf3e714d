// One rank of trackers_test's real job: the Accelerator with log_with csv (the main process
// only, as every built-in tracker) and the loop's own tracker that asks for every process
// (main_process_only() false), a CSV of its own under run_dir/rank<R>. Each rank logs its
// rank at steps 0..2, then gives the verdict "the trackers this rank runs": the built-in csv on
// rank 0 only, its own tracker on every rank (detail: the names, in order).
//   trackers_worker --project_dir DIR
// Exit 0 when the verdict passed, 1 when it failed, 2 with the error on stderr.

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "accelerate/accelerator.hpp"
#include "tests/support/worker.hpp"

using namespace accel;

namespace {

// A user's sink on every rank, as Accelerate's GeneralTracker with main_process_only False.
class PerRankCsv final : public GeneralTracker {
 public:
  explicit PerRankCsv(const std::string& dir) : csv_(make_tracker("csv", dir)) {}
  std::string name() const override { return "per_rank_csv"; }
  bool main_process_only() const override { return false; }
  void store_init_configuration(const TrackerConfig& c) override {
    csv_->store_init_configuration(c);
  }
  void log(const TrackerValues& v, std::int64_t step) override { csv_->log(v, step); }
  void finish() override { csv_->finish(); }

 private:
  std::unique_ptr<GeneralTracker> csv_;
};

}  // namespace

int main(int argc, char** argv) {
  try {
    const test::WorkerFlags flags(argc, argv);
    flags.only({"project_dir"});
    const std::string project = flags.text("project_dir");
    if (project.empty()) throw InvalidArgument("usage: trackers_worker --project_dir DIR");
    AcceleratorOptions options;
    options.log_with = "csv";
    options.project_dir = project;
    const std::string rank = std::getenv("RANK") ? std::getenv("RANK") : "0";
    options.trackers = {std::make_shared<PerRankCsv>(project + "/run/rank" + rank)};
    Accelerator acc(options);
    acc.init_trackers("run", {{"world", std::to_string(acc.num_processes())}});
    for (int step = 0; step < 3; ++step) acc.log({{"rank", double(acc.process_index())}}, step);
    acc.end_training();
    std::string names;
    for (const std::string& n : acc.tracker_names()) names += (names.empty() ? "" : " ") + n;
    const std::string expected = acc.is_main_process() ? "csv per_rank_csv" : "per_rank_csv";
    test::VerdictLog verdicts(acc.process_index());
    verdicts.check(names == expected, "the trackers this rank runs", names);
    return verdicts.exit_code();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "trackers_worker: %s\n", e.what());
    return 2;
  }
}
