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
  std::vector<std::vector<std::byte>> scratch;

  std::byte* Scratch(size_t bytes) {
    scratch.emplace_back(bytes);
    return scratch.back().data();
  }
};

Status CollectiveHandle::Wait() {
  if (!op_) return OkStatus();
  std::unique_lock<std::mutex> lock(op_->mu);
  op_->cv.wait(lock, [&] { return op_->done; });
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
  std::string name;
  std::function<Status()> body;
};

DeviceCollectives::DeviceCollectives(Runtime& runtime, int device_id)
    : runtime_(runtime),
      device_id_(device_id),
      streams_(std::make_unique<Streams>(device_id)) {}

DeviceCollectives::~DeviceCollectives() = default;

Result<const AxisGroup*> DeviceCollectives::Group(const Axes& axes) {
  auto it = groups_.find(axes);
  if (it != groups_.end()) return it->second.get();
  ASSIGN_OR_RETURN(
      AxisGroup g,
      MakeAxisGroup(runtime_.mesh(), runtime_.devices(), axes, device_id_));
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
  op->num_phases = static_cast<int>(phases.size());
  if (phases.empty()) {
    op->done = true;
    return CollectiveHandle(op);
  }
  // A phase waits for its predecessor at most this long; the predecessor's
  // own waits are bounded by the timeout, so this only guards against bugs.
  const auto guard = runtime_.timeout() * 3;
  std::shared_ptr<OpState> dependency = after.op_;
  Trace* trace = runtime_.trace();
  const int device = device_id_;
  for (int i = 0; i < op->num_phases; ++i) {
    CollectivePhase& phase = phases[i];
    Stream& stream = phase.on_dcn ? streams_->dcn : streams_->ici;
    const Track track = phase.on_dcn ? Track::kDcn : Track::kIci;
    stream.Enqueue([op, i, guard, trace, device, track,
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
      const bool run = op->status.ok();
      lock.unlock();
      Status s;
      if (run) {
        ScopedSpan span(trace, device, track, op->what + " " + name);
        s = body();
      }
      lock.lock();
      if (!s.ok() && op->status.ok()) {
        op->status = s.WithContext(op->what + ", " + name + " phase");
      }
      op->phases_started_after = std::max(op->phases_started_after, i + 1);
      if (++op->phases_finished == op->num_phases) op->done = true;
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

// The chunk sizes of the balanced split of `count` over a group of `p`,
// listed for the column members d = 0..m-1 at ICI position j.
std::vector<size_t> ColumnCounts(const AxisGroup& g, size_t count, int j) {
  std::vector<size_t> counts;
  for (int d = 0; d < g.dcn_size; ++d) {
    counts.push_back(
        comm::PartitionSegment(count, g.size, g.RankOf(d, j)).count);
  }
  return counts;
}

// Member j' of the ICI part owns the group chunks RankOf(d, j') for every d.
comm::Layout ColumnLayout(const AxisGroup& g, size_t count) {
  comm::Layout layout(g.ici_size);
  for (int j = 0; j < g.ici_size; ++j) {
    for (int d = 0; d < g.dcn_size; ++d) {
      layout[j].push_back(
          comm::PartitionSegment(count, g.size, g.RankOf(d, j)));
    }
  }
  return layout;
}

size_t Sum(const std::vector<size_t>& v) {
  size_t s = 0;
  for (size_t x : v) s += x;
  return s;
}

// Builds the phases of one collective on one group.
class PhaseBuilder {
 public:
  PhaseBuilder(Runtime& runtime, const AxisGroup& g,
               comm::TrafficCounters& counters)
      : runtime_(runtime), g_(g), counters_(counters) {}

  using IciFn = std::function<Status(ici::Group&, int j, uint64_t* bytes)>;
  using DcnFn = std::function<Status(dcn::Communicator&, const dcn::DcnGroup&,
                                     const std::string& phase)>;

  void Ici(std::string name, IciFn fn) {
    std::shared_ptr<ici::Group> group =
        runtime_.ici_domain().GetOrCreate(g_.ici_key, g_.ici_size);
    comm::TrafficCounters* counters = &counters_;
    const int j = g_.ici_rank;
    phases_.push_back({false, std::move(name), [group, counters, j, fn] {
                         uint64_t bytes = 0;
                         Status s = fn(*group, j, &bytes);
                         counters->ici_bytes_sent += bytes;
                         return s;
                       }});
  }

  void Dcn(std::string name, DcnFn fn) {
    dcn::Communicator* comm = runtime_.dcn(g_.column);
    dcn::DcnGroup group;
    const int hosts = runtime_.accelerator().hosts_per_slice();
    for (int d = 0; d < g_.dcn_size; ++d) {
      const mesh::Device& peer =
          runtime_.devices()[g_.members[g_.RankOf(d, g_.ici_rank)]];
      group.members.push_back(peer.slice_index * hosts + peer.host);
    }
    group.my_index = g_.dcn_rank;
    group.id = g_.dcn_id;
    comm::TrafficCounters* counters = &counters_;
    std::string phase = name;
    phases_.push_back(
        {true, std::move(name), [comm, group, counters, fn, phase] {
           if (comm == nullptr) return Internal("no DCN communicator");
           const uint64_t before = comm->bytes_sent();
           Status s = fn(*comm, group, phase);
           counters->dcn_bytes_sent += comm->bytes_sent() - before;
           return s;
         }});
  }

  void Local(std::string name, std::function<void()> fn) {
    phases_.push_back({false, std::move(name), [fn] {
                         fn();
                         return OkStatus();
                       }});
  }

  std::vector<CollectivePhase>& phases() { return phases_; }

 private:
  Runtime& runtime_;
  const AxisGroup& g_;
  comm::TrafficCounters& counters_;
  std::vector<CollectivePhase> phases_;
};

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
    case Path::kIci:
      b.Ici("ici all-reduce", [=](ici::Group& grp, int j, uint64_t* bytes) {
        return grp.AllReduce(j, in, out, count, dtype, op, bytes);
      });
      break;
    case Path::kDcn:
      b.Dcn("dcn all-reduce", [=](dcn::Communicator& c, const dcn::DcnGroup& dg,
                                  const std::string& phase) {
        return c.AllReduce(dg, in, out, count, dtype, op, phase);
      });
      break;
    case Path::kTwoLevel: {
      // Reduce-scatter in the slice, all-reduce this device's shard with the
      // same shard of the other slices, all-gather in the slice.
      const comm::Layout layout = comm::BalancedLayout(count, g.ici_size);
      const comm::Segment mine = layout[g.ici_rank][0];
      std::byte* shard = At(out, mine.offset, es);
      b.Ici("ici reduce-scatter", [=](ici::Group& grp, int j, uint64_t* bytes) {
        return grp.ReduceScatter(j, in, shard, layout, dtype, op, bytes);
      });
      b.Dcn("dcn all-reduce", [=](dcn::Communicator& c, const dcn::DcnGroup& dg,
                                  const std::string& phase) {
        return c.AllReduce(dg, shard, shard, mine.count, dtype, op, phase);
      });
      b.Ici("ici all-gather", [=](ici::Group& grp, int j, uint64_t* bytes) {
        return grp.AllGather(j, shard, out, layout, dtype, bytes);
      });
      break;
    }
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
  switch (g.path()) {
    case Path::kLocal:
      b.Local("copy", [=] { CopyElements(out, in, count, es); });
      break;
    case Path::kIci: {
      const comm::Layout layout = comm::BalancedLayout(count, g.ici_size);
      b.Ici("ici reduce-scatter", [=](ici::Group& grp, int j, uint64_t* bytes) {
        return grp.ReduceScatter(j, in, out, layout, dtype, op, bytes);
      });
      break;
    }
    case Path::kDcn: {
      const std::vector<size_t> counts = ColumnCounts(g, count, 0);
      b.Dcn("dcn reduce-scatter",
            [=](dcn::Communicator& c, const dcn::DcnGroup& dg,
                const std::string& phase) {
              return c.ReduceScatter(dg, in, out, counts, dtype, op, phase);
            });
      break;
    }
    case Path::kTwoLevel: {
      // ICI member j reduces, over the slice, every chunk whose ICI position
      // is j (one per slice of the column); the column then reduce-scatters
      // those, so member d keeps chunk RankOf(d, j), which is its own.
      const comm::Layout layout = ColumnLayout(g, count);
      const std::vector<size_t> counts = ColumnCounts(g, count, g.ici_rank);
      std::byte* packed = state->Scratch(Sum(counts) * es);
      b.Ici("ici reduce-scatter", [=](ici::Group& grp, int j, uint64_t* bytes) {
        return grp.ReduceScatter(j, in, packed, layout, dtype, op, bytes);
      });
      b.Dcn("dcn reduce-scatter",
            [=](dcn::Communicator& c, const dcn::DcnGroup& dg,
                const std::string& phase) {
              return c.ReduceScatter(dg, packed, out, counts, dtype, op, phase);
            });
      break;
    }
  }
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
  switch (g.path()) {
    case Path::kLocal:
      b.Local("copy", [=] { CopyElements(out, in, count, es); });
      break;
    case Path::kIci: {
      const comm::Layout layout = comm::BalancedLayout(count, g.ici_size);
      b.Ici("ici all-gather", [=](ici::Group& grp, int j, uint64_t* bytes) {
        return grp.AllGather(j, in, out, layout, dtype, bytes);
      });
      break;
    }
    case Path::kDcn: {
      const std::vector<size_t> counts = ColumnCounts(g, count, 0);
      b.Dcn("dcn all-gather", [=](dcn::Communicator& c, const dcn::DcnGroup& dg,
                                  const std::string& phase) {
        return c.AllGather(dg, in, out, counts, dtype, phase);
      });
      break;
    }
    case Path::kTwoLevel: {
      // The column gathers the chunks at this ICI position, then the slice
      // gathers every column's chunks.
      const comm::Layout layout = ColumnLayout(g, count);
      const std::vector<size_t> counts = ColumnCounts(g, count, g.ici_rank);
      std::byte* packed = state->Scratch(Sum(counts) * es);
      b.Dcn("dcn all-gather", [=](dcn::Communicator& c, const dcn::DcnGroup& dg,
                                  const std::string& phase) {
        return c.AllGather(dg, in, packed, counts, dtype, phase);
      });
      b.Ici("ici all-gather", [=](ici::Group& grp, int j, uint64_t* bytes) {
        return grp.AllGather(j, packed, out, layout, dtype, bytes);
      });
      break;
    }
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
  const std::string what = Describe("broadcast", g, label);
  const size_t es = comm::SizeOf(dtype);
  auto state = std::make_shared<OpState>();
  PhaseBuilder b(runtime_, g, counters_);
  const int root_index = static_cast<int>(
      std::find(g.rank_of.begin(), g.rank_of.end(), root) - g.rank_of.begin());
  const int root_d = root_index / g.ici_size, root_j = root_index % g.ici_size;
  switch (g.path()) {
    case Path::kLocal:
      break;
    case Path::kIci:
      b.Ici("ici broadcast", [=](ici::Group& grp, int j, uint64_t* bytes) {
        return grp.Broadcast(j, root_j, buf, count, dtype, bytes);
      });
      break;
    case Path::kDcn:
      b.Dcn("dcn broadcast", [=](dcn::Communicator& c, const dcn::DcnGroup& dg,
                                 const std::string& phase) {
        return c.Broadcast(dg, root_d, buf, count, dtype, phase);
      });
      break;
    case Path::kTwoLevel: {
      // The root's slice scatters the array over its devices, each column
      // broadcasts its 1/k share across slices, every slice all-gathers.
      const comm::Layout layout = comm::BalancedLayout(count, g.ici_size);
      const comm::Segment mine = layout[g.ici_rank][0];
      std::byte* shard = At(buf, mine.offset, es);
      if (g.dcn_rank == root_d) {
        const bool is_root = g.ici_rank == root_j;
        b.Ici("ici scatter", [=](ici::Group& grp, int j, uint64_t* bytes) {
          return grp.Scatter(j, root_j, is_root ? buf : nullptr, shard, layout,
                             dtype, bytes);
        });
      }
      b.Dcn("dcn broadcast", [=](dcn::Communicator& c, const dcn::DcnGroup& dg,
                                 const std::string& phase) {
        return c.Broadcast(dg, root_d, shard, mine.count, dtype, phase);
      });
      b.Ici("ici all-gather", [=](ici::Group& grp, int j, uint64_t* bytes) {
        return grp.AllGather(j, shard, buf, layout, dtype, bytes);
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
  const int p = g.size, k = g.ici_size, m = g.dcn_size;
  auto chunk = [=](int rank) { return comm::PartitionSegment(count, p, rank); };
  const size_t mine = chunk(g.rank).count;
  switch (g.path()) {
    case Path::kLocal:
      b.Local("copy", [=] { CopyElements(out, in, count, es); });
      break;
    case Path::kIci: {
      comm::Layout send(k), recv(k);
      for (int i = 0; i < k; ++i) {
        for (int j = 0; j < k; ++j) {
          send[i].push_back(chunk(j));
          recv[j].push_back({i * chunk(j).count, chunk(j).count});
        }
      }
      b.Ici("ici all-to-all", [=](ici::Group& grp, int j, uint64_t* bytes) {
        return grp.AllToAll(j, in, out, send, recv, dtype, bytes);
      });
      break;
    }
    case Path::kDcn: {
      std::vector<size_t> send_counts, recv_counts(m, mine);
      for (int d = 0; d < m; ++d) send_counts.push_back(chunk(d).count);
      b.Dcn("dcn all-to-all", [=](dcn::Communicator& c, const dcn::DcnGroup& dg,
                                  const std::string& phase) {
        return c.AllToAll(dg, in, out, send_counts, recv_counts, dtype, phase);
      });
      break;
    }
    case Path::kTwoLevel: {
      // 1. Inside the slice, send each column j2 the chunks bound for column
      //    j2 of every slice. 2. Across slices, each column sends slice d2
      //    the chunks bound for it. Local copies reorder between the steps.
      //    block[j2] = sum over d2 of the chunk sizes bound for (d2, j2).
      std::vector<size_t> block(k, 0), block_offset(k, 0);
      for (int j2 = 0; j2 < k; ++j2) {
        for (int d2 = 0; d2 < m; ++d2)
          block[j2] += chunk(g.RankOf(d2, j2)).count;
        if (j2 > 0) block_offset[j2] = block_offset[j2 - 1] + block[j2 - 1];
      }
      const int j = g.ici_rank;
      std::byte* by_column = state->Scratch(count * es);          // [j2][d2]
      std::byte* from_slice = state->Scratch(k * block[j] * es);  // [i][d2]
      std::byte* by_slice = state->Scratch(k * block[j] * es);    // [d2][i]
      std::byte* received = state->Scratch(static_cast<size_t>(p) * mine * es);
      comm::Layout send(k), recv(k);
      for (int i = 0; i < k; ++i) {
        for (int j2 = 0; j2 < k; ++j2) {
          send[i].push_back({block_offset[j2], block[j2]});
          recv[j2].push_back({i * block[j2], block[j2]});
        }
      }
      b.Ici("ici all-to-all", [=](ici::Group& grp, int jj, uint64_t* bytes) {
        size_t at = 0;
        for (int j2 = 0; j2 < k; ++j2) {
          for (int d2 = 0; d2 < m; ++d2) {
            const comm::Segment c = chunk(g.RankOf(d2, j2));
            CopyElements(At(by_column, at, es), At(in, c.offset, es), c.count,
                         es);
            at += c.count;
          }
        }
        RETURN_IF_ERROR(
            grp.AllToAll(jj, by_column, from_slice, send, recv, dtype, bytes));
        // from_slice holds, for each source column i, one chunk per d2.
        size_t src = 0;
        for (int i = 0; i < k; ++i) {
          size_t dst_base = 0;
          for (int d2 = 0; d2 < m; ++d2) {
            const size_t n = chunk(g.RankOf(d2, j)).count;
            CopyElements(At(by_slice, dst_base + i * n, es),
                         At(from_slice, src, es), n, es);
            src += n;
            dst_base += k * n;
          }
        }
        return OkStatus();
      });
      std::vector<size_t> send_counts, recv_counts(m, k * mine);
      for (int d2 = 0; d2 < m; ++d2) {
        send_counts.push_back(k * chunk(g.RankOf(d2, j)).count);
      }
      b.Dcn("dcn all-to-all", [=](dcn::Communicator& c, const dcn::DcnGroup& dg,
                                  const std::string& phase) {
        RETURN_IF_ERROR(c.AllToAll(dg, by_slice, received, send_counts,
                                   recv_counts, dtype, phase));
        // received holds sources in (d, i) order; out wants rank order.
        for (int d = 0; d < m; ++d) {
          for (int i = 0; i < k; ++i) {
            CopyElements(At(out, g.RankOf(d, i) * mine, es),
                         At(received, (d * k + i) * mine, es), mine, es);
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
  auto ici_barrier = [](ici::Group& grp, int j, uint64_t*) {
    return grp.Barrier(j);
  };
  auto dcn_barrier = [](dcn::Communicator& c, const dcn::DcnGroup& dg,
                        const std::string& phase) {
    return c.Barrier(dg, phase);
  };
  if (g.ici_size > 1) b.Ici("ici barrier", ici_barrier);
  if (g.dcn_size > 1) b.Dcn("dcn barrier", dcn_barrier);
  if (g.ici_size > 1 && g.dcn_size > 1) b.Ici("ici barrier", ici_barrier);
  return Launch(what, std::move(b.phases()), state);
}

#undef MS_GROUP_OR_FAIL

}  // namespace multislice::runtime
