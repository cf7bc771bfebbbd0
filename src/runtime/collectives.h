// Collectives on named mesh axes, as one device sees them.
//
// A DeviceCollectives belongs to one device thread. Each call names the mesh
// axes to communicate over (e.g. {"fsdp"} or {"data", "fsdp"}), starts the
// collective and returns a handle at once; the work runs on the device's two
// streams (one for ICI, one for DCN) while the device thread goes on
// computing, and several collectives may be in flight. Every device must
// start the same collectives in the same order (as with NCCL); buffers must
// stay valid and untouched until Wait() returns.
//
// The path follows from the axes (see axis_group.h): ICI-only axes run over
// shared memory, DCN-only axes over Gloo on this device's column, and axes
// spanning both as two levels, e.g. all-reduce = reduce-scatter inside the
// slice, all-reduce of each 1/k shard across slices (k columns in
// parallel), all-gather inside the slice, so each device sends
// 2(m-1)/(m k) * S over DCN instead of about 2S.
//
// Semantics over a group of p devices with rank r (sizes in elements):
//   AllReduce       out = op over every in (count each); in == out allowed.
//   ReduceScatter   in has count; out receives the reduction of chunk r of
//                   the balanced split (comm::PartitionSegment(count, p, r)).
//   AllGather       in holds chunk r of that split; out receives all count.
//   AllToAll        in has count, chunk j going to rank j; out receives from
//                   every rank s its chunk r, in rank order
//                   (p * PartitionSegment(count, p, r).count elements).
//   Broadcast       root's buf (count) copied into every buf.
//   Barrier         returns once every member has entered it.
//   Send / Recv     point to point: rank r's buf (count) into rank s's buf,
//                   the one calling Send(to = s), the other Recv(from = r),
//                   over shared memory on one host or the two devices'
//                   column between hosts (DCN across slices). A pair meets
//                   like a collective of two (rendezvous): every device must
//                   issue its sends and receives so that each pair's calls
//                   come in the same order on both sides, e.g. a chain of
//                   pipeline stages.
// Counts need not divide by p. bf16 is reduced in f32.
#pragma once

#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "runtime/axis_group.h"
#include "runtime/comm/types.h"

namespace multislice::runtime {

class Runtime;
struct OpState;
struct CollectivePhase;

class CollectiveHandle {
 public:
  CollectiveHandle() = default;
  explicit CollectiveHandle(std::shared_ptr<OpState> op) : op_(std::move(op)) {}
  // Blocks until the collective has finished on this device; returns its
  // status (errors name the collective, the phase, and the failing peer).
  Status Wait();
  bool Done() const;

 private:
  friend class DeviceCollectives;
  std::shared_ptr<OpState> op_;
};

using Axes = std::vector<std::string>;
using comm::DType;
using comm::ReduceOp;

class DeviceCollectives {
 public:
  DeviceCollectives(Runtime& runtime, int device_id);
  ~DeviceCollectives();
  DeviceCollectives(const DeviceCollectives&) = delete;
  DeviceCollectives& operator=(const DeviceCollectives&) = delete;

  int device_id() const { return device_id_; }

  // The group of this device over `axes` (cached).
  Result<const AxisGroup*> Group(const Axes& axes);

  // `label` names the collective in errors and traces, e.g. "layer3/grad".
  // `after`: a collective this one must wait for (its input is the other's
  // output), without blocking the device thread; e.g. a gradient's
  // all-reduce over data after its reduce-scatter over fsdp.
  CollectiveHandle AllReduce(const Axes& axes, const void* in, void* out,
                             size_t count, DType dtype, ReduceOp op,
                             const std::string& label = "",
                             const CollectiveHandle& after = {});
  CollectiveHandle ReduceScatter(const Axes& axes, const void* in, void* out,
                                 size_t count, DType dtype, ReduceOp op,
                                 const std::string& label = "",
                                 const CollectiveHandle& after = {});
  CollectiveHandle AllGather(const Axes& axes, const void* in, void* out,
                             size_t count, DType dtype,
                             const std::string& label = "",
                             const CollectiveHandle& after = {});
  CollectiveHandle AllToAll(const Axes& axes, const void* in, void* out,
                            size_t count, DType dtype,
                            const std::string& label = "");
  CollectiveHandle Broadcast(const Axes& axes, int root, void* buf,
                             size_t count, DType dtype,
                             const std::string& label = "");
  CollectiveHandle Barrier(const Axes& axes, const std::string& label = "");
  // buf stays valid and unchanged until Wait() returns; kInvalidArgument
  // for a peer that is not another rank of the group, kFailedPrecondition
  // for peers on different hosts at different positions on them (they
  // share no DCN communicator).
  CollectiveHandle Send(const Axes& axes, int to, const void* buf, size_t count,
                        DType dtype, const std::string& label = "");
  CollectiveHandle Recv(const Axes& axes, int from, void* buf, size_t count,
                        DType dtype, const std::string& label = "");

  // Bytes this device has sent over ICI and DCN since the start.
  const comm::TrafficCounters& counters() const { return counters_; }

 private:
  struct Streams;
  // Queues the phases of one collective; `op` owns its scratch buffers.
  CollectiveHandle Launch(const std::string& what,
                          std::vector<CollectivePhase> phases,
                          std::shared_ptr<OpState> op,
                          const CollectiveHandle& after = {});
  CollectiveHandle Fail(Status status);
  // Broadcast on a group already found (a mesh group or a pair of it).
  CollectiveHandle BroadcastOn(const AxisGroup& g, int root, void* buf,
                               size_t count, DType dtype,
                               const std::string& label, const char* op);
  // Send (sending) or Recv between this device and group rank `peer`.
  CollectiveHandle Exchange(const Axes& axes, int peer, void* buf, size_t count,
                            DType dtype, const std::string& label,
                            bool sending);
  // "all_reduce[data,fsdp]#12 label": how errors and traces name a call.
  std::string Describe(const char* op, const AxisGroup& g,
                       const std::string& label);

  Runtime& runtime_;
  const int device_id_;
  comm::TrafficCounters counters_;
  std::map<Axes, std::unique_ptr<AxisGroup>> groups_;
  // Pairs of a group's members for Send/Recv, by axes and the two ranks.
  std::map<std::pair<Axes, std::pair<int, int>>, std::unique_ptr<AxisGroup>>
      pairs_;
  uint64_t sequence_ = 0;
  std::unique_ptr<Streams> streams_;
};

}  // namespace multislice::runtime
