#include "backends/comm/shm/hierarchical_communicator.hpp"

#include <cstring>

#include "backends/comm/shm/shm_communicator.hpp"
#include "core/error.hpp"

namespace accel {

HierarchicalCommunicator::HierarchicalCommunicator(const CommOptions& options,
                                                   std::vector<int> host_of,
                                                   const Factory& make_between_hosts)
    : Communicator(options.rank, options.world_size, options.timeout),
      host_of_(std::move(host_of)) {
  ACCEL_CHECK_ARG(int(host_of_.size()) == world_size(), "hierarchical: one host per rank expected");
  local_index_.resize(world_size());
  for (int r = 0; r < world_size(); ++r) {
    const int h = host_of_[r];
    if (h >= int(members_.size())) members_.resize(h + 1);
    local_index_[r] = int(members_[h].size());
    members_[h].push_back(r);
  }
  hosts_ = int(members_.size());
  host_ = host_of_[rank()];
  for (const auto& m : members_) widest_host_ = std::max(widest_host_, int(m.size()));

  CommOptions local = options;
  local.rank = local_index_[rank()];
  local.world_size = int(members_[host_].size());
  local.group_name = options.group_name + "/host" + std::to_string(host_);
  local_ = std::make_unique<ShmCommunicator>(local);
  if (local_index_[rank()] == 0) {
    CommOptions leaders = options;
    leaders.rank = host_;
    leaders.world_size = hosts_;
    leaders.group_name = options.group_name + "/leaders";
    leaders_ = make_between_hosts(leaders);
  }
  if (hosts_ > 1) {
    CommOptions everyone = options;
    everyone.group_name = options.group_name + "/p2p";
    world_ = make_between_hosts(everyone);
  }
  set_inline_max_bytes(ShmCommunicator::kInlineBytes);
}

HierarchicalCommunicator::~HierarchicalCommunicator() { stop_worker(); }

void HierarchicalCommunicator::inner(const WorkPtr& work, Milliseconds timeout,
                                     bool between_hosts) const {
  const auto where = [&] {
    if (!between_hosts)
      return "inside host " + std::to_string(host_) + " (global ranks " +
             format_ranks(members_[host_]) + ")";
    std::vector<int> leaders;
    for (const auto& m : members_) leaders.push_back(m.front());
    return "between hosts (leaders: global ranks " + format_ranks(leaders) + ")";
  };
  try {
    work->wait(timeout + std::chrono::seconds(10));  // the inner operation times out first
  } catch (const TimeoutError& e) {
    throw TimeoutError(where() + ": " + e.what());
  } catch (const std::exception& e) {
    throw CommError(where() + ": " + e.what());
  }
}

void HierarchicalCommunicator::all_reduce_sum(Buffer data, ReduceOp wire, Milliseconds timeout) {
  inner(local_->all_reduce(data, wire), timeout, false);
  if (hosts_ == 1) return;
  if (leaders_) inner(leaders_->all_reduce(data, wire), timeout, true);
  inner(local_->broadcast(data, 0), timeout, false);
}

void HierarchicalCommunicator::run_all_reduce(Buffer data, ReduceOp op, Milliseconds timeout) {
  all_reduce_sum(data, wire_op(op), timeout);
  if (op == ReduceOp::avg) finish_average(data);
}

void HierarchicalCommunicator::run_reduce_scatter(Buffer input, Buffer output, ReduceOp op,
                                                  const std::vector<Shard>& parts,
                                                  Milliseconds timeout) {
  std::vector<char> copy(input.bytes());
  std::memcpy(copy.data(), input.data, copy.size());
  Buffer all{copy.data(), input.count, input.dtype, input.device};
  all_reduce_sum(all, wire_op(op), timeout);
  const Shard mine = parts[std::size_t(rank())];
  std::memcpy(output.data, copy.data() + mine.offset * element_size(input.dtype), output.bytes());
  if (op == ReduceOp::avg) finish_average(output);
}

void HierarchicalCommunicator::run_all_gather(Buffer input, Buffer output,
                                              const std::vector<Shard>& parts,
                                              Milliseconds timeout) {
  const std::size_t esize = element_size(output.dtype);
  std::size_t part = 0;  // the largest: every rank's part travels padded to it
  for (const Shard& s : parts) part = std::max(part, s.count);
  const std::size_t block = std::size_t(widest_host_) * part;  // one host's parts
  std::vector<char> blocks(std::size_t(hosts_) * block * esize), padded(part * esize);
  std::memcpy(padded.data(), input.data, input.bytes());
  const auto view = [&](char* p, std::size_t n) {
    return Buffer{p, n, output.dtype, output.device};
  };
  char* const mine = blocks.data() + std::size_t(host_) * block * esize;
  inner(local_->all_gather(view(padded.data(), part), view(mine, members_[host_].size() * part)),
        timeout, false);
  if (hosts_ > 1) {
    if (leaders_)
      inner(leaders_->all_gather(view(mine, block), view(blocks.data(), hosts_ * block)), timeout,
            true);
    inner(local_->broadcast(view(blocks.data(), hosts_ * block), 0), timeout, false);
  }
  char* const out = static_cast<char*>(output.data);
  for (int r = 0; r < world_size(); ++r) {
    const Shard s = parts[std::size_t(r)];
    const std::size_t at = (std::size_t(host_of_[r]) * block + local_index_[r] * part) * esize;
    std::memcpy(out + s.offset * esize, blocks.data() + at, s.count * esize);
  }
}

void HierarchicalCommunicator::run_broadcast(Buffer data, int root, Milliseconds timeout) {
  const int root_host = host_of_[root];
  if (host_ == root_host) inner(local_->broadcast(data, local_index_[root]), timeout, false);
  if (hosts_ == 1) return;
  if (leaders_) inner(leaders_->broadcast(data, root_host), timeout, true);
  if (host_ != root_host) inner(local_->broadcast(data, 0), timeout, false);
}

void HierarchicalCommunicator::run_barrier(Milliseconds timeout) {
  inner(local_->barrier(), timeout, false);
  if (hosts_ == 1) return;
  if (leaders_) inner(leaders_->barrier(), timeout, true);
  inner(local_->barrier(), timeout, false);
}

void HierarchicalCommunicator::run_send(Buffer data, int dst, std::uint32_t tag,
                                        Milliseconds timeout) {
  if (host_of_[dst] == host_)
    inner(local_->send(data, local_index_[dst], tag), timeout, false);
  else
    inner(world_->send(data, dst, tag), timeout, true);
}

void HierarchicalCommunicator::run_recv(Buffer data, int src, std::uint32_t tag,
                                        Milliseconds timeout) {
  if (host_of_[src] == host_)
    inner(local_->recv(data, local_index_[src], tag), timeout, false);
  else
    inner(world_->recv(data, src, tag), timeout, true);
}

}  // namespace accel
