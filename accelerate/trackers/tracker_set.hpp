#pragma once
// The trackers of one run, as the Accelerator drives them (Accelerate's init_trackers, log,
// end_training): the config's log_with names built by make_tracker under
// logging_dir/project_name, plus the loop's own GeneralTrackers. Only the main process holds
// the built-in ones, and the loop's unless their main_process_only() is false; a rank holding
// none does nothing on each call, so a loop calls them on every rank.

#include <memory>
#include <string>
#include <vector>

#include "accelerate/trackers/tracker.hpp"

namespace accel {

class TrackerSet {
 public:
  // `names`: the built-in trackers to start (config::log_with_names of log_with).
  void init(bool main_process, const std::vector<std::string>& names, const std::string& run_dir,
            std::vector<std::shared_ptr<GeneralTracker>> own, const TrackerConfig& config);
  void log(const TrackerValues& values, std::int64_t step);
  void finish();  // each tracker's finish(), once; later logs are refused
  bool started() const { return started_; }
  // The trackers this process writes to, by name.
  std::vector<std::string> names() const;

 private:
  std::vector<std::shared_ptr<GeneralTracker>> trackers_;
  bool started_ = false, finished_ = false;
};

}  // namespace accel
