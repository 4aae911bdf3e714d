#pragma once
// Experiment trackers (Accelerate's GeneralTracker and its log_with names): where a run's
// hyperparameters and metrics go. A tracker writes its own files under the run's directory
// (logging_dir/project_name); make_tracker builds the built-in ones by name:
//   tensorboard  TensorBoard event files (tensorboard_events.hpp): scalars per step; the
//                configuration as the hparams plugin's session and as a text table
//   csv          metrics.csv: "step,name,value" rows; config.csv: "name,value" rows
//   jsonl        metrics.jsonl: one {"step": S, "<name>": value, ...} object per log call;
//                config.json: the configuration as one object
//   mlflow       MLflow's file store, mlruns/ (`mlflow ui --backend-store-uri DIR/mlruns`):
//                the project an experiment, the run's params/<key> and metrics/<key> files
// Each log call is in the files when it returns (written, not buffered), so a killed run
// keeps everything logged before it. A user's own sink derives from GeneralTracker.

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace accel {

using TrackerValues = std::vector<std::pair<std::string, double>>;       // name, value
using TrackerConfig = std::vector<std::pair<std::string, std::string>>;  // name, value as text

class GeneralTracker {
 public:
  virtual ~GeneralTracker() = default;
  virtual std::string name() const = 0;
  // The run's hyperparameters, once, before the first log.
  virtual void store_init_configuration(const TrackerConfig& config) = 0;
  virtual void log(const TrackerValues& values, std::int64_t step) = 0;
  // The run ended (Accelerate's end_training): close what is open.
  virtual void finish() {}
  // As Accelerate's GeneralTracker.main_process_only: true (every built-in) means only the
  // main process holds it; a tracker returning false gets every call on every rank (e.g. a
  // per-rank timing log), and writes where it cannot collide with the other ranks.
  virtual bool main_process_only() const { return true; }
};

// The names make_tracker knows, in log_with's order ("all" means these).
const std::vector<std::string>& builtin_trackers();
// A built-in tracker writing under run_dir (created); InvalidArgument naming the known ones
// for another name.
std::unique_ptr<GeneralTracker> make_tracker(const std::string& name, const std::string& run_dir);

}  // namespace accel
