// ICI: collectives between the device threads of one process, through
// shared memory.
//
// A Group is a fixed set of `size` members (device threads) of this process.
// Every member calls the same operations in the same order, each with its own
// rank; each call returns when this member's part is done and every member has
// finished reading this member's buffers, so buffers may be reused at once.
// Data moves by direct loads and stores between the members' buffers (no
// intermediate copies): an all-reduce is one fused pass in which member r
// reduces its 1/size share from every input and writes it into every output.
//
// Every member passes the same layouts (each member reads the peers'
// segments from its own copy).
//
// Thread-safety: one thread per rank at a time; different ranks call
// concurrently. Every wait is bounded by the group's timeout and ends in
// kDeadlineExceeded naming the group and the phase.
//
// Sizes and offsets are in elements of `dtype`. Bytes this member sends (as
// defined in comm::TrafficCounters) are added to *bytes_sent when it is not
// null, after a successful call. The rule: bytes of this member's buffers
// that a peer reads, plus bytes this member writes into a peer's buffers;
// copies within one member's own buffers are free. So the fused all-reduce
// counts what a ring would. With S the bytes of the whole array, k = size,
// s_r the bytes of member r's share (AllReduce: PartitionSegment(count, k,
// r); layouts: its segments) and L the bytes of all segments of a layout:
//   AllReduce       S - s_r + (k-1) s_r   (balanced: 2(k-1)/k S, as a ring)
//   ReduceScatter   L - s_r               (balanced: (k-1)/k S)
//   AllGather       (k-1) s_r             (balanced: (k-1)/k S)
//   Broadcast       root: S; others: (k-2) p_r, where p_r is their
//                   PartitionSegment of S over the k-1 non-root members
//   Scatter         root: L - s_root; others: 0
//   AllToAll        sum over j != r of send[r][j]
//   Barrier         0
// Size 1 groups count nothing.
//
// Members that call different operations (kind, dtype, reduction, count or
// root) all get kInvalidArgument, and the group stays usable. After a
// timeout the group is broken: the members still waiting give up with
// kUnavailable and every later call fails with kFailedPrecondition. A member
// that gave up may still have its buffers read by a slow peer, so treat a
// timeout as fatal to the job.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "runtime/comm/types.h"

namespace multislice::ici {

using comm::DType;
using comm::Layout;
using comm::ReduceOp;

class Group {
 public:
  Group(int size, std::string name, std::chrono::milliseconds timeout);
  ~Group();
  Group(const Group&) = delete;
  Group& operator=(const Group&) = delete;

  int size() const { return size_; }
  const std::string& name() const { return name_; }

  // out = op over every member's in; count elements. in == out is allowed.
  Status AllReduce(int rank, const void* in, void* out, size_t count,
                   DType dtype, ReduceOp op, uint64_t* bytes_sent);

  // Member r's out receives the reduction of the segments layout[r] of every
  // member's in (`in` has the full array), packed in the order of
  // layout[r]. out may point into in at the member's own single segment.
  Status ReduceScatter(int rank, const void* in, void* out,
                       const Layout& layout, DType dtype, ReduceOp op,
                       uint64_t* bytes_sent);

  // Member r's in holds its segments layout[r], packed in order; every
  // member's out (the full array) receives every member's segments at their
  // offsets. in may point into out at the member's own single segment.
  Status AllGather(int rank, const void* in, void* out, const Layout& layout,
                   DType dtype, uint64_t* bytes_sent);

  // The root's buf (count elements) is copied into every member's buf.
  Status Broadcast(int rank, int root, void* buf, size_t count, DType dtype,
                   uint64_t* bytes_sent);

  // The root's in (the full array) is split by layout: member r's out
  // receives the segments layout[r], packed in order. Non-root members pass
  // in = nullptr.
  Status Scatter(int rank, int root, const void* in, void* out,
                 const Layout& layout, DType dtype, uint64_t* bytes_sent);

  // send[i][j] is the segment of member i's in that goes to member j;
  // recv[j][i] is where it lands in member j's out (equal counts). in and out
  // must not overlap.
  Status AllToAll(int rank, const void* in, void* out, const Layout& send,
                  const Layout& recv, DType dtype, uint64_t* bytes_sent);

  // Returns once every member has called Barrier.
  Status Barrier(int rank);

 private:
  struct State;
  const int size_;
  const std::string name_;
  const std::chrono::milliseconds timeout_;
  std::unique_ptr<State> state_;
};

// The groups of one process, looked up by a key every member computes the
// same way (for example the mesh axes and the coordinates of the group).
// Thread-safe.
class Domain {
 public:
  explicit Domain(std::chrono::milliseconds timeout) : timeout_(timeout) {}

  // Returns the group for `key`, creating it with `size` members on first
  // use. Every caller with the same key must pass the same size.
  std::shared_ptr<Group> GetOrCreate(const std::string& key, int size);

 private:
  const std::chrono::milliseconds timeout_;
  std::mutex mu_;
  std::map<std::string, std::shared_ptr<Group>> groups_;
};

}  // namespace multislice::ici
