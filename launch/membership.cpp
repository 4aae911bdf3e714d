#include "launch/membership.hpp"

#include "foundation/process_group_records.hpp"

namespace accel::launch {

namespace records = process_group_records;

MembershipWatch::MembershipWatch(StorePtr store, int attempt)
    : store_(std::move(store)),
      attempt_(attempt),
      ended_key_("launcher/" + std::to_string(attempt) + "/ended_early") {}

std::string MembershipWatch::worker_key(const std::string& key) const {
  return records::attempt_prefix(attempt_) + "/" + key;
}

void MembershipWatch::ended(int rank, const std::string& label) {
  if (store_->check({worker_key(records::left_key(rank))})) return;  // left as planned
  const bool joined = store_->check({worker_key(records::joined_key(rank))});
  store_->compare_set(ended_key_, "",
                      std::to_string(rank) + "|" + (joined ? "1" : "0") + "|" + label);
}

std::optional<std::string> MembershipWatch::stranded() {
  if (!ended_) {
    if (!store_->check({ended_key_})) return std::nullopt;
    ended_ = store_->get(ended_key_);
  }
  const auto a = ended_->find('|'), b = ended_->find('|', a + 1);
  const bool joined = ended_->substr(a + 1, b - a - 1) == "1";
  const std::string label = ended_->substr(b + 1);
  const std::int64_t others = store_->add(worker_key(records::kJoinedCount), 0) - (joined ? 1 : 0);
  if (others <= 0) return std::nullopt;
  return label + " exited with code 0 " +
         (joined ? std::string("without leaving the process group (it was not destroyed)")
                 : std::string("before joining the process group")) +
         " while other ranks " + (joined ? "are in it" : "joined it") +
         "; they would wait for it until the timeout";
}

}  // namespace accel::launch
