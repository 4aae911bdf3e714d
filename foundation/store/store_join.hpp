#pragma once
// How the ranks of a group meet on the rendezvous store before they build something that
// blocks without a timeout of its own (a Gloo context, a shared-memory segment, an MPI
// group): each announces itself under "<prefix><rank>" and waits for all the others, so a
// rank that never comes can be named.

#include <string>
#include <vector>

#include "foundation/store/store.hpp"
#include "foundation/timeout.hpp"

namespace accel {

// Announces `rank` and waits up to `timeout` for every rank of `world`. Returns the ranks
// that had not announced themselves by then (empty: the whole group is there).
std::vector<int> join_on_store(Store& store, const std::string& prefix, int rank, int world,
                               Milliseconds timeout);

}  // namespace accel
