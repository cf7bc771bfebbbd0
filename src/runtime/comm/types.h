// Vocabulary shared by the ICI and DCN transports and the collectives built
// on them: element types, reductions, how an array is split between the
// members of a group, and per-device traffic counters.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include "common/dtype.h"
#include "common/status.h"

namespace multislice::comm {

using ::multislice::DType;
using ::multislice::Name;
using ::multislice::SizeOf;

enum class ReduceOp { kSum, kMax, kMin };
inline std::string_view Name(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return "sum";
    case ReduceOp::kMax:
      return "max";
    case ReduceOp::kMin:
      return "min";
  }
  return "?";
}

// A run of elements of an array: [offset, offset + count), in elements.
struct Segment {
  size_t offset = 0;
  size_t count = 0;
};

// The balanced split of `count` elements over `parts` members used by every
// collective: member r gets count / parts elements, plus one when
// r < count % parts, in member order. Counts that do not divide evenly are
// therefore allowed everywhere.
inline Segment PartitionSegment(size_t count, int parts, int r) {
  const size_t base = count / parts, extra = count % parts;
  const size_t ur = static_cast<size_t>(r);
  return Segment{ur * base + (ur < extra ? ur : extra),
                 base + (ur < extra ? 1 : 0)};
}

// Which elements of an array each member of a group owns. layout[r] lists the
// segments of member r, in the order they are packed in r's own (shard)
// buffer. The segments of all members are disjoint.
using Layout = std::vector<std::vector<Segment>>;

// The layout of PartitionSegment: one contiguous segment per member.
inline Layout BalancedLayout(size_t count, int parts) {
  Layout layout(parts);
  for (int r = 0; r < parts; ++r) layout[r] = {PartitionSegment(count, parts, r)};
  return layout;
}

// The number of elements member r owns in `layout`.
inline size_t OwnedCount(const Layout& layout, int r) {
  size_t n = 0;
  for (const Segment& s : layout[r]) n += s.count;
  return n;
}

// Bytes a device has sent, by link. ICI bytes are those that left the
// device's own buffers for another device's on the same host (read by a peer
// or written into a peer's buffer), so that shared-memory algorithms are
// counted as a ring would count them. Slice-network bytes went to another
// host of the same slice (ICI on a TPU; the network here), DCN bytes to
// another slice. Updated by the device's communication threads; read at any
// time.
struct TrafficCounters {
  std::atomic<uint64_t> ici_bytes_sent{0};
  std::atomic<uint64_t> slice_net_bytes_sent{0};
  std::atomic<uint64_t> dcn_bytes_sent{0};
};

}  // namespace multislice::comm
