#pragma once
// Whether a rank that ended left the others waiting for it. A rank that exits 0 is done as
// planned when it never joined a process group nobody else joined either (`sh -c 'echo hi'`),
// or when it left its process group (destroyed it) before exiting. The rule: a rank that ended
// without leaving (it never joined, or it joined and did not leave) while another rank of the
// job joined ends the job, since that rank would wait for it until the timeout. The workers'
// records are in process_group_records.hpp; the first rank ending so is published under
// launcher/<attempt>/ended_early, so the launcher of whichever machine still runs ranks sees it.

#include <optional>
#include <string>

#include "foundation/store/store.hpp"

namespace accel::launch {

class MembershipWatch {
 public:
  MembershipWatch(StorePtr store, int attempt);

  // Rank `rank` (`label` in reports) exited with code 0; records it when it did not leave.
  void ended(int rank, const std::string& label);

  // Asked every monitor interval: the failure text once a rank ended without leaving and
  // another rank joined.
  std::optional<std::string> stranded();

 private:
  std::string worker_key(const std::string& key) const;

  StorePtr store_;
  int attempt_ = 0;
  std::string ended_key_;
  std::optional<std::string> ended_;  // "<rank>|<joined 0/1>|<label>", once seen
};

}  // namespace accel::launch
