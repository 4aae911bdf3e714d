#pragma once
// What each rank records about its process group in the rendezvous store, for the other ranks
// and for `accel launch`: which communicator it joins with (the first one recorded is the
// job's; a rank asking for another fails at once instead of waiting in a rendezvous nobody
// else enters), that it joined, and that it left (its process group was destroyed). The
// launcher reads them to tell a rank that ended as planned from one the others still wait for.
// Header-only: the launcher reads the keys without linking the front end.

#include <string>

namespace accel::process_group_records {

// Under `accel launch`, attempt N's keys (the workers' and these) live under this prefix.
inline std::string attempt_prefix(int attempt) { return "attempt/" + std::to_string(attempt); }

// "<backend>|<rank>": the communicator the first rank to join chose for the `call`-th process
// group its process made (one process may make several, each of its own communicator).
inline std::string communicator_key(int call, const std::string& group) {
  return "process_group/" + std::to_string(call) + "/" + group + "/communicator";
}
inline std::string joined_key(int rank) { return "process_group/joined/" + std::to_string(rank); }
inline constexpr const char* kJoinedCount = "process_group/joined_count";
inline std::string left_key(int rank) { return "process_group/exited/" + std::to_string(rank); }

}  // namespace accel::process_group_records
