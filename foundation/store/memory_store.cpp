#include "foundation/store/memory_store.hpp"

#include <algorithm>
#include <charconv>

#include "foundation/error.hpp"

namespace accel {

namespace {

using Clock = std::chrono::steady_clock;

std::string quoted_list(const std::vector<std::string>& keys) {
  std::string out;
  for (const auto& k : keys) out += (out.empty() ? "'" : ", '") + k + "'";
  return out;
}

// Waits on cv until pred holds, throwing TimeoutError(what()) once timeout has passed.
// Sleeps in bounded slices so an "infinite" timeout cannot overflow the clock arithmetic.
template <typename Pred, typename What>
void wait_for_keys(std::condition_variable& cv, std::unique_lock<std::mutex>& lock,
                   Milliseconds timeout, Pred pred, What what) {
  const auto start = Clock::now();
  const auto limit = std::max(timeout, Milliseconds::zero());
  while (!pred()) {
    const auto elapsed = Clock::now() - start;
    if (elapsed >= limit) throw TimeoutError(what());
    const auto left = std::chrono::duration_cast<Milliseconds>(limit - elapsed) + Milliseconds(1);
    cv.wait_for(lock, std::min<Milliseconds>(left, std::chrono::hours(1)));
  }
}

}  // namespace

void MemoryStore::set(const std::string& key, const std::string& value) {
  {
    std::lock_guard lock(mu_);
    map_[key] = value;
  }
  changed_.notify_all();
}

std::string MemoryStore::get(const std::string& key, Milliseconds timeout) {
  std::unique_lock lock(mu_);
  wait_for_keys(
      changed_, lock, timeout, [&] { return map_.count(key) != 0; },
      [&] {
        return "timed out after " + std::to_string(timeout.count()) + " ms waiting for key '" +
               key + "' in the in-process store";
      });
  return map_.at(key);
}

std::int64_t MemoryStore::add(const std::string& key, std::int64_t delta) {
  std::int64_t result = 0;
  {
    std::lock_guard lock(mu_);
    std::int64_t current = 0;
    auto it = map_.find(key);
    if (it != map_.end()) {
      const std::string& text = it->second;
      const char* end = text.data() + text.size();
      auto [ptr, ec] = std::from_chars(text.data(), end, current);
      if (text.empty() || ec != std::errc() || ptr != end)
        throw StoreError("add on key '" + key + "': its value (" + std::to_string(text.size()) +
                         " bytes) is not a decimal integer");
    }
    if (__builtin_add_overflow(current, delta, &result))
      throw StoreError("add on key '" + key + "': " + std::to_string(current) + " + " +
                       std::to_string(delta) + " overflows a 64-bit integer");
    map_[key] = std::to_string(result);
  }
  changed_.notify_all();
  return result;
}

std::string MemoryStore::compare_set(const std::string& key, const std::string& expected,
                                     const std::string& desired) {
  std::string result;
  bool stored = false;
  {
    std::lock_guard lock(mu_);
    auto it = map_.find(key);
    if (it == map_.end()) {
      if (expected.empty()) {
        map_.emplace(key, desired);
        result = desired;
        stored = true;
      } else {
        // torch's TCPStore answers an absent key with a non-empty expected by echoing
        // expected; callers comparing the result with desired see "not swapped" either way.
        result = expected;
      }
    } else if (it->second == expected) {
      it->second = desired;
      result = desired;
      stored = true;
    } else {
      result = it->second;
    }
  }
  if (stored) changed_.notify_all();
  return result;
}

void MemoryStore::wait(const std::vector<std::string>& keys, Milliseconds timeout) {
  std::unique_lock lock(mu_);
  wait_for_keys(
      changed_, lock, timeout, [&] { return missing_locked(keys).empty(); },
      [&] {
        return "timed out after " + std::to_string(timeout.count()) +
               " ms waiting for keys in the in-process store; missing: " +
               quoted_list(missing_locked(keys));
      });
}

bool MemoryStore::check(const std::vector<std::string>& keys) {
  std::lock_guard lock(mu_);
  return missing_locked(keys).empty();
}

bool MemoryStore::delete_key(const std::string& key) {
  std::lock_guard lock(mu_);
  return map_.erase(key) != 0;
}

std::optional<std::string> MemoryStore::try_get(const std::string& key) {
  std::lock_guard lock(mu_);
  auto it = map_.find(key);
  if (it == map_.end()) return std::nullopt;
  return it->second;
}

std::vector<std::string> MemoryStore::missing(const std::vector<std::string>& keys) {
  std::lock_guard lock(mu_);
  return missing_locked(keys);
}

std::size_t MemoryStore::num_keys() {
  std::lock_guard lock(mu_);
  return map_.size();
}

std::vector<std::string> MemoryStore::missing_locked(const std::vector<std::string>& keys) const {
  std::vector<std::string> out;
  for (const auto& k : keys)
    if (map_.count(k) == 0) out.push_back(k);
  return out;
}

}  // namespace accel
