#include "accelerate/process/rank_agreement.hpp"

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <cstring>
#include <span>

#include "backends/comm/host_collectives.hpp"

namespace accel {
namespace {

// FNV-1a, 64 bits: a fingerprint, not a defence (a rank is not an adversary).
std::uint64_t fnv1a(std::uint64_t h, const void* data, std::size_t bytes) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (std::size_t i = 0; i < bytes; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}
constexpr std::uint64_t kFnvBasis = 14695981039346656037ull;

std::int64_t item_hash(const AgreedValue& v) {
  std::uint64_t h = fnv1a(kFnvBasis, v.what.data(), v.what.size());
  h = fnv1a(h, "", 1);  // separates what from value
  return std::int64_t(fnv1a(h, v.value.data(), v.value.size()));
}

std::vector<std::int64_t> gather(Communicator& comm, std::vector<std::int64_t> local) {
  std::vector<std::int64_t> all(local.size() * std::size_t(comm.world_size()));
  all_gather_values(comm, buffer_of(std::span(local)), buffer_of(std::span(all)));
  return all;
}

// Every rank's `text`, through the communicator (lengths first, then the bytes in i64 words).
std::vector<std::string> gather_texts(Communicator& comm, const std::string& text) {
  const std::vector<std::int64_t> lengths = gather(comm, {std::int64_t(text.size())});
  std::size_t words = 0;
  for (std::int64_t n : lengths) words = std::max(words, (std::size_t(n) + 7) / 8);
  std::vector<std::int64_t> local(std::max<std::size_t>(words, 1), 0);
  std::memcpy(local.data(), text.data(), text.size());
  const std::vector<std::int64_t> all = gather(comm, local);
  std::vector<std::string> out;
  for (std::size_t r = 0; r < lengths.size(); ++r)
    out.emplace_back(reinterpret_cast<const char*>(all.data() + r * local.size()),
                     std::size_t(lengths[r]));
  return out;
}

// "what\0value" of item i, or "" when this rank has no item i.
std::string packed(const std::vector<AgreedValue>& values, std::size_t i) {
  if (i >= values.size()) return "";
  return values[i].what + '\0' + values[i].value;
}

std::string quoted_value(const std::string& packed_item) {
  return packed_item.substr(packed_item.find('\0') + 1);
}

}  // namespace

void check_ranks_agree(Communicator& comm, const std::vector<AgreedValue>& values,
                       const std::string& context) {
  std::vector<std::int64_t> hashes;
  std::uint64_t combined = kFnvBasis;
  for (const AgreedValue& v : values) {
    hashes.push_back(item_hash(v));
    combined = fnv1a(combined, &hashes.back(), sizeof(std::int64_t));
  }
  // Fixed size, whatever the values: safe to exchange before anything else agrees.
  const std::vector<std::int64_t> headers =
      gather(comm, {std::int64_t(values.size()), std::int64_t(combined)});
  const int world = comm.world_size();
  std::vector<int> differ;
  for (int r = 1; r < world; ++r)
    if (headers[2 * std::size_t(r)] != headers[0] || headers[2 * std::size_t(r) + 1] != headers[1])
      differ.push_back(r);
  if (differ.empty()) return;

  // Every rank knows the verdict and takes part in what follows: the per-item fingerprints
  // (padded to the longest list), then the first differing item's text from every rank.
  std::size_t longest = 0;
  for (int r = 0; r < world; ++r)
    longest = std::max(longest, std::size_t(headers[2 * std::size_t(r)]));
  std::vector<std::int64_t> mine(longest, 0);
  std::copy(hashes.begin(), hashes.end(), mine.begin());
  const std::vector<std::int64_t> all = gather(comm, mine);
  const int rank = differ.front();
  const auto count_of = [&](int r) { return std::size_t(headers[2 * std::size_t(r)]); };
  const auto hash_of = [&](int r, std::size_t i) { return all[std::size_t(r) * longest + i]; };
  std::size_t first = 0;
  while (first < std::min(count_of(0), count_of(rank)) && hash_of(0, first) == hash_of(rank, first))
    ++first;
  const std::vector<std::string> texts = gather_texts(comm, packed(values, first));
  const std::string& theirs = texts[std::size_t(rank)];
  const std::string& ours = texts[0];

  std::string message = context + ": rank " + std::to_string(rank) + ": ";
  if (theirs.empty()) {  // rank R's list ended (its count should have come first)
    message += ours.substr(0, ours.find('\0')) + " is missing, rank 0 has " + quoted_value(ours);
  } else {
    const std::string what = theirs.substr(0, theirs.find('\0'));
    message += what + " is " + quoted_value(theirs) + ", rank 0 has ";
    if (ours.empty())
      message += "none";
    else if (ours.substr(0, ours.find('\0')) != what)
      message += ours.substr(0, ours.find('\0')) + " " + quoted_value(ours);
    else
      message += quoted_value(ours);
  }
  if (differ.size() > 1) {
    message += " (ranks";
    for (std::size_t k = 0; k < differ.size(); ++k)
      message += (k ? ", " : " ") + std::to_string(differ[k]);
    message += " differ from rank 0)";
  }
  throw RankMismatchError(message);
}

std::string shape_text(const std::vector<std::int64_t>& shape) {
  std::string out = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) out += (i ? ", " : "") + std::to_string(shape[i]);
  return out + "]";
}

std::string exact_text(double value) {
  char buf[32];
  // A float widened to double (a loop's `float lr = 0.02f`) reads best as that float: "0.02",
  // not "0.019999999552965164"; still exact, since it reads back as the same value.
  const float narrow = float(value);
  const auto result = double(narrow) == value ? std::to_chars(buf, buf + sizeof(buf), narrow)
                                              : std::to_chars(buf, buf + sizeof(buf), value);
  return std::string(buf, result.ptr);
}

}  // namespace accel
