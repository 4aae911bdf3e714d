#include "accelerate/trackers/tracker_set.hpp"

#include "foundation/error.hpp"

namespace accel {

void TrackerSet::init(bool main_process, const std::vector<std::string>& names,
                      const std::string& run_dir, std::vector<std::shared_ptr<GeneralTracker>> own,
                      const TrackerConfig& config) {
  ACCEL_CHECK_ARG(!started_, "init_trackers: the trackers were started already");
  started_ = true;
  if (!main_process) {
    for (auto& t : own)
      if (!t->main_process_only()) trackers_.push_back(std::move(t));
    for (const auto& t : trackers_) t->store_init_configuration(config);
    return;
  }
  for (const std::string& name : names) {
    bool present = false;
    for (const auto& t : trackers_) present = present || t->name() == name;
    if (!present) trackers_.push_back(make_tracker(name, run_dir));
  }
  for (auto& t : own) trackers_.push_back(std::move(t));
  for (const auto& t : trackers_) t->store_init_configuration(config);
}

void TrackerSet::log(const TrackerValues& values, std::int64_t step) {
  ACCEL_CHECK_ARG(started_, "log: call init_trackers(project_name, config) first");
  ACCEL_CHECK_ARG(!finished_, "log: end_training() ended the trackers already");
  for (const auto& t : trackers_) t->log(values, step);
}

void TrackerSet::finish() {
  if (finished_) return;
  finished_ = true;
  for (const auto& t : trackers_) t->finish();
}

std::vector<std::string> TrackerSet::names() const {
  std::vector<std::string> out;
  for (const auto& t : trackers_) out.push_back(t->name());
  return out;
}

}  // namespace accel
