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
//
// CompressedAllReduce (f32, sum) is AllReduce with every value that crosses
// the group's outermost link compressed to a wire type (runtime/wire.h);
// kF32 is AllReduce. The outermost link is DCN when the group spans slices,
// else the network between a slice's hosts, else shared memory; its wire
// members are the slices, the hosts, or (on one host) the members. The
// levels inside it go as in AllReduce, in f32: a reduce-scatter on the host
// and between the slice's hosts on the way down, all-gathers on the way up,
// so that the compressed part runs on each device's piece (its share after
// those reduce-scatters) among the devices at its position in the other
// wire members.
// Over n wire members, wire member w holding v_w (its in, or the f32 sum of
// its members' in) and the values (the array or the piece) split into
// chunks c = PartitionSegment(values, n, c):
//   1. w quantises chunk c of v_w (int8: blocks of 256 from the chunk's
//      start) and sends it to wire member c (an all-to-all of bytes);
//   2. c dequantises the n chunks it received, sums them in f32 in wire
//      member order (group rank order when each wire member is one member,
//      else slice order, or on one slice host order) and quantises that sum
//      r (the same blocks);
//   3. an all-gather of the quantised sums, which every member dequantises
//      into out.
// Each value crosses the wire twice, quantised once each time, and every
// member gets bitwise the same out. The error of each output value, with x_g
// the inputs, y_w the dequantised v_w, E(v) the bound of one value through
// the wire (Bf16WireError(v), or Int8WireError of the scale of v's block),
// F = F32SumError and k_w the members in wire member w, is at most
//   |out - sum_g x_g| <= sum_w E(v_w) + F(n, sum_w |y_w|) + E(r)
//                        + sum_w F(k_w, sum of |x_g| over w's members)
// (the last term for the f32 sums inside the wire members; 0 when k_w = 1).
// NaN and infinities propagate (with int8, a whole block of out turns NaN).
// Per device, the wire carries an all-to-all and an all-gather of one slot
// per wire member, a slot being WireBytes of the largest chunk rounded up to
// even: with S the f32 bytes of the values, about 2 (n-1)/n S / 4
// (1 + 4/256) bytes for int8 and 2 (n-1)/n S / 2 for bf16, against the
// 2 (n-1)/n S AllReduce sends on that link. A group of one copies in to out.
// in == out is allowed.
#pragma once

#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "runtime/axis_group.h"
#include "runtime/comm/types.h"
#include "runtime/progress.h"
#include "runtime/wire.h"

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

  // The group of this device over `axes` (cached), without the slices the
  // runtime has dropped (Runtime::DropLostSlices). A pointer stays valid
  // for the life of this object, but describes the membership it was made
  // in.
  Result<const AxisGroup*> Group(const Axes& axes);

  // `label` names the collective in errors and traces, e.g. "layer3/grad".
  // `after`: a collective this one must wait for (its input is the other's
  // output), without blocking the device thread; e.g. a gradient's
  // all-reduce over data after its reduce-scatter over fsdp.
  CollectiveHandle AllReduce(const Axes& axes, const void* in, void* out,
                             size_t count, DType dtype, ReduceOp op,
                             const std::string& label = "",
                             const CollectiveHandle& after = {});
  // Sum only; see the top of this file. `after` as for AllReduce.
  CollectiveHandle CompressedAllReduce(const Axes& axes, const float* in,
                                       float* out, size_t count, WireType wire,
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
  // Where this device is in its collectives (for the hang digest).
  const DeviceProgress& progress() const { return *progress_; }

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
  int groups_generation_ = 0;  // the runtime's membership they were made in
  std::vector<std::unique_ptr<AxisGroup>> retired_groups_;
  // Pairs of a group's members for Send/Recv, by axes and the two ranks.
  std::map<std::pair<Axes, std::pair<int, int>>, std::unique_ptr<AxisGroup>>
      pairs_;
  uint64_t sequence_ = 0;
  // Shared with the stream tasks, which may outlive a call's handle.
  std::shared_ptr<DeviceProgress> progress_;
  std::unique_ptr<Streams> streams_;
};

}  // namespace multislice::runtime
