#include "foundation/store/prefix_store.hpp"

#include "foundation/error.hpp"

namespace accel {

PrefixStore::PrefixStore(std::string prefix, StorePtr inner)
    : prefix_(std::move(prefix)), inner_(std::move(inner)) {
  ACCEL_CHECK_ARG(inner_ != nullptr, "PrefixStore '" + prefix_ + "': inner store is null");
  set_timeout(inner_->timeout());
}

void PrefixStore::set(const std::string& key, const std::string& value) {
  inner_->set(full(key), value);
}

std::string PrefixStore::get(const std::string& key, Milliseconds timeout) {
  return inner_->get(full(key), timeout);
}

std::int64_t PrefixStore::add(const std::string& key, std::int64_t delta) {
  return inner_->add(full(key), delta);
}

std::string PrefixStore::compare_set(const std::string& key, const std::string& expected,
                                     const std::string& desired) {
  return inner_->compare_set(full(key), expected, desired);
}

void PrefixStore::wait(const std::vector<std::string>& keys, Milliseconds timeout) {
  inner_->wait(full(keys), timeout);
}

bool PrefixStore::check(const std::vector<std::string>& keys) { return inner_->check(full(keys)); }

bool PrefixStore::delete_key(const std::string& key) { return inner_->delete_key(full(key)); }

std::vector<std::string> PrefixStore::full(const std::vector<std::string>& keys) const {
  std::vector<std::string> out;
  out.reserve(keys.size());
  for (const auto& k : keys) out.push_back(full(k));
  return out;
}

}  // namespace accel
