#include "launch/heartbeat.hpp"

#include <cstdio>

namespace accel::launch {

using Clock = std::chrono::steady_clock;

Heartbeat::Heartbeat(StorePtr store, HeartbeatOptions options)
    : store_(std::move(store)), opt_(options), last_beat_(Clock::now()) {
  for (int m = 0; m < opt_.num_machines; ++m)
    if (m != opt_.machine_rank && (opt_.machine_rank == 0 || m == 0)) watched_.push_back(m);
  if (opt_.num_machines > 1) thread_ = std::thread([this] { run(); });
}

Heartbeat::~Heartbeat() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void Heartbeat::run() {
  std::unique_lock lock(mutex_);
  while (!stopping_) {
    lock.unlock();
    beat_and_watch();
    lock.lock();
    wake_.wait_for(lock, opt_.interval, [&] { return stopping_; });
  }
}

void Heartbeat::beat_and_watch() {
  const std::string me = alive_key(opt_.machine_rank);
  try {
    store_->add(me, 1);
    std::map<int, std::int64_t> values;
    for (int m : watched_) values[m] = store_->add(alive_key(m), 0);
    const auto now = Clock::now();
    std::lock_guard lock(mutex_);
    last_beat_ = now;
    for (const auto& [m, value] : values) {
      auto it = seen_.find(m);
      if (it == seen_.end() || it->second.value != value) seen_[m] = {value, now};
    }
  } catch (const std::exception& e) {
    // The request itself may have taken the whole limit (a cut link answers nothing).
    std::lock_guard lock(mutex_);
    if (!store_lost_ && Clock::now() - last_beat_ >= limit()) store_lost_ = e.what();
  }
}

std::string Heartbeat::limit_text() const {
  char text[32];
  std::snprintf(text, sizeof(text), "%g s", double(limit().count()) / 1000);
  return text;
}

std::optional<int> Heartbeat::lost(const std::vector<int>& among) const {
  std::lock_guard lock(mutex_);
  for (int m : among) {
    auto it = seen_.find(m);
    // A counter still at 0 belongs to a launcher not started yet: not lost, only late. Silence
    // is measured up to our own last look, so a thread of ours that was held up blames nobody.
    if (it != seen_.end() && it->second.value > 0 && last_beat_ - it->second.since > limit())
      return m;
  }
  return std::nullopt;
}

std::optional<std::string> Heartbeat::store_lost() const {
  std::lock_guard lock(mutex_);
  return store_lost_;
}

}  // namespace accel::launch
