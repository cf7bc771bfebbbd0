// ICI group: collectives between the device threads of one process.
//
// Protocol of every operation (size > 1):
//   1. The member publishes its buffer pointers and the operation's
//      signature (kind, dtype, reduction, element count, root) in its slot of
//      the shared state.
//   2. "<op>:enter" barrier. After it every slot is published and every input
//      is ready; each member checks that all signatures agree.
//   3. The member does its own part with direct loads from the peers' buffers
//      and stores into them (see each operation for who moves what).
//   4. "<op>:exit" barrier: every member has finished with every buffer, so
//      all may return and reuse them. Slots are rewritten only after it.
//
// The barrier is one 64-bit word, (phase << 32) | members arrived. A member
// adds one on arrival; the last to arrive stores (phase + 1) << 32, which
// releases the others. Every member counts the phases it has passed, so
// consecutive operations (two barriers each) can never mix. Waiting spins
// for a few microseconds (cheap when every member has a core), then yields
// the core a few times (device threads often outnumber cores), then sleeps
// on a condition variable until its deadline. A member that times out takes
// its arrival back (compare-and-swap on the same word, so the phase can no
// longer complete without it), marks the group failed and wakes the others,
// who give up too: after a failure the group refuses every operation.
#include "runtime/comm/ici/group.h"

#include <immintrin.h>
#include <sched.h>

#include <atomic>
#include <cassert>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <vector>

#include "runtime/comm/reduce.h"

namespace multislice::ici {
namespace {

using Clock = std::chrono::steady_clock;
using comm::Segment;
using comm::SizeOf;

// How long a waiting member polls the barrier word before yielding its core,
// and until when it keeps yielding before it sleeps (both from its arrival).
constexpr auto kSpinTime = std::chrono::microseconds(1);
constexpr auto kYieldTime = std::chrono::microseconds(50);

enum class OpKind {
  kAllReduce,
  kReduceScatter,
  kAllGather,
  kBroadcast,
  kScatter,
  kAllToAll,
  kBarrier,
};

struct OpNames {
  const char* name;
  const char* enter;
  const char* exit;
};

OpNames NamesOf(OpKind kind) {
  switch (kind) {
    case OpKind::kAllReduce:
      return {"allreduce", "allreduce:enter", "allreduce:exit"};
    case OpKind::kReduceScatter:
      return {"reducescatter", "reducescatter:enter", "reducescatter:exit"};
    case OpKind::kAllGather:
      return {"allgather", "allgather:enter", "allgather:exit"};
    case OpKind::kBroadcast:
      return {"broadcast", "broadcast:enter", "broadcast:exit"};
    case OpKind::kScatter:
      return {"scatter", "scatter:enter", "scatter:exit"};
    case OpKind::kAllToAll:
      return {"alltoall", "alltoall:enter", "alltoall:exit"};
    case OpKind::kBarrier:
      return {"barrier", "barrier", "barrier:mismatch"};
  }
  return {"?", "?", "?"};
}

// What every member must agree on for one operation. `count` is the element
// count, or the total of a layout, so that mismatched layouts are caught too
// in the common cases.
struct Signature {
  OpKind kind = OpKind::kBarrier;
  DType dtype = DType::kF32;
  ReduceOp op = ReduceOp::kSum;
  size_t count = 0;
  int root = -1;

  bool operator==(const Signature&) const = default;
};

std::string Describe(const Signature& s) {
  std::string d = NamesOf(s.kind).name;
  if (s.kind == OpKind::kBarrier) return d;
  d.append(" of ").append(std::to_string(s.count)).append(" ");
  d.append(comm::Name(s.dtype));
  if (s.kind == OpKind::kAllReduce || s.kind == OpKind::kReduceScatter) {
    d.append(" ").append(comm::Name(s.op));
  }
  if (s.root >= 0) d.append(" from root ").append(std::to_string(s.root));
  return d;
}

size_t TotalCount(const Layout& layout) {
  size_t n = 0;
  for (size_t r = 0; r < layout.size(); ++r) {
    n += comm::OwnedCount(layout, static_cast<int>(r));
  }
  return n;
}

std::string Seconds(std::chrono::milliseconds ms) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%g", static_cast<double>(ms.count()) / 1e3);
  return buf;
}

const char* At(const void* p, size_t elems, size_t elem_size) {
  return static_cast<const char*>(p) + elems * elem_size;
}
char* At(void* p, size_t elems, size_t elem_size) {
  return static_cast<char*>(p) + elems * elem_size;
}

void AddBytes(uint64_t* bytes_sent, size_t bytes) {
  if (bytes_sent != nullptr) *bytes_sent += bytes;
}

}  // namespace

struct Group::State {
  // One member's slot. Published fields are written by the member before the
  // enter barrier and read by peers until the exit barrier.
  struct alignas(64) Member {
    const void* in = nullptr;
    void* out = nullptr;
    // Indexed by the parity of the enter phase: a Barrier has no exit
    // phase, so a fast member may publish its next operation while slow ones
    // still check this one; it cannot reach the same parity again before
    // they all arrive at the next phase.
    Signature signatures[2];
    // The number of barrier phases this member has reached; read by peers
    // only to name the missing members in a timeout message.
    std::atomic<uint32_t> arrived{0};
    // The number of barrier phases this member has passed. Own thread only.
    uint32_t passed = 0;
    // Scratch pointer arrays for ReduceNTo. Own thread only.
    std::vector<const void*> srcs;
    std::vector<void*> dsts;
  };

  State(int size, const std::string& name, std::chrono::milliseconds timeout)
      : size(size), name(name), timeout(timeout), members(new Member[size]) {
    for (int r = 0; r < size; ++r) {
      members[r].srcs.resize(size);
      members[r].dsts.resize(size);
    }
  }

  Status Begin(int rank) const;
  Status Meet(int rank, const char* phase);
  // Publishes and meets at the enter barrier, then checks that every member
  // called the same operation. On a mismatch every member sees the same
  // slots, so all of them meet once more and return the same error.
  Status Enter(int rank, const Signature& signature, const void* in, void* out);
  Status Exit(int rank, OpKind kind) { return Meet(rank, NamesOf(kind).exit); }

  // Sequentially consistent (a plain load on x86): the sleeping path relies
  // on it to pair with the last arriver's store and load of `sleepers`.
  bool PhasePassed(uint32_t phase) const {
    return static_cast<uint32_t>(word.load() >> 32) != phase;
  }
  // Takes back this member's arrival in `phase`; false if the phase has
  // completed meanwhile (the wait succeeded after all).
  bool Withdraw(uint32_t phase) {
    uint64_t cur = word.load();
    while (static_cast<uint32_t>(cur >> 32) == phase) {
      if (word.compare_exchange_weak(cur, cur - 1)) return true;
    }
    return false;
  }
  std::string MissingMembers(uint32_t phase) const {
    std::string list;
    for (int q = 0; q < size; ++q) {
      if (members[q].arrived.load(std::memory_order_relaxed) <= phase) {
        if (!list.empty()) list += ", ";
        list += std::to_string(q);
      }
    }
    return list.empty() ? "(none)" : list;
  }

  const int size;
  const std::string name;
  const std::chrono::milliseconds timeout;
  std::unique_ptr<Member[]> members;

  alignas(64) std::atomic<uint64_t> word{0};
  alignas(64) std::atomic<int> sleepers{0};
  std::atomic<bool> failed{false};
  mutable std::mutex mu;
  std::condition_variable cv;
  std::string failure;  // guarded by mu; the first member's error
};

Status Group::State::Begin(int rank) const {
  if (rank < 0 || rank >= size) {
    return InvalidArgument("ici group " + name + ": rank " +
                           std::to_string(rank) + " is outside [0, " +
                           std::to_string(size) + ")");
  }
  if (failed.load(std::memory_order_acquire)) {
    std::lock_guard<std::mutex> lock(mu);
    return FailedPrecondition(
        "ici group " + name +
        " is unusable after an earlier failure: " + failure);
  }
  return OkStatus();
}

Status Group::State::Meet(int rank, const char* phase_name) {
  Member& me = members[rank];
  const uint32_t phase = me.passed;
  me.arrived.store(phase + 1, std::memory_order_relaxed);
  const uint64_t old = word.fetch_add(1, std::memory_order_acq_rel);
  assert(static_cast<uint32_t>(old >> 32) == phase);
  if ((old & 0xffffffffu) + 1 == static_cast<uint64_t>(size)) {
    // Last to arrive: open the next phase and wake any sleeper. The store
    // and the load of `sleepers` are sequentially consistent, pairing with
    // the sleeper's increment and re-check, so no wake-up is lost.
    word.store(static_cast<uint64_t>(phase + 1) << 32);
    me.passed = phase + 1;
    if (sleepers.load() > 0) {
      { std::lock_guard<std::mutex> lock(mu); }
      cv.notify_all();
    }
    return OkStatus();
  }

  const Clock::time_point start = Clock::now();
  const Clock::time_point deadline = start + timeout;
  bool passed = false;
  while (!passed) {
    for (int i = 0; i < 8 && !passed; ++i) {
      _mm_pause();
      passed = PhasePassed(phase);
    }
    if (Clock::now() - start > kSpinTime) break;
  }
  while (!passed && Clock::now() - start < kYieldTime) {
    sched_yield();
    passed = PhasePassed(phase);
  }
  if (!passed) {
    std::unique_lock<std::mutex> lock(mu);
    sleepers.fetch_add(1);
    bool timed_out = false;
    while (!PhasePassed(phase) && !failed.load() && !timed_out) {
      timed_out = cv.wait_until(lock, deadline) == std::cv_status::timeout;
    }
    sleepers.fetch_sub(1);
    // Withdraw fails only if the phase completed meanwhile: then we passed.
    if (!PhasePassed(phase) && Withdraw(phase)) {
      if (failed.load()) {
        return Unavailable("ici group " + name + ": gave up in " + phase_name +
                           " because another member failed: " + failure);
      }
      const std::string message = "ici group " + name + ": timed out after " +
                                  Seconds(timeout) +
                                  " s waiting for member(s) " +
                                  MissingMembers(phase) + " in " + phase_name;
      failure = message;
      failed.store(true);
      lock.unlock();
      cv.notify_all();
      return DeadlineExceeded(message);
    }
  }
  me.passed = phase + 1;
  return OkStatus();
}

Status Group::State::Enter(int rank, const Signature& signature, const void* in,
                           void* out) {
  Member& me = members[rank];
  const uint32_t parity = me.passed & 1;
  me.in = in;
  me.out = out;
  me.signatures[parity] = signature;
  const OpNames names = NamesOf(signature.kind);
  RETURN_IF_ERROR(Meet(rank, names.enter));
  for (int q = 0; q < size; ++q) {
    const Signature& other = members[q].signatures[parity];
    if (other == signature) continue;
    RETURN_IF_ERROR(Meet(rank, names.exit));
    return InvalidArgument("ici group " + name + ": member " +
                           std::to_string(q) + " called " + Describe(other) +
                           " while member " + std::to_string(rank) +
                           " called " + Describe(signature));
  }
  return OkStatus();
}

Group::Group(int size, std::string name, std::chrono::milliseconds timeout)
    : size_(size),
      name_(std::move(name)),
      timeout_(timeout),
      state_(std::make_unique<State>(size, name_, timeout)) {
  assert(size >= 1);
}

Group::~Group() = default;

// Member r reduces its balanced share of every member's in and stores it into
// every member's out (one pass, ReduceNTo). It reads share_r from k - 1
// peers and writes share_r into k - 1 peers; its own in is read by the peers
// (count - share_r elements).
Status Group::AllReduce(int rank, const void* in, void* out, size_t count,
                        DType dtype, ReduceOp op, uint64_t* bytes_sent) {
  RETURN_IF_ERROR(state_->Begin(rank));
  const size_t es = SizeOf(dtype);
  if (size_ == 1) {
    if (in != out) std::memmove(out, in, count * es);
    return OkStatus();
  }
  RETURN_IF_ERROR(
      state_->Enter(rank, {OpKind::kAllReduce, dtype, op, count, -1}, in, out));
  State::Member& me = state_->members[rank];
  const Segment share = comm::PartitionSegment(count, size_, rank);
  if (share.count > 0) {
    for (int q = 0; q < size_; ++q) {
      me.srcs[q] = At(state_->members[q].in, share.offset, es);
      me.dsts[q] = At(state_->members[q].out, share.offset, es);
    }
    comm::ReduceNTo(dtype, op, me.dsts.data(), size_, me.srcs.data(), size_,
                    share.count);
  }
  RETURN_IF_ERROR(state_->Exit(rank, OpKind::kAllReduce));
  AddBytes(bytes_sent, (count - share.count + (size_ - 1) * share.count) * es);
  return OkStatus();
}

// Member r pulls its segments from every member's in and reduces them into
// its own out. Its own in is read by the peers for their segments.
Status Group::ReduceScatter(int rank, const void* in, void* out,
                            const Layout& layout, DType dtype, ReduceOp op,
                            uint64_t* bytes_sent) {
  RETURN_IF_ERROR(state_->Begin(rank));
  if (layout.size() != static_cast<size_t>(size_)) {
    return InvalidArgument("ici group " + name_ +
                           ": reduce-scatter layout has " +
                           std::to_string(layout.size()) +
                           " members, expected " + std::to_string(size_));
  }
  const size_t es = SizeOf(dtype);
  const size_t total = TotalCount(layout);
  if (size_ > 1) {
    RETURN_IF_ERROR(state_->Enter(
        rank, {OpKind::kReduceScatter, dtype, op, total, -1}, in, out));
  }
  State::Member& me = state_->members[rank];
  size_t packed = 0;
  for (const Segment& seg : layout[rank]) {
    if (seg.count > 0) {
      for (int q = 0; q < size_; ++q) {
        me.srcs[q] =
            At(size_ == 1 ? in : state_->members[q].in, seg.offset, es);
      }
      comm::ReduceN(dtype, op, At(out, packed, es), me.srcs.data(), size_,
                    seg.count);
    }
    packed += seg.count;
  }
  if (size_ == 1) return OkStatus();
  RETURN_IF_ERROR(state_->Exit(rank, OpKind::kReduceScatter));
  AddBytes(bytes_sent, (total - comm::OwnedCount(layout, rank)) * es);
  return OkStatus();
}

// Member r pulls every member's packed segments into its own out. Its own
// in is read by the k - 1 peers.
Status Group::AllGather(int rank, const void* in, void* out,
                        const Layout& layout, DType dtype,
                        uint64_t* bytes_sent) {
  RETURN_IF_ERROR(state_->Begin(rank));
  if (layout.size() != static_cast<size_t>(size_)) {
    return InvalidArgument("ici group " + name_ + ": all-gather layout has " +
                           std::to_string(layout.size()) +
                           " members, expected " + std::to_string(size_));
  }
  const size_t es = SizeOf(dtype);
  if (size_ > 1) {
    RETURN_IF_ERROR(state_->Enter(
        rank,
        {OpKind::kAllGather, dtype, ReduceOp::kSum, TotalCount(layout), -1}, in,
        out));
  }
  for (int q = 0; q < size_; ++q) {
    const void* src = size_ == 1 ? in : state_->members[q].in;
    size_t packed = 0;
    for (const Segment& seg : layout[q]) {
      const char* from = At(src, packed, es);
      char* to = At(out, seg.offset, es);
      if (from != to) std::memcpy(to, from, seg.count * es);
      packed += seg.count;
    }
  }
  if (size_ == 1) return OkStatus();
  RETURN_IF_ERROR(state_->Exit(rank, OpKind::kAllGather));
  AddBytes(bytes_sent, (size_ - 1) * comm::OwnedCount(layout, rank) * es);
  return OkStatus();
}

// The k - 1 non-root members split the buffer (balanced, in member order);
// each reads its part from the root once and writes it into every non-root
// buffer. So the root's buffer is read exactly once in total (the root
// sends count elements, as at the head of a pipeline) and a non-root member
// sends its part to the k - 2 other non-root members.
Status Group::Broadcast(int rank, int root, void* buf, size_t count,
                        DType dtype, uint64_t* bytes_sent) {
  RETURN_IF_ERROR(state_->Begin(rank));
  if (root < 0 || root >= size_) {
    return InvalidArgument("ici group " + name_ + ": broadcast root " +
                           std::to_string(root) + " is outside [0, " +
                           std::to_string(size_) + ")");
  }
  if (size_ == 1) return OkStatus();
  const size_t es = SizeOf(dtype);
  RETURN_IF_ERROR(state_->Enter(
      rank, {OpKind::kBroadcast, dtype, ReduceOp::kSum, count, root}, buf,
      buf));
  State::Member& me = state_->members[rank];
  size_t sent = count;
  if (rank != root) {
    const Segment part =
        comm::PartitionSegment(count, size_ - 1, rank < root ? rank : rank - 1);
    int m = 0;
    for (int q = 0; q < size_; ++q) {
      if (q != root) me.dsts[m++] = At(state_->members[q].out, part.offset, es);
    }
    const void* src = At(state_->members[root].in, part.offset, es);
    if (part.count > 0) {
      comm::ReduceNTo(dtype, ReduceOp::kSum, me.dsts.data(), m, &src, 1,
                      part.count);
    }
    sent = (size_ - 2) * part.count;
  }
  RETURN_IF_ERROR(state_->Exit(rank, OpKind::kBroadcast));
  AddBytes(bytes_sent, sent * es);
  return OkStatus();
}

// Member r pulls its segments from the root's in. The root's in is read by
// the peers for theirs.
Status Group::Scatter(int rank, int root, const void* in, void* out,
                      const Layout& layout, DType dtype, uint64_t* bytes_sent) {
  RETURN_IF_ERROR(state_->Begin(rank));
  if (root < 0 || root >= size_) {
    return InvalidArgument("ici group " + name_ + ": scatter root " +
                           std::to_string(root) + " is outside [0, " +
                           std::to_string(size_) + ")");
  }
  if (layout.size() != static_cast<size_t>(size_)) {
    return InvalidArgument("ici group " + name_ + ": scatter layout has " +
                           std::to_string(layout.size()) +
                           " members, expected " + std::to_string(size_));
  }
  const size_t es = SizeOf(dtype);
  const size_t total = TotalCount(layout);
  if (size_ > 1) {
    RETURN_IF_ERROR(state_->Enter(
        rank, {OpKind::kScatter, dtype, ReduceOp::kSum, total, root}, in, out));
  }
  const void* src = size_ == 1 ? in : state_->members[root].in;
  size_t packed = 0;
  for (const Segment& seg : layout[rank]) {
    const char* from = At(src, seg.offset, es);
    char* to = At(out, packed, es);
    if (from != to) std::memmove(to, from, seg.count * es);
    packed += seg.count;
  }
  if (size_ == 1) return OkStatus();
  RETURN_IF_ERROR(state_->Exit(rank, OpKind::kScatter));
  if (rank == root) {
    AddBytes(bytes_sent, (total - comm::OwnedCount(layout, rank)) * es);
  }
  return OkStatus();
}

// Member j pulls send[i][j] from every member i's in into recv[j][i] of its
// own out. Member i's in is read by the peers for what it sends them.
Status Group::AllToAll(int rank, const void* in, void* out, const Layout& send,
                       const Layout& recv, DType dtype, uint64_t* bytes_sent) {
  RETURN_IF_ERROR(state_->Begin(rank));
  const size_t k = static_cast<size_t>(size_);
  bool shapes_ok = send.size() == k && recv.size() == k;
  for (size_t i = 0; shapes_ok && i < k; ++i) {
    shapes_ok = send[i].size() == k && recv[i].size() == k;
  }
  if (!shapes_ok) {
    return InvalidArgument("ici group " + name_ +
                           ": all-to-all send and recv layouts must be " +
                           std::to_string(k) + " x " + std::to_string(k));
  }
  size_t total = 0;
  for (size_t i = 0; i < k; ++i) {
    for (size_t j = 0; j < k; ++j) {
      if (send[i][j].count != recv[j][i].count) {
        return InvalidArgument("ici group " + name_ + ": all-to-all send[" +
                               std::to_string(i) + "][" + std::to_string(j) +
                               "] has " + std::to_string(send[i][j].count) +
                               " elements but recv[" + std::to_string(j) +
                               "][" + std::to_string(i) + "] has " +
                               std::to_string(recv[j][i].count));
      }
      total += send[i][j].count;
    }
  }
  const size_t es = SizeOf(dtype);
  if (size_ > 1) {
    RETURN_IF_ERROR(state_->Enter(
        rank, {OpKind::kAllToAll, dtype, ReduceOp::kSum, total, -1}, in, out));
  }
  size_t sent = 0;
  for (int i = 0; i < size_; ++i) {
    const Segment& from = send[i][rank];
    const Segment& to = recv[rank][i];
    const void* src = size_ == 1 ? in : state_->members[i].in;
    std::memcpy(At(out, to.offset, es), At(src, from.offset, es),
                from.count * es);
    if (i != rank) sent += send[rank][i].count;
  }
  if (size_ == 1) return OkStatus();
  RETURN_IF_ERROR(state_->Exit(rank, OpKind::kAllToAll));
  AddBytes(bytes_sent, sent * es);
  return OkStatus();
}

Status Group::Barrier(int rank) {
  RETURN_IF_ERROR(state_->Begin(rank));
  if (size_ == 1) return OkStatus();
  return state_->Enter(rank, Signature{}, nullptr, nullptr);
}

std::shared_ptr<Group> Domain::GetOrCreate(const std::string& key, int size) {
  std::lock_guard<std::mutex> lock(mu_);
  std::shared_ptr<Group>& group = groups_[key];
  if (group == nullptr) {
    group = std::make_shared<Group>(size, key, timeout_);
  }
  assert(group->size() == size);
  return group;
}

}  // namespace multislice::ici
