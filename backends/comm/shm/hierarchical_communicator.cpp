#include "backends/comm/shm/hierarchical_communicator.hpp"

#include <algorithm>
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
  if (hosts_ > 1 && uniform_ && local_index_[rank()] > 0) {
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

Communicator* HierarchicalCommunicator::rail() const {
  if (hosts_ == 1 || !uniform_) return nullptr;
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

namespace {

// Staging layout for the rails, in elements: [local index l][host h][P], where P is the
// largest part; slot (l, h) holds the part of rank members_[h][l], zero-padded to P. Local
// rank l's share of a host reduce_scatter is then rail l's whole input, contiguous.
struct RailLayout {
  RailLayout(const Buffer& like, const Parts& parts, int locals, int hosts)
      : like(like),
        esize(element_size(like.dtype)),
        part(parts.largest()),
        locals(std::size_t(locals)),
        hosts(std::size_t(hosts)) {}
  std::size_t rail_count() const { return hosts * part; }  // one rail's elements
  std::size_t all_count() const { return locals * rail_count(); }
  std::size_t slot_offset(std::size_t l, std::size_t h) const {
    return (l * hosts + h) * part * esize;
  }
  Buffer view(char* p, std::size_t count) const {
    return Buffer{p, count, like.dtype, like.device};
  }

  Buffer like;
  std::size_t esize, part, locals, hosts;
};

}  // namespace

void HierarchicalCommunicator::rail_reduce_scatter(Buffer input, Buffer output, ReduceOp op,
                                                   const Parts& parts, Milliseconds timeout) {
  const RailLayout rails(input, parts, widest_host_, hosts_);
  if (rails.part == 0) return;  // every part empty, on every rank alike
  const std::size_t esize = rails.esize;
  char* const stage = scratch((rails.all_count() + rails.rail_count() + rails.part) * esize);
  char* const reduced = stage + rails.all_count() * esize;  // the host sum of this rank's rail
  // This rank's part, apart from the rail's input: MPI stages an overlapping output in memory
  // it allocates per call.
  char* const mine = reduced + rails.rail_count() * esize;
  for (std::size_t h = 0; h < rails.hosts; ++h)
    for (std::size_t l = 0; l < rails.locals; ++l) {
      const Shard s = parts[std::size_t(members_[h][l])];
      char* const slot = stage + rails.slot_offset(l, h);
      std::memcpy(slot, static_cast<const char*>(input.data) + s.offset * esize, s.count * esize);
      std::memset(slot + s.count * esize, 0, (rails.part - s.count) * esize);
    }
  const ReduceOp wire = wire_op(op);
  inner(local_->reduce_scatter(rails.view(stage, rails.all_count()),
                               rails.view(reduced, rails.rail_count()), wire),
        timeout, false);
  inner(rail()->reduce_scatter(rails.view(reduced, rails.rail_count()),
                               rails.view(mine, rails.part), wire),
        timeout, true);
  std::memcpy(output.data, mine, output.bytes());
  if (op == ReduceOp::avg) finish_average(output);
}

void HierarchicalCommunicator::rail_all_gather(Buffer input, Buffer output, const Parts& parts,
                                               Milliseconds timeout) {
  const RailLayout rails(output, parts, widest_host_, hosts_);
  if (rails.part == 0) return;  // every part empty, on every rank alike
  char* const stage = scratch(rails.all_count() * rails.esize);
  const std::size_t l = std::size_t(local_index_[rank()]);
  char* const my_rail = stage + rails.slot_offset(l, 0);
  char* const mine = stage + rails.slot_offset(l, std::size_t(host_));
  std::memcpy(mine, input.data, input.bytes());
  std::memset(mine + input.bytes(), 0, rails.part * rails.esize - input.bytes());
  // In place both times: each rank's input is its own slot of the output.
  inner(rail()->all_gather(rails.view(mine, rails.part), rails.view(my_rail, rails.rail_count())),
        timeout, true);
  inner(local_->all_gather(rails.view(my_rail, rails.rail_count()),
                           rails.view(stage, rails.all_count())),
        timeout, false);
  char* const out = static_cast<char*>(output.data);
  for (int r = 0; r < world_size(); ++r) {
    const Shard s = parts[std::size_t(r)];
    const char* const slot =
        stage + rails.slot_offset(std::size_t(local_index_[r]), std::size_t(host_of_[r]));
    std::memcpy(out + s.offset * rails.esize, slot, s.count * rails.esize);
  }
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
