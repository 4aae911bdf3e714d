#include "backends/comm/shm/hierarchical_communicator.hpp"

#include <algorithm>
#include <cstring>

#include "backends/comm/shm/shm_communicator.hpp"
#include "foundation/error.hpp"

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
  // The l-th rank of every host, in host order.
  const auto rail_members = [&](int l) {
    std::vector<int> ranks;
    for (const auto& m : members_) ranks.push_back(m[std::size_t(l)]);
    return ranks;
  };
  if (local_index_[rank()] == 0) {
    CommOptions leaders = options;
    leaders.rank = host_;
    leaders.world_size = hosts_;
    leaders.group_name = options.group_name + "/leaders";
    leaders_ = make_between_hosts(leaders, rail_members(0));
  }
  if (hosts_ > 1) {
    CommOptions everyone = options;
    everyone.group_name = options.group_name + "/p2p";
    std::vector<int> all;
    for (int r = 0; r < world_size(); ++r) all.push_back(r);
    world_ = make_between_hosts(everyone, all);
  }
  uniform_ = std::all_of(members_.begin(), members_.end(),
                         [&](const std::vector<int>& m) { return int(m.size()) == widest_host_; });
  if (hosts_ > 1 && uniform_) runs_ = host_runs();
  if (!runs_.empty() && local_index_[rank()] > 0) {
    CommOptions rail = options;
    rail.rank = host_;
    rail.world_size = hosts_;
    rail.group_name = options.group_name + "/rail" + std::to_string(local_index_[rank()]);
    rail_ = make_between_hosts(rail, rail_members(local_index_[rank()]));
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

std::uint64_t HierarchicalCommunicator::between_hosts_bytes() const {
  std::uint64_t bytes = 0;
  for (const CommunicatorPtr* c : {&leaders_, &rail_, &world_})
    if (*c) bytes += (*c)->bus_bytes();
  return bytes;
}

std::string_view HierarchicalCommunicator::between_hosts_backend() const {
  return world_ ? world_->backend_name() : std::string_view();
}

std::vector<HierarchicalCommunicator::HostRun> HierarchicalCommunicator::host_runs() const {
  const int locals = widest_host_;
  // Whether hosts [first, first + k) number their ranks local index first, from their first.
  const auto fits = [&](int first, int k) {
    const int base = members_[first].front();
    for (int h = first; h < first + k; ++h)
      for (int j = 0; j < locals; ++j)
        if (members_[h][std::size_t(j)] != base + j * k + (h - first)) return false;
    return true;
  };
  std::vector<HostRun> runs;
  for (int first = 0; first < hosts_;) {
    int k = hosts_ - first;
    while (k > 0 && !fits(first, k)) --k;
    if (k == 0) return {};
    runs.push_back({first, k, members_[first].front()});
    first += k;
  }
  return runs;
}

Communicator* HierarchicalCommunicator::rail() const {
  if (runs_.empty()) return nullptr;
  return local_index_[rank()] == 0 ? leaders_.get() : rail_.get();
}

char* HierarchicalCommunicator::scratch(std::size_t bytes) {
  if (scratch_.size() < bytes) scratch_.resize(bytes);
  return scratch_.data();
}

void HierarchicalCommunicator::run_reduce_scatter(Buffer input, Buffer output, ReduceOp op,
                                                  const Parts& parts, Milliseconds timeout) {
  if (hosts_ == 1) {
    inner(local_->reduce_scatter(input, output, op, parts.counts()), timeout, false);
    return;
  }
  if (rail()) {
    rail_reduce_scatter(input, output, op, parts, timeout);
    return;
  }
  const std::size_t bytes = input.bytes();
  char* const copy = scratch(bytes);
  std::memcpy(copy, input.data, bytes);
  Buffer all{copy, input.count, input.dtype, input.device};
  all_reduce_sum(all, wire_op(op), timeout);
  const Shard mine = parts[std::size_t(rank())];
  std::memcpy(output.data, copy + mine.offset * element_size(input.dtype), output.bytes());
  if (op == ReduceOp::avg) finish_average(output);
}

HierarchicalCommunicator::RailBuffer HierarchicalCommunicator::rail_buffer(const Parts& parts,
                                                                           const Buffer& like) {
  const std::size_t l = std::size_t(local_index_[rank()]);
  RailBuffer rail;
  std::size_t total = 0;
  for (const auto& m : members_) {
    rail.counts.push_back(parts[std::size_t(m[l])].count);
    total += rail.counts.back();
  }
  char* const data = scratch(std::max<std::size_t>(total, 1) * element_size(like.dtype));
  rail.data = Buffer{data, total, like.dtype, like.device};
  return rail;
}

template <typename Visit>
void HierarchicalCommunicator::for_each_run(const Parts& parts, Buffer data, Buffer rail,
                                            Visit visit) const {
  const std::size_t l = std::size_t(local_index_[rank()]);
  std::size_t at = 0;  // elements of `rail` before this run's piece
  for (const HostRun& run : runs_) {
    // Local rank j's share: the parts of the run's hosts' j-th ranks, contiguous in `data`.
    std::vector<std::size_t> counts(std::size_t(widest_host_), 0);
    for (int h = run.first_host; h < run.first_host + run.hosts; ++h)
      for (int j = 0; j < widest_host_; ++j)
        counts[std::size_t(j)] += parts[std::size_t(members_[h][std::size_t(j)])].count;
    std::size_t count = 0;
    for (std::size_t c : counts) count += c;
    visit(data.slice(parts[std::size_t(run.first_rank)].offset, count), rail.slice(at, counts[l]),
          counts);
    at += counts[l];
  }
}

void HierarchicalCommunicator::rail_reduce_scatter(Buffer input, Buffer output, ReduceOp op,
                                                   const Parts& parts, Milliseconds timeout) {
  if (parts.largest() == 0) return;  // every part empty, on every rank alike
  // Filled with the host sums of the rail's parts, run by run: the rail's reduce_scatter input.
  const RailBuffer sums = rail_buffer(parts, input);
  const ReduceOp wire = wire_op(op);
  for_each_run(parts, input, sums.data,
               [&](Buffer region, Buffer mine, const std::vector<std::size_t>& counts) {
                 inner(local_->reduce_scatter(region, mine, wire, counts), timeout, false);
               });
  inner(rail()->reduce_scatter(sums.data, output, wire, sums.counts), timeout, true);
  if (op == ReduceOp::avg) finish_average(output);
}

void HierarchicalCommunicator::rail_all_gather(Buffer input, Buffer output, const Parts& parts,
                                               Milliseconds timeout) {
  if (parts.largest() == 0) return;  // every part empty, on every rank alike
  // The rail's parts gathered: what this rank gives each run's host all_gather.
  const RailBuffer gathered = rail_buffer(parts, output);
  inner(rail()->all_gather(input, gathered.data, gathered.counts), timeout, true);
  for_each_run(parts, output, gathered.data,
               [&](Buffer region, Buffer mine, const std::vector<std::size_t>& counts) {
                 inner(local_->all_gather(mine, region, counts), timeout, false);
               });
}

void HierarchicalCommunicator::run_all_gather(Buffer input, Buffer output, const Parts& parts,
                                              Milliseconds timeout) {
  if (hosts_ == 1) {
    inner(local_->all_gather(input, output, parts.counts()), timeout, false);
  } else if (rail()) {
    rail_all_gather(input, output, parts, timeout);
  } else {
    leaders_all_gather(input, output, parts, timeout);
  }
}

void HierarchicalCommunicator::leaders_all_gather(Buffer input, Buffer output, const Parts& parts,
                                                  Milliseconds timeout) {
  const std::size_t esize = element_size(output.dtype);
  const std::size_t part = parts.largest();
  const std::size_t block = std::size_t(widest_host_) * part;  // one host's parts
  char* const blocks = scratch((std::size_t(hosts_) * block + part) * esize);
  char* const padded = blocks + std::size_t(hosts_) * block * esize;
  std::memcpy(padded, input.data, input.bytes());
  const auto view = [&](char* p, std::size_t n) {
    return Buffer{p, n, output.dtype, output.device};
  };
  char* const mine = blocks + std::size_t(host_) * block * esize;
  inner(local_->all_gather(view(padded, part), view(mine, members_[host_].size() * part)), timeout,
        false);
  if (leaders_)
    inner(leaders_->all_gather(view(mine, block), view(blocks, hosts_ * block)), timeout, true);
  inner(local_->broadcast(view(blocks, hosts_ * block), 0), timeout, false);
  char* const out = static_cast<char*>(output.data);
  for (int r = 0; r < world_size(); ++r) {
    const Shard s = parts[std::size_t(r)];
    const std::size_t at = (std::size_t(host_of_[r]) * block + local_index_[r] * part) * esize;
    std::memcpy(out + s.offset * esize, blocks + at, s.count * esize);
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
