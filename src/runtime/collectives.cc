// Collectives on mesh axes: each is a short chain of phases, each phase a
// transport call queued on the device's ICI or DCN stream. A phase starts
// when the previous phase of the same collective has finished; a failed phase
// skips the rest. Temporary buffers live in the collective's state until it
// completes.
#include "runtime/collectives.h"

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <mutex>

#include "runtime/runtime.h"
#include "runtime/stream.h"
#include "runtime/trace.h"

namespace multislice::runtime {

struct OpState {
  std::mutex mu;
  std::condition_variable cv;
  int num_phases = 0;
  int phases_started_after = 0;  // phases 0..n-1 allowed to start
  int phases_finished = 0;
  bool done = false;
  Status status;
  std::string what;
  uint64_t sequence = 0;  // the device's count of collectives issued
  std::shared_ptr<DeviceProgress> progress;  // its device's
  std::vector<std::vector<std::byte>> scratch;

  std::byte* Scratch(size_t bytes) {
    scratch.emplace_back(bytes);
    return scratch.back().data();
  }
};

Status CollectiveHandle::Wait() {
  if (!op_) return OkStatus();
  std::unique_lock<std::mutex> lock(op_->mu);
  if (!op_->done) {
    const auto start = std::chrono::steady_clock::now();
    op_->cv.wait(lock, [&] { return op_->done; });
    if (op_->progress) {
      op_->progress->AddWait(std::chrono::steady_clock::now() - start);
    }
  }
  return op_->status;
}

bool CollectiveHandle::Done() const {
  if (!op_) return true;
  std::lock_guard<std::mutex> lock(op_->mu);
  return op_->done;
}

struct DeviceCollectives::Streams {
  Stream ici;
  Stream dcn;
  Streams(int device)
      : ici("ici" + std::to_string(device)),
        dcn("dcn" + std::to_string(device)) {}
};

struct CollectivePhase {
  bool on_dcn = false;
  // A phase among this host's members runs even after the collective has
  // failed (on whatever its buffers hold): every member of the host then
  // runs the same phases, so that a failure elsewhere never leaves one
  // member waiting in a shared-memory group for another that skipped it.
  bool always = false;
  std::string name;
  std::function<Status()> body;
};

DeviceCollectives::DeviceCollectives(Runtime& runtime, int device_id)
    : runtime_(runtime),
      device_id_(device_id),
      progress_(std::make_shared<DeviceProgress>(device_id)),
      streams_(std::make_unique<Streams>(device_id)) {}

DeviceCollectives::~DeviceCollectives() = default;

Result<const AxisGroup*> DeviceCollectives::Group(const Axes& axes) {
  if (const int generation = runtime_.membership_generation();
      generation != groups_generation_) {
    // Slices were lost: every group is rebuilt without them. The old ones
    // stay alive, since callers may hold pointers to them (a plan's sizes
    // and ranks, which describe the configured mesh).
    for (auto& [axes_key, group] : groups_) {
      retired_groups_.push_back(std::move(group));
    }
    groups_.clear();
    groups_generation_ = generation;
  }
  auto it = groups_.find(axes);
  if (it != groups_.end()) return it->second.get();
  ASSIGN_OR_RETURN(
      AxisGroup g,
      MakeAxisGroup(runtime_.mesh(), runtime_.devices(), axes, device_id_));
  if (groups_generation_ > 0) g = WithoutSlices(g, runtime_.lost_slices());
  auto owned = std::make_unique<AxisGroup>(std::move(g));
  const AxisGroup* raw = owned.get();
  groups_[axes] = std::move(owned);
  return raw;
}

CollectiveHandle DeviceCollectives::Fail(Status status) {
  auto op = std::make_shared<OpState>();
  op->status = std::move(status);
  op->done = true;
  return CollectiveHandle(op);
}

CollectiveHandle DeviceCollectives::Launch(const std::string& what,
                                           std::vector<CollectivePhase> phases,
                                           std::shared_ptr<OpState> op,
                                           const CollectiveHandle& after) {
  op->what = what;
  op->sequence = sequence_;
  op->progress = progress_;
  op->num_phases = static_cast<int>(phases.size());
  progress_->Issued(op->sequence, what);
  if (phases.empty()) {
    op->done = true;
    progress_->Finished(op->sequence);
    return CollectiveHandle(op);
  }
  // A phase waits for its predecessor at most this long; the predecessor's
  // own waits are bounded by the timeout, so this only guards against bugs.
  const auto guard = runtime_.timeout() * 3;
  std::shared_ptr<OpState> dependency = after.op_;
  // The issuing device thread's trace while it traces a step, else the
  // runtime's (the shardings workload's, for the whole run).
  Trace* trace = ThreadTrace() ? ThreadTrace() : runtime_.trace();
  const int device = device_id_;
  std::shared_ptr<DeviceProgress> progress = progress_;
  for (int i = 0; i < op->num_phases; ++i) {
    CollectivePhase& phase = phases[i];
    Stream& stream = phase.on_dcn ? streams_->dcn : streams_->ici;
    const Track track = phase.on_dcn ? Track::kDcn : Track::kIci;
    const bool always = phase.always;
    stream.Enqueue([op, i, guard, trace, device, track, always, progress,
                    dependency = i == 0 ? dependency : nullptr,
                    name = std::move(phase.name),
                    body = std::move(phase.body)] {
      // The collective this one comes after was queued earlier on every
      // stream, so waiting for it here cannot deadlock.
      Status dependency_status;
      if (dependency) {
        std::unique_lock<std::mutex> dep_lock(dependency->mu);
        if (!dependency->cv.wait_for(dep_lock, guard,
                                     [&] { return dependency->done; })) {
          dependency_status =
              DeadlineExceeded("waited too long for " + dependency->what);
        } else if (!dependency->status.ok()) {
          dependency_status =
              Aborted("skipped because " + dependency->what + " failed");
        }
      }
      std::unique_lock<std::mutex> lock(op->mu);
      if (!dependency_status.ok() && op->status.ok()) {
        op->status = dependency_status.WithContext(op->what);
      }
      if (!op->cv.wait_for(lock, guard,
                           [&] { return op->phases_started_after >= i; }) &&
          op->status.ok()) {
        op->status = DeadlineExceeded(op->what + ": phase " + name +
                                      " waited too long for the previous one");
      }
      const bool run = op->status.ok() || always;
      lock.unlock();
      Status s;
      if (run) {
        progress->PhaseStarted(op->sequence, name);
        ScopedSpan span(trace, device, track, op->what + " " + name);
        s = body();
      }
      lock.lock();
      if (!s.ok() && op->status.ok()) {
        op->status = s.WithContext(op->what + ", " + name + " phase");
      }
      op->phases_started_after = std::max(op->phases_started_after, i + 1);
      if (++op->phases_finished == op->num_phases) {
        op->done = true;
        progress->Finished(op->sequence);
      }
      op->cv.notify_all();
    });
  }
  return CollectiveHandle(op);
}

namespace {

std::byte* At(void* base, size_t elements, size_t elem_size) {
  return static_cast<std::byte*>(base) + elements * elem_size;
}
const std::byte* At(const void* base, size_t elements, size_t elem_size) {
  return static_cast<const std::byte*>(base) + elements * elem_size;
}

void CopyElements(void* dst, const void* src, size_t count, size_t elem_size) {
  if (dst != src && count > 0) std::memmove(dst, src, count * elem_size);
}

uint32_t Fnv1a(const std::string& text) {
  uint32_t h = 2166136261u;
  for (unsigned char c : text) h = (h ^ c) * 16777619u;
  return h;
}

size_t Sum(const std::vector<size_t>& v) {
  size_t s = 0;
  for (size_t x : v) s += x;
  return s;
}

// The subgroups of a device's network part (axis_group.h): members (q, i)
// for this device's i.
enum class Level {
  kByRank,  // every q, in group-rank order (only when local_size == 1)
  kAll,     // every q, in q order
  kHosts,   // this slice's q (this d, every e), by e
  kSlices,  // this host position's q (every d, this e), by d
};

// The network order of a hierarchical reduce-scatter or all-gather: hosts
// major, slices minor, so that the hosts' phase splits it into contiguous
// blocks (one per e) and the slices' phase each block into chunks (one per d).
std::vector<int> NetOrder(const AxisGroup& g) {
  std::vector<int> qs;
  for (int e = 0; e < g.host_size; ++e) {
    for (int d = 0; d < g.dcn_size; ++d) qs.push_back(d * g.host_size + e);
  }
  return qs;
}

// Builds the phases of one collective on one group.
class PhaseBuilder {
 public:
  PhaseBuilder(Runtime& runtime, const AxisGroup& g,
               comm::TrafficCounters& counters)
      : runtime_(runtime), g_(g), counters_(counters) {}

  using SharedFn = std::function<Status(ici::Group&, int i, uint64_t* bytes)>;
  using NetFn = std::function<Status(dcn::Communicator&, const dcn::DcnGroup&,
                                     const std::string& phase)>;

  // A phase among this host's members, over shared memory.
  void Shared(const std::string& what, SharedFn fn) {
    std::shared_ptr<ici::Group> group =
        runtime_.ici_domain().GetOrCreate(g_.local_key, g_.local_size);
    comm::TrafficCounters* counters = &counters_;
    const int i = g_.local_rank;
    phases_.push_back({false, true, "ici " + what, [group, counters, i, fn] {
                         uint64_t bytes = 0;
                         Status s = fn(*group, i, &bytes);
                         counters->ici_bytes_sent += bytes;
                         return s;
                       }});
  }

  // A phase between hosts over the column's communicator. Bytes count as
  // slice-network or DCN bytes by the slice of the peer they went to.
  void Net(Level level, const std::string& what, NetFn fn) {
    dcn::Communicator* comm = runtime_.dcn(g_.column);
    std::vector<int> qs = Members(level);
    dcn::DcnGroup group;
    std::vector<bool> same_slice;
    for (size_t x = 0; x < qs.size(); ++x) {
      if (qs[x] == g_.net_rank) group.my_index = static_cast<int>(x);
      group.members.push_back(runtime_.dcn_rank_of(g_.net_processes[qs[x]]));
      same_slice.push_back(qs[x] / g_.host_size == g_.dcn_rank);
    }
    group.id = Fnv1a(LevelKey(level) + "/" + g_.net_label);
    comm::TrafficCounters* counters = &counters_;
    const std::string phase = LevelName(level) + " " + what;
    phases_.push_back(
        {true, false, phase, [comm, group, same_slice, counters, fn, phase] {
           if (comm == nullptr) {
             return Internal("no DCN communicator");
           }
           const size_t n = group.members.size();
           std::vector<uint64_t> before(n);
           for (size_t x = 0; x < n; ++x)
             before[x] = comm->bytes_sent_to(group.members[x]);
           Status s = fn(*comm, group, phase);
           for (size_t x = 0; x < n; ++x) {
             const uint64_t sent =
                 comm->bytes_sent_to(group.members[x]) - before[x];
             (same_slice[x] ? counters->slice_net_bytes_sent
                            : counters->dcn_bytes_sent) += sent;
           }
           return s;
         }});
  }

  // A phase on this device alone. on_dcn puts it on the DCN stream, for work
  // between two DCN phases: on the ICI stream it would hold every later ICI
  // phase until the DCN phase before it finished.
  void Local(std::string name, std::function<void()> fn, bool on_dcn = false) {
    phases_.push_back({on_dcn, false, std::move(name), [fn] {
                         fn();
                         return OkStatus();
                       }});
  }

  std::vector<CollectivePhase>& phases() { return phases_; }

 private:
  std::vector<int> Members(Level level) const {
    std::vector<int> qs;
    switch (level) {
      case Level::kByRank:
        qs.assign(g_.size, 0);
        for (int q = 0; q < g_.net_size; ++q) qs[g_.NetRankOf(q, 0)] = q;
        break;
      case Level::kAll:
        for (int q = 0; q < g_.net_size; ++q) qs.push_back(q);
        break;
      case Level::kHosts:
        for (int e = 0; e < g_.host_size; ++e)
          qs.push_back(g_.dcn_rank * g_.host_size + e);
        break;
      case Level::kSlices:
        for (int d = 0; d < g_.dcn_size; ++d)
          qs.push_back(d * g_.host_size + g_.host_rank);
        break;
    }
    return qs;
  }
  // Same for every member of the subgroup, different between subgroups.
  std::string LevelKey(Level level) const {
    switch (level) {
      case Level::kByRank:
      case Level::kAll:
        return "net";
      case Level::kHosts:
        return "hosts" + std::to_string(g_.dcn_rank);
      case Level::kSlices:
        return "slices" + std::to_string(g_.host_rank);
    }
    return "";
  }
  // How phases name the link: "dcn" across slices, "hosts" between the
  // hosts of one slice, "network" for both at once.
  std::string LevelName(Level level) const {
    if (level == Level::kHosts) return "hosts";
    if (level == Level::kSlices) return "dcn";
    if (g_.host_size == 1) return "dcn";
    return g_.dcn_size == 1 ? "hosts" : "network";
  }

  Runtime& runtime_;
  const AxisGroup& g_;
  comm::TrafficCounters& counters_;
  std::vector<CollectivePhase> phases_;
};

// The chunk of group rank r in the balanced split of count over the group.
comm::Segment Chunk(const AxisGroup& g, size_t count, int rank) {
  return comm::PartitionSegment(count, g.size, rank);
}

// Where a reduce-scatter's or all-gather's network part keeps its data for
// this host position: the chunks of members (q, i) in NetOrder, packed.
struct NetPacking {
  std::vector<int> order;        // q, in NetOrder
  std::vector<size_t> chunk;     // count of (order[x], my i)
  std::vector<size_t> by_host;   // by e: the chunks of that host, summed
  std::vector<size_t> by_slice;  // by d: the chunk of (d, my e)
  size_t total = 0;
  bool natural = false;  // the packing equals the input's rank order

  NetPacking(const AxisGroup& g, size_t count) : order(NetOrder(g)) {
    by_host.assign(g.host_size, 0);
    natural = g.local_size == 1;
    for (size_t x = 0; x < order.size(); ++x) {
      const int rank = g.NetRankOf(order[x], g.local_rank);
      chunk.push_back(Chunk(g, count, rank).count);
      by_host[order[x] % g.host_size] += chunk.back();
      if (rank != static_cast<int>(x)) natural = false;
    }
    for (int d = 0; d < g.dcn_size; ++d) {
      const int q = d * g.host_size + g.host_rank;
      by_slice.push_back(Chunk(g, count, g.NetRankOf(q, g.local_rank)).count);
    }
    total = Sum(chunk);
  }
};

// Member i' of this host gathers or scatters the chunks of (q, i') in
// NetOrder: the layout of the shared phase of a reduce-scatter or
// all-gather.
comm::Layout SharedLayout(const AxisGroup& g, size_t count) {
  const std::vector<int> order = NetOrder(g);
  comm::Layout layout(g.local_size);
  for (int i = 0; i < g.local_size; ++i) {
    for (int q : order) layout[i].push_back(Chunk(g, count, g.NetRankOf(q, i)));
  }
  return layout;
}

// Appends a network all-reduce of buf[0..count) in place: hierarchical
// (reduce-scatter between the slice's hosts, all-reduce of each 1/h across
// slices, all-gather between the hosts) when the network part has both
// levels, else one all-reduce. Reads from `in` (buf when nullptr).
void NetAllReduce(PhaseBuilder& b, const AxisGroup& g, OpState& state,
                  const void* in, std::byte* buf, size_t count, DType dtype,
                  ReduceOp op) {
  if (in == nullptr) in = buf;
  if (g.host_size == 1 || g.dcn_size == 1) {
    b.Net(Level::kAll, "all-reduce",
          [=](dcn::Communicator& c, const dcn::DcnGroup& dg,
              const std::string& phase) {
            return c.AllReduce(dg, in, buf, count, dtype, op, phase);
          });
    return;
  }
  const size_t es = comm::SizeOf(dtype);
  std::vector<size_t> counts;
  for (int e = 0; e < g.host_size; ++e) {
    counts.push_back(comm::PartitionSegment(count, g.host_size, e).count);
  }
  const size_t mine = counts[g.host_rank];
  std::byte* piece = state.Scratch(mine * es);
  b.Net(Level::kHosts, "reduce-scatter",
        [=](dcn::Communicator& c, const dcn::DcnGroup& dg,
            const std::string& phase) {
          return c.ReduceScatter(dg, in, piece, counts, dtype, op, phase);
        });
  b.Net(Level::kSlices, "all-reduce",
        [=](dcn::Communicator& c, const dcn::DcnGroup& dg,
            const std::string& phase) {
          return c.AllReduce(dg, piece, piece, mine, dtype, op, phase);
        });
  b.Net(Level::kHosts, "all-gather",
        [=](dcn::Communicator& c, const dcn::DcnGroup& dg,
            const std::string& phase) {
          return c.AllGather(dg, piece, buf, counts, dtype, phase);
        });
}

// The chunk sizes of every group rank, in rank order.
std::vector<size_t> RankCounts(const AxisGroup& g, size_t count) {
  std::vector<size_t> counts;
  for (int r = 0; r < g.size; ++r) counts.push_back(Chunk(g, count, r).count);
  return counts;
}

// Where the chunks of (q, i = 0) lie in a rank-ordered array, in NetOrder:
// the copies between rank order and the packing when a host holds one
// member.
std::vector<comm::Segment> PackedChunks(const AxisGroup& g, size_t count) {
  std::vector<comm::Segment> chunks;
  for (int q : NetOrder(g))
    chunks.push_back(Chunk(g, count, g.NetRankOf(q, 0)));
  return chunks;
}

// Appends the network part of a reduce-scatter: `packed` holds this host
// position's chunks in NetOrder (or, `by_rank`, the whole input in rank
// order); out receives this device's chunk.
void NetReduceScatter(PhaseBuilder& b, const AxisGroup& g, OpState& state,
                      const NetPacking& pack, const void* packed, bool by_rank,
                      void* out, size_t count, DType dtype, ReduceOp op) {
  if (g.host_size == 1 || g.dcn_size == 1) {
    const std::vector<size_t> counts =
        by_rank ? RankCounts(g, count)
                : (g.host_size == 1 ? pack.by_slice : pack.by_host);
    b.Net(by_rank ? Level::kByRank : Level::kAll, "reduce-scatter",
          [=](dcn::Communicator& c, const dcn::DcnGroup& dg,
              const std::string& phase) {
            return c.ReduceScatter(dg, packed, out, counts, dtype, op, phase);
          });
    return;
  }
  std::byte* host_block =
      state.Scratch(pack.by_host[g.host_rank] * comm::SizeOf(dtype));
  const std::vector<size_t> by_host = pack.by_host, by_slice = pack.by_slice;
  b.Net(Level::kHosts, "reduce-scatter",
        [=](dcn::Communicator& c, const dcn::DcnGroup& dg,
            const std::string& phase) {
          return c.ReduceScatter(dg, packed, host_block, by_host, dtype, op,
                                 phase);
        });
  b.Net(Level::kSlices, "reduce-scatter",
        [=](dcn::Communicator& c, const dcn::DcnGroup& dg,
            const std::string& phase) {
          return c.ReduceScatter(dg, host_block, out, by_slice, dtype, op,
                                 phase);
        });
}

// Appends the network part of an all-gather: `in` is this device's chunk;
// `packed` receives this host position's chunks in NetOrder (or, `by_rank`,
// every chunk in rank order).
void NetAllGather(PhaseBuilder& b, const AxisGroup& g, OpState& state,
                  const NetPacking& pack, const void* in, void* packed,
                  bool by_rank, size_t count, DType dtype) {
  if (g.host_size == 1 || g.dcn_size == 1) {
    const std::vector<size_t> counts =
        by_rank ? RankCounts(g, count)
                : (g.host_size == 1 ? pack.by_slice : pack.by_host);
    b.Net(by_rank ? Level::kByRank : Level::kAll, "all-gather",
          [=](dcn::Communicator& c, const dcn::DcnGroup& dg,
              const std::string& phase) {
            return c.AllGather(dg, in, packed, counts, dtype, phase);
          });
    return;
  }
  std::byte* host_block =
      state.Scratch(pack.by_host[g.host_rank] * comm::SizeOf(dtype));
  const std::vector<size_t> by_host = pack.by_host, by_slice = pack.by_slice;
  b.Net(Level::kSlices, "all-gather",
        [=](dcn::Communicator& c, const dcn::DcnGroup& dg,
            const std::string& phase) {
          return c.AllGather(dg, in, host_block, by_slice, dtype, phase);
        });
  b.Net(Level::kHosts, "all-gather",
        [=](dcn::Communicator& c, const dcn::DcnGroup& dg,
            const std::string& phase) {
          return c.AllGather(dg, host_block, packed, by_host, dtype, phase);
        });
}

// The group of two of g's members, this device and group rank `peer`,
// ranked by group rank: on one host a shared-memory pair, on two hosts a
// network pair on this device's column (the peer must have the same
// position on its host).
Result<AxisGroup> PairOf(const AxisGroup& g, int peer) {
  int peer_q = -1, peer_i = -1;
  for (int q = 0; q < g.net_size && peer_q < 0; ++q) {
    for (int i = 0; i < g.local_size; ++i) {
      if (g.NetRankOf(q, i) == peer) peer_q = q, peer_i = i;
    }
  }
  const int lo = std::min(g.rank, peer), hi = std::max(g.rank, peer);
  const std::string tag =
      "/pair" + std::to_string(lo) + "-" + std::to_string(hi);
  AxisGroup p;
  p.axes = g.axes;
  p.axes_label = g.axes_label;
  p.size = 2;
  p.rank = g.rank == lo ? 0 : 1;
  p.members = {g.members[lo], g.members[hi]};
  p.rank_of = {0, 1};
  p.column = g.column;
  if (peer_q == g.net_rank) {  // the same host
    p.ici_size = p.local_size = 2;
    p.ici_rank = p.local_rank = p.rank;
    p.j_of = {0, 1};
    p.local_key = g.local_key + tag;
    p.local_members = p.members;
    p.net_processes = {g.net_processes[g.net_rank]};
    p.net_label = g.net_label + tag;
    return p;
  }
  if (peer_i != g.local_rank) {
    return FailedPrecondition(
        "send/recv over " + g.axes_label + " between group ranks " +
        std::to_string(g.rank) + " and " + std::to_string(peer) +
        ": they are on different hosts at different positions on them, "
        "which share no DCN communicator");
  }
  const bool same_slice = peer_q / g.host_size == g.dcn_rank;
  p.net_size = 2;
  p.net_rank = p.rank;
  if (same_slice) {
    p.host_size = p.ici_size = 2;
    p.host_rank = p.ici_rank = p.rank;
    p.j_of = {0, 1};
  } else {
    p.dcn_size = 2;
    p.dcn_rank = p.rank;
    p.j_of = {0};
  }
  const int my_process = g.net_processes[g.net_rank];
  const int peer_process = g.net_processes[peer_q];
  p.net_processes = p.rank == 0 ? std::vector<int>{my_process, peer_process}
                                : std::vector<int>{peer_process, my_process};
  p.local_key = g.local_key + tag;
  p.local_members = {g.members[g.rank]};
  p.net_label = g.net_label + tag;
  return p;
}

// Moves `per_member` bf16-sized carriers of quantised bytes per wire member
// between the wire members: an all-to-all (send holds one run per member, in
// member order; recv gets one from each) or an all-gather (send holds this
// member's run; recv gets every member's).
using CarrierMove =
    std::function<void(const std::byte* send, std::byte* recv, size_t)>;

// Appends the compressed all-reduce (sum) of `count` f32 values over n wire
// members, this one w (collectives.h): quantise every chunk, all-to-all,
// dequantise and sum this member's chunk in member order, quantise, all-gather,
// dequantise. Every chunk travels in a slot of the largest chunk's wire bytes,
// rounded up to whole carriers, so that the transports split evenly. out may
// be in. on_dcn: the moves go over DCN, so the local phases between them run
// on the DCN stream too and leave the ICI stream to the next steps' work.
void AppendCompressedAllReduce(PhaseBuilder& b, OpState& state, WireType wire,
                               const float* in, float* out, size_t count, int n,
                               int w, const CarrierMove& all_to_all,
                               const CarrierMove& all_gather, bool on_dcn) {
  const size_t slot_bytes =
      (WireBytes(wire, comm::PartitionSegment(count, n, 0).count) + 1) / 2 * 2;
  const size_t un = static_cast<size_t>(n);
  std::byte* send = state.Scratch(un * slot_bytes);
  std::byte* received = state.Scratch(un * slot_bytes);
  std::byte* reduced = state.Scratch(slot_bytes);
  std::byte* gathered = state.Scratch(un * slot_bytes);
  const comm::Segment mine = comm::PartitionSegment(count, n, w);
  // Scratch buffers come from operator new, so they are aligned for floats.
  float* sum = reinterpret_cast<float*>(state.Scratch(mine.count * 4));
  float* term = reinterpret_cast<float*>(state.Scratch(mine.count * 4));
  b.Local(
      "quantise",
      [=] {
        for (int c = 0; c < n; ++c) {
          const comm::Segment s = comm::PartitionSegment(count, n, c);
          Quantize(wire, in + s.offset, s.count, send + c * slot_bytes);
        }
      },
      on_dcn);
  all_to_all(send, received, slot_bytes / 2);
  b.Local(
      "reduce",
      [=] {
        Dequantize(wire, received, mine.count, sum);
        for (int s = 1; s < n; ++s) {
          Dequantize(wire, received + s * slot_bytes, mine.count, term);
          for (size_t i = 0; i < mine.count; ++i) sum[i] += term[i];
        }
        Quantize(wire, sum, mine.count, reduced);
      },
      on_dcn);
  all_gather(reduced, gathered, slot_bytes / 2);
  b.Local(
      "dequantise",
      [=] {
        for (int c = 0; c < n; ++c) {
          const comm::Segment s = comm::PartitionSegment(count, n, c);
          Dequantize(wire, gathered + c * slot_bytes, s.count, out + s.offset);
        }
      },
      on_dcn);
}

}  // namespace

std::string DeviceCollectives::Describe(const char* op, const AxisGroup& g,
                                        const std::string& label) {
  std::string what =
      std::string(op) + "[" + g.axes_label + "]#" + std::to_string(++sequence_);
  if (!label.empty()) what += " " + label;
  return what;
}

#define MS_GROUP_OR_FAIL(g, axes)                         \
  auto g##_result = Group(axes);                          \
  if (!g##_result.ok()) return Fail(g##_result.status()); \
  const AxisGroup& g = **g##_result

CollectiveHandle DeviceCollectives::AllReduce(const Axes& axes, const void* in,
                                              void* out, size_t count,
                                              DType dtype, ReduceOp op,
                                              const std::string& label,
                                              const CollectiveHandle& after) {
  MS_GROUP_OR_FAIL(g, axes);
  const std::string what = Describe("all_reduce", g, label);
  const size_t es = comm::SizeOf(dtype);
  auto state = std::make_shared<OpState>();
  PhaseBuilder b(runtime_, g, counters_);
  switch (g.path()) {
    case Path::kLocal:
      b.Local("copy", [=] { CopyElements(out, in, count, es); });
      break;
    case Path::kShared:
      b.Shared("all-reduce", [=](ici::Group& grp, int i, uint64_t* bytes) {
        return grp.AllReduce(i, in, out, count, dtype, op, bytes);
      });
      break;
    case Path::kNetwork:
      NetAllReduce(b, g, *state, in, static_cast<std::byte*>(out), count, dtype,
                   op);
      break;
    case Path::kTwoLevel: {
      // Reduce-scatter on the host, all-reduce this device's shard with the
      // same shard of the other hosts, all-gather on the host.
      const comm::Layout layout = comm::BalancedLayout(count, g.local_size);
      const comm::Segment mine = layout[g.local_rank][0];
      std::byte* shard = At(out, mine.offset, es);
      b.Shared("reduce-scatter", [=](ici::Group& grp, int i, uint64_t* bytes) {
        return grp.ReduceScatter(i, in, shard, layout, dtype, op, bytes);
      });
      NetAllReduce(b, g, *state, nullptr, shard, mine.count, dtype, op);
      b.Shared("all-gather", [=](ici::Group& grp, int i, uint64_t* bytes) {
        return grp.AllGather(i, shard, out, layout, dtype, bytes);
      });
      break;
    }
  }
  return Launch(what, std::move(b.phases()), state, after);
}

CollectiveHandle DeviceCollectives::CompressedAllReduce(
    const Axes& axes, const float* in, float* out, size_t count, WireType wire,
    const std::string& label, const CollectiveHandle& after) {
  if (wire == WireType::kF32) {
    return AllReduce(axes, in, out, count, DType::kF32, ReduceOp::kSum, label,
                     after);
  }
  MS_GROUP_OR_FAIL(g, axes);
  const std::string op = "all_reduce_" + std::string(Name(wire));
  const std::string what = Describe(op.c_str(), g, label);
  const std::string kind = " " + std::string(Name(wire));
  auto state = std::make_shared<OpState>();
  PhaseBuilder b(runtime_, g, counters_);
  const int k = g.local_size;
  auto shared_all_to_all = [&](const std::byte* send, std::byte* recv,
                               size_t per) {
    comm::Layout send_layout(k), recv_layout(k);
    for (int i = 0; i < k; ++i) {
      for (int j = 0; j < k; ++j) {
        send_layout[i].push_back({j * per, per});
        recv_layout[j].push_back({i * per, per});
      }
    }
    b.Shared("all-to-all" + kind, [=](ici::Group& grp, int i, uint64_t* bytes) {
      return grp.AllToAll(i, send, recv, send_layout, recv_layout, DType::kBF16,
                          bytes);
    });
  };
  auto shared_all_gather = [&](const std::byte* send, std::byte* recv,
                               size_t per) {
    const comm::Layout layout = comm::BalancedLayout(k * per, k);
    b.Shared("all-gather" + kind, [=](ici::Group& grp, int i, uint64_t* bytes) {
      return grp.AllGather(i, send, recv, layout, DType::kBF16, bytes);
    });
  };
  // Between hosts: over `level`'s subgroup of this device's column, n
  // members; an all-gather or an all-to-all.
  auto net_move = [&](Level level, int n, bool gather) -> CarrierMove {
    return [&b, &kind, level, n, gather](const std::byte* send, std::byte* recv,
                                         size_t per) {
      const std::vector<size_t> counts(n, per);
      b.Net(level, (gather ? "all-gather" : "all-to-all") + kind,
            [=](dcn::Communicator& c, const dcn::DcnGroup& dg,
                const std::string& phase) {
              return gather ? c.AllGather(dg, send, recv, counts, DType::kBF16,
                                          phase)
                            : c.AllToAll(dg, send, recv, counts, counts,
                                         DType::kBF16, phase);
            });
    };
  };
  if (g.path() == Path::kLocal) {
    b.Local("copy", [=] { CopyElements(out, in, count, 4); });
    return Launch(what, std::move(b.phases()), state, after);
  }
  if (g.path() == Path::kShared) {
    AppendCompressedAllReduce(b, *state, wire, in, out, count, k, g.local_rank,
                              shared_all_to_all, shared_all_gather,
                              /*on_dcn=*/false);
    return Launch(what, std::move(b.phases()), state, after);
  }
  // Only the outermost link is compressed: the levels inside it
  // reduce-scatter in f32 on the way down and all-gather on the way up, as
  // AllReduce does.
  const float* src = in;
  float* buf = out;
  size_t n_values = count;
  comm::Layout layout;
  if (k > 1) {
    layout = comm::BalancedLayout(count, k);
    const comm::Segment mine = layout[g.local_rank][0];
    buf = out + mine.offset;
    src = buf;
    n_values = mine.count;
    b.Shared("reduce-scatter", [=](ici::Group& grp, int i, uint64_t* bytes) {
      return grp.ReduceScatter(i, in, buf, layout, DType::kF32, ReduceOp::kSum,
                               bytes);
    });
  }
  if (g.host_size > 1 && g.dcn_size > 1) {
    // Across the slice's hosts in f32, across slices compressed.
    std::vector<size_t> counts;
    for (int e = 0; e < g.host_size; ++e) {
      counts.push_back(comm::PartitionSegment(n_values, g.host_size, e).count);
    }
    const size_t n_piece = counts[g.host_rank];
    float* piece = reinterpret_cast<float*>(state->Scratch(n_piece * 4));
    b.Net(Level::kHosts, "reduce-scatter",
          [=](dcn::Communicator& c, const dcn::DcnGroup& dg,
              const std::string& phase) {
            return c.ReduceScatter(dg, src, piece, counts, DType::kF32,
                                   ReduceOp::kSum, phase);
          });
    AppendCompressedAllReduce(b, *state, wire, piece, piece, n_piece,
                              g.dcn_size, g.dcn_rank,
                              net_move(Level::kSlices, g.dcn_size, false),
                              net_move(Level::kSlices, g.dcn_size, true),
                              /*on_dcn=*/true);
    b.Net(Level::kHosts, "all-gather",
          [=](dcn::Communicator& c, const dcn::DcnGroup& dg,
              const std::string& phase) {
            return c.AllGather(dg, piece, buf, counts, DType::kF32, phase);
          });
  } else {
    // One level of hosts: in rank order when each holds one member, else
    // the network group in q order.
    const Level level = k == 1 ? Level::kByRank : Level::kAll;
    AppendCompressedAllReduce(b, *state, wire, src, buf, n_values, g.net_size,
                              k == 1 ? g.rank : g.net_rank,
                              net_move(level, g.net_size, false),
                              net_move(level, g.net_size, true),
                              /*on_dcn=*/true);
  }
  if (k > 1) {
    b.Shared("all-gather", [=](ici::Group& grp, int i, uint64_t* bytes) {
      return grp.AllGather(i, buf, out, layout, DType::kF32, bytes);
    });
  }
  return Launch(what, std::move(b.phases()), state, after);
}

CollectiveHandle DeviceCollectives::ReduceScatter(
    const Axes& axes, const void* in, void* out, size_t count, DType dtype,
    ReduceOp op, const std::string& label, const CollectiveHandle& after) {
  MS_GROUP_OR_FAIL(g, axes);
  const std::string what = Describe("reduce_scatter", g, label);
  const size_t es = comm::SizeOf(dtype);
  auto state = std::make_shared<OpState>();
  PhaseBuilder b(runtime_, g, counters_);
  if (g.path() == Path::kLocal) {
    b.Local("copy", [=] { CopyElements(out, in, count, es); });
    return Launch(what, std::move(b.phases()), state, after);
  }
  if (g.path() == Path::kShared) {
    const comm::Layout layout = comm::BalancedLayout(count, g.local_size);
    b.Shared("reduce-scatter", [=](ici::Group& grp, int i, uint64_t* bytes) {
      return grp.ReduceScatter(i, in, out, layout, dtype, op, bytes);
    });
    return Launch(what, std::move(b.phases()), state, after);
  }
  // Down the levels: the host reduces, for each of its members i', the
  // chunks of (q, i') for every q; the slice's hosts then keep the chunks of
  // their e; the slices finally keep their own chunk.
  const NetPacking pack(g, count);
  const void* packed = in;
  if (g.local_size > 1) {
    std::byte* reduced = state->Scratch(pack.total * es);
    const comm::Layout layout = SharedLayout(g, count);
    b.Shared("reduce-scatter", [=](ici::Group& grp, int i, uint64_t* bytes) {
      return grp.ReduceScatter(i, in, reduced, layout, dtype, op, bytes);
    });
    packed = reduced;
  } else if (!pack.natural && g.host_size > 1 && g.dcn_size > 1) {
    std::byte* copy = state->Scratch(pack.total * es);
    const std::vector<comm::Segment> chunks = PackedChunks(g, count);
    b.Local("pack", [=] {
      size_t at = 0;
      for (const comm::Segment& c : chunks) {
        CopyElements(At(copy, at, es), At(in, c.offset, es), c.count, es);
        at += c.count;
      }
    });
    packed = copy;
  }
  NetReduceScatter(b, g, *state, pack, packed, packed == in, out, count, dtype,
                   op);
  return Launch(what, std::move(b.phases()), state, after);
}

CollectiveHandle DeviceCollectives::AllGather(const Axes& axes, const void* in,
                                              void* out, size_t count,
                                              DType dtype,
                                              const std::string& label,
                                              const CollectiveHandle& after) {
  MS_GROUP_OR_FAIL(g, axes);
  const std::string what = Describe("all_gather", g, label);
  const size_t es = comm::SizeOf(dtype);
  auto state = std::make_shared<OpState>();
  PhaseBuilder b(runtime_, g, counters_);
  if (g.path() == Path::kLocal) {
    b.Local("copy", [=] { CopyElements(out, in, count, es); });
    return Launch(what, std::move(b.phases()), state, after);
  }
  if (g.path() == Path::kShared) {
    const comm::Layout layout = comm::BalancedLayout(count, g.local_size);
    b.Shared("all-gather", [=](ici::Group& grp, int i, uint64_t* bytes) {
      return grp.AllGather(i, in, out, layout, dtype, bytes);
    });
    return Launch(what, std::move(b.phases()), state, after);
  }
  // Up the levels: the slices gather this host position's chunks of every
  // d, the slice's hosts every e's, and the host spreads them to out.
  const NetPacking pack(g, count);
  const bool one_level = g.host_size == 1 || g.dcn_size == 1;
  const bool direct = g.local_size == 1 && (one_level || pack.natural);
  void* packed = direct ? out : state->Scratch(pack.total * es);
  NetAllGather(b, g, *state, pack, in, packed, g.local_size == 1 && one_level,
               count, dtype);
  if (g.local_size > 1) {
    const comm::Layout layout = SharedLayout(g, count);
    b.Shared("all-gather", [=](ici::Group& grp, int i, uint64_t* bytes) {
      return grp.AllGather(i, packed, out, layout, dtype, bytes);
    });
  } else if (!direct) {
    const std::vector<comm::Segment> chunks = PackedChunks(g, count);
    b.Local("unpack", [=] {
      size_t at = 0;
      for (const comm::Segment& c : chunks) {
        CopyElements(At(out, c.offset, es), At(packed, at, es), c.count, es);
        at += c.count;
      }
    });
  }
  return Launch(what, std::move(b.phases()), state, after);
}

CollectiveHandle DeviceCollectives::Broadcast(const Axes& axes, int root,
                                              void* buf, size_t count,
                                              DType dtype,
                                              const std::string& label) {
  MS_GROUP_OR_FAIL(g, axes);
  if (root < 0 || root >= g.size) {
    return Fail(InvalidArgument(
        "broadcast root " + std::to_string(root) + " is not a rank of the " +
        std::to_string(g.size) + " devices over " + g.axes_label));
  }
  return BroadcastOn(g, root, buf, count, dtype, label, "broadcast");
}

CollectiveHandle DeviceCollectives::BroadcastOn(const AxisGroup& g, int root,
                                                void* buf, size_t count,
                                                DType dtype,
                                                const std::string& label,
                                                const char* op) {
  const std::string what = Describe(op, g, label);
  const size_t es = comm::SizeOf(dtype);
  auto state = std::make_shared<OpState>();
  PhaseBuilder b(runtime_, g, counters_);
  int root_q = 0, root_i = 0;
  for (int q = 0; q < g.net_size; ++q) {
    for (int i = 0; i < g.local_size; ++i) {
      if (g.NetRankOf(q, i) == root) root_q = q, root_i = i;
    }
  }
  switch (g.path()) {
    case Path::kLocal:
      break;
    case Path::kShared:
      b.Shared("broadcast", [=](ici::Group& grp, int i, uint64_t* bytes) {
        return grp.Broadcast(i, root_i, buf, count, dtype, bytes);
      });
      break;
    case Path::kNetwork:
      b.Net(Level::kAll, "broadcast",
            [=](dcn::Communicator& c, const dcn::DcnGroup& dg,
                const std::string& phase) {
              return c.Broadcast(dg, root_q, buf, count, dtype, phase);
            });
      break;
    case Path::kTwoLevel: {
      // The root's host scatters the array over its devices, each host
      // position broadcasts its 1/k_l share to the other hosts, every host
      // all-gathers.
      const comm::Layout layout = comm::BalancedLayout(count, g.local_size);
      const comm::Segment mine = layout[g.local_rank][0];
      std::byte* shard = At(buf, mine.offset, es);
      if (g.net_rank == root_q) {
        const bool is_root = g.local_rank == root_i;
        b.Shared("scatter", [=](ici::Group& grp, int i, uint64_t* bytes) {
          return grp.Scatter(i, root_i, is_root ? buf : nullptr, shard, layout,
                             dtype, bytes);
        });
      }
      b.Net(Level::kAll, "broadcast",
            [=](dcn::Communicator& c, const dcn::DcnGroup& dg,
                const std::string& phase) {
              return c.Broadcast(dg, root_q, shard, mine.count, dtype, phase);
            });
      b.Shared("all-gather", [=](ici::Group& grp, int i, uint64_t* bytes) {
        return grp.AllGather(i, shard, buf, layout, dtype, bytes);
      });
      break;
    }
  }
  return Launch(what, std::move(b.phases()), state);
}

CollectiveHandle DeviceCollectives::AllToAll(const Axes& axes, const void* in,
                                             void* out, size_t count,
                                             DType dtype,
                                             const std::string& label) {
  MS_GROUP_OR_FAIL(g, axes);
  const std::string what = Describe("all_to_all", g, label);
  const size_t es = comm::SizeOf(dtype);
  auto state = std::make_shared<OpState>();
  PhaseBuilder b(runtime_, g, counters_);
  const int p = g.size, k = g.local_size, n = g.net_size;
  auto chunk = [=](int rank) { return comm::PartitionSegment(count, p, rank); };
  const size_t mine = chunk(g.rank).count;
  switch (g.path()) {
    case Path::kLocal:
      b.Local("copy", [=] { CopyElements(out, in, count, es); });
      break;
    case Path::kShared: {
      comm::Layout send(k), recv(k);
      for (int i = 0; i < k; ++i) {
        for (int j = 0; j < k; ++j) {
          send[i].push_back(chunk(j));
          recv[j].push_back({i * chunk(j).count, chunk(j).count});
        }
      }
      b.Shared("all-to-all", [=](ici::Group& grp, int i, uint64_t* bytes) {
        return grp.AllToAll(i, in, out, send, recv, dtype, bytes);
      });
      break;
    }
    case Path::kNetwork: {
      std::vector<size_t> send_counts, recv_counts(p, mine);
      for (int r = 0; r < p; ++r) send_counts.push_back(chunk(r).count);
      b.Net(Level::kByRank, "all-to-all",
            [=](dcn::Communicator& c, const dcn::DcnGroup& dg,
                const std::string& phase) {
              return c.AllToAll(dg, in, out, send_counts, recv_counts, dtype,
                                phase);
            });
      break;
    }
    case Path::kTwoLevel: {
      // 1. On the host, send each member i2 the chunks bound for position
      //    i2 of every host. 2. Between hosts, each position sends host q2
      //    the chunks bound for it. Local copies reorder between the steps.
      //    block[i2] = sum over q2 of the chunk sizes bound for (q2, i2).
      std::vector<size_t> block(k, 0), block_offset(k, 0);
      for (int i2 = 0; i2 < k; ++i2) {
        for (int q2 = 0; q2 < n; ++q2)
          block[i2] += chunk(g.NetRankOf(q2, i2)).count;
        if (i2 > 0) block_offset[i2] = block_offset[i2 - 1] + block[i2 - 1];
      }
      const int me = g.local_rank;
      std::byte* by_position = state->Scratch(count * es);        // [i2][q2]
      std::byte* from_host = state->Scratch(k * block[me] * es);  // [i][q2]
      std::byte* by_host = state->Scratch(k * block[me] * es);    // [q2][i]
      std::byte* received = state->Scratch(static_cast<size_t>(p) * mine * es);
      comm::Layout send(k), recv(k);
      for (int i = 0; i < k; ++i) {
        for (int i2 = 0; i2 < k; ++i2) {
          send[i].push_back({block_offset[i2], block[i2]});
          recv[i2].push_back({i * block[i2], block[i2]});
        }
      }
      b.Shared("all-to-all", [=](ici::Group& grp, int ii, uint64_t* bytes) {
        size_t at = 0;
        for (int i2 = 0; i2 < k; ++i2) {
          for (int q2 = 0; q2 < n; ++q2) {
            const comm::Segment c = chunk(g.NetRankOf(q2, i2));
            CopyElements(At(by_position, at, es), At(in, c.offset, es), c.count,
                         es);
            at += c.count;
          }
        }
        RETURN_IF_ERROR(
            grp.AllToAll(ii, by_position, from_host, send, recv, dtype, bytes));
        // from_host holds, for each source position i, one chunk per q2.
        size_t src = 0;
        for (int i = 0; i < k; ++i) {
          size_t dst_base = 0;
          for (int q2 = 0; q2 < n; ++q2) {
            const size_t c = chunk(g.NetRankOf(q2, me)).count;
            CopyElements(At(by_host, dst_base + i * c, es),
                         At(from_host, src, es), c, es);
            src += c;
            dst_base += k * c;
          }
        }
        return OkStatus();
      });
      std::vector<size_t> send_counts, recv_counts(n, k * mine);
      for (int q2 = 0; q2 < n; ++q2) {
        send_counts.push_back(k * chunk(g.NetRankOf(q2, me)).count);
      }
      b.Net(Level::kAll, "all-to-all",
            [=](dcn::Communicator& c, const dcn::DcnGroup& dg,
                const std::string& phase) {
              RETURN_IF_ERROR(c.AllToAll(dg, by_host, received, send_counts,
                                         recv_counts, dtype, phase));
              // received holds sources in (q, i) order; out wants rank order.
              for (int q = 0; q < n; ++q) {
                for (int i = 0; i < k; ++i) {
                  CopyElements(At(out, g.NetRankOf(q, i) * mine, es),
                               At(received, (q * k + i) * mine, es), mine, es);
                }
              }
              return OkStatus();
            });
      break;
    }
  }
  return Launch(what, std::move(b.phases()), state);
}

CollectiveHandle DeviceCollectives::Barrier(const Axes& axes,
                                            const std::string& label) {
  MS_GROUP_OR_FAIL(g, axes);
  const std::string what = Describe("barrier", g, label);
  auto state = std::make_shared<OpState>();
  PhaseBuilder b(runtime_, g, counters_);
  auto shared_barrier = [](ici::Group& grp, int i, uint64_t*) {
    return grp.Barrier(i);
  };
  auto net_barrier = [](dcn::Communicator& c, const dcn::DcnGroup& dg,
                        const std::string& phase) {
    return c.Barrier(dg, phase);
  };
  if (g.local_size > 1) b.Shared("barrier", shared_barrier);
  if (g.net_size > 1) b.Net(Level::kAll, "barrier", net_barrier);
  if (g.local_size > 1 && g.net_size > 1) b.Shared("barrier", shared_barrier);
  return Launch(what, std::move(b.phases()), state);
}

CollectiveHandle DeviceCollectives::Send(const Axes& axes, int to,
                                         const void* buf, size_t count,
                                         DType dtype,
                                         const std::string& label) {
  // The sender's buffer is only read (it is the broadcast's root).
  return Exchange(axes, to, const_cast<void*>(buf), count, dtype, label, true);
}

CollectiveHandle DeviceCollectives::Recv(const Axes& axes, int from, void* buf,
                                         size_t count, DType dtype,
                                         const std::string& label) {
  return Exchange(axes, from, buf, count, dtype, label, false);
}

CollectiveHandle DeviceCollectives::Exchange(const Axes& axes, int peer,
                                             void* buf, size_t count,
                                             DType dtype,
                                             const std::string& label,
                                             bool sending) {
  MS_GROUP_OR_FAIL(g, axes);
  const char* op = sending ? "send" : "recv";
  if (peer < 0 || peer >= g.size || peer == g.rank) {
    return Fail(InvalidArgument(
        std::string(op) + " peer " + std::to_string(peer) +
        " is not another rank of the " + std::to_string(g.size) +
        " devices over " + g.axes_label));
  }
  const int lo = std::min(g.rank, peer), hi = std::max(g.rank, peer);
  auto key = std::make_pair(axes, std::make_pair(lo, hi));
  auto it = pairs_.find(key);
  if (it == pairs_.end()) {
    Result<AxisGroup> pair = PairOf(g, peer);
    if (!pair.ok()) return Fail(pair.status());
    it = pairs_.emplace(key, std::make_unique<AxisGroup>(std::move(*pair)))
             .first;
  }
  const AxisGroup& pair = *it->second;
  // The pair's rank 0 is the lower group rank.
  const int sender = sending ? pair.rank : 1 - pair.rank;
  return BroadcastOn(pair, sender, buf, count, dtype, label, op);
}

#undef MS_GROUP_OR_FAIL

}  // namespace multislice::runtime
