// DCN collectives on Gloo's TCP transport.
//
// Every collective is written on Gloo's unbound buffers: a send or a receive
// names a peer rank and a 64-bit slot, and Gloo matches a send with the
// receive of the same (peer, slot) in posting order. Each transfer gets its
// own UnboundBuffer over its piece of the user's memory, so a wait is for
// exactly one transfer with exactly one peer, which is the peer an error
// names.
//
// Slots. [63..60] 0xA (Gloo's own collectives use a top byte of 0x01..0x08
// and small integers, so they never meet ours on a shared context),
// [59..28] the group id, [27..12] the group's operation sequence number,
// [11..0] the step of the algorithm. Every member of a group runs the same
// operations in the same order, so the sequence numbers agree; ops of
// different groups never share a slot.
//
// Algorithms (m members, member i, "prev"/"next" its ring neighbours):
//   - reduce-scatter: m-1 ring steps; at step s member i sends chunk
//     (i-s-1) mod m and receives chunk (i-s-2) mod m, so after the last step
//     it holds chunk i reduced over all members. Chunks are cut into
//     segments; each segment is forwarded as soon as it has been received
//     and reduced, so the steps overlap and reduction of one segment overlaps
//     the transfer of the next ones. Received segments land in a small ring
//     of kReceiveWindow scratch slots that stays in cache.
//   - all-gather: the same ring without reduction, received directly into
//     the output and forwarded from there.
//   - all-reduce: reduce-scatter over the balanced split (PartitionSegment)
//     followed by all-gather, fused into one stream of 2(m-1) steps: a
//     segment that becomes final is sent on at once as the first all-gather
//     step, and the first all-gather receives are posted at the start,
//     straight into the output. That is safe by causality: the final value of
//     a chunk can only arrive after this member's own contribution to it has
//     been computed there and has left.
//   - broadcast: a chain from the root, pipelined in segments.
//   - all-to-all: direct sends to and receives from every other member.
//   - barrier: dissemination (ceil(log2 m) rounds of one byte).
//
// Sends are posted as soon as their data is ready and never wait; receives
// are posted kReceiveWindow ahead, each as soon as the one kReceiveWindow
// before it has been consumed. A member waits only for its own receives (in
// order) and, at the end, for its sends. Because a member's progress then
// depends only on what its predecessors have sent, the pipeline cannot
// deadlock.
//
// Failures. Gloo reports a dead peer by throwing gloo::IoException from the
// waits, but only to buffers with a transfer still queued on the broken
// connection: a receive whose bytes are being read, or a send being written,
// when the connection breaks is never told, and its wait would last until the
// timeout. So every member keeps one "alarm" receive posted from every peer
// on a slot nobody sends on, all into one buffer, and a watch thread waits on
// that buffer. Gloo signals it as soon as any connection fails; the thread
// then re-posts the alarm on a fresh slot, which throws for exactly the
// connections that have failed (posting a receive is the one cheap call that
// reports a connection's state without side effects on a broken one), records
// them, and aborts the user thread's wait if it is for one of those peers. A
// wait on a peer already known to have failed only checks, without blocking,
// whether its transfer had completed (a peer that exits right after its last
// send is not a failure). A wait that runs past the timeout makes Gloo close
// every connection of the context. After any failed collective the
// communicator closes its connections (so that the peers fail fast instead of
// timing out) and refuses further work.
#include "runtime/comm/dcn/communicator.h"

#include <gloo/common/error.h>
#include <gloo/common/logging.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/unbound_buffer.h>
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "runtime/comm/dcn/gloo_errors.h"
#include "runtime/comm/reduce.h"

namespace multislice::dcn {
namespace {

using Clock = std::chrono::steady_clock;
using gloo::transport::UnboundBuffer;

// Transfers are cut into segments of at most this many bytes (Gloo's own ring
// uses up to 1 MiB), and of at least kMinSegmentBytes unless the chunk is
// smaller, aiming at kSegmentsPerChunk segments per chunk.
constexpr size_t kMaxSegmentBytes = size_t{512} << 10;
constexpr size_t kMinSegmentBytes = size_t{64} << 10;
constexpr size_t kSegmentsPerChunk = 4;
// Receives posted ahead from one peer; also the number of scratch slots of
// one segment each that reduce-scatter receives into. Posting every receive
// at once costs more CPU: a send that finds its receive already posted is
// written out by the sender's own thread, under the lock its event loop
// needs.
constexpr size_t kReceiveWindow = 4;

constexpr uint64_t kSlotTag = uint64_t{0xA} << 60;
// Never sent on: the alarm receives (one slot per generation).
constexpr uint64_t kAlarmSlot = uint64_t{0xB} << 60;
// The barrier that ends Connect.
constexpr uint64_t kConnectSlot = uint64_t{0xC} << 60;
constexpr int kMaxSteps = 1 << 12;
// An all-reduce takes 2(m-1) steps.
constexpr int kMaxGroupSize = kMaxSteps / 2;

// "Forever" for the alarm wait (a Gloo wait that times out closes every
// connection, so it must not time out); ended by abortWaitRecv.
constexpr auto kAlarmWait = std::chrono::hours(24 * 365 * 10);

uint64_t SlotBase(uint32_t group_id, uint16_t seq) {
  return kSlotTag | (uint64_t{group_id} << 28) | (uint64_t{seq} << 12);
}

std::string Seconds(std::chrono::milliseconds ms) {
  char text[32];
  std::snprintf(text, sizeof(text), "%g", ms.count() / 1000.0);
  return text;
}

void IgnoreSigpipe() {
  // Gloo writes to its sockets with writev(2); a peer that has gone away
  // would otherwise kill this process with SIGPIPE instead of letting the
  // write fail. Only a default disposition is changed.
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction current;
    if (sigaction(SIGPIPE, nullptr, &current) == 0 &&
        current.sa_handler == SIG_DFL) {
      signal(SIGPIPE, SIG_IGN);
    }
  });
}

template <typename Fn>
void ForEachSegment(size_t offset, size_t count, size_t segment_elems, Fn fn) {
  for (size_t done = 0; done < count; done += segment_elems) {
    fn(offset + done, std::min(segment_elems, count - done));
  }
}

// Elements per segment for chunks of at most `largest_chunk` elements; a
// function of values every member knows, so all members cut alike.
size_t SegmentElems(size_t largest_chunk, size_t elem_size) {
  size_t bytes = largest_chunk * elem_size / kSegmentsPerChunk;
  bytes = std::clamp(bytes, kMinSegmentBytes, kMaxSegmentBytes);
  return std::max<size_t>(1, bytes / elem_size);
}

// Watches every connection of a context for failure (see the file comment).
// Arm/Disarm/FailureOf are called by the communicator's user thread.
class FailureWatch {
 public:
  explicit FailureWatch(std::shared_ptr<gloo::Context> context)
      : context_(std::move(context)),
        failures_(context_->size),
        thread_([this] { Run(); }) {}

  ~FailureWatch() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
      if (alarm_ != nullptr) alarm_->abortWaitRecv();
    }
    thread_.join();
  }

  // Announces a wait on `buffer` for a transfer with `rank`. Returns the
  // failure of that connection if it is already known (then the caller must
  // not block), else "".
  std::string Arm(UnboundBuffer* buffer, bool recv, int rank) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!failures_[rank].empty()) return failures_[rank];
    armed_ = buffer;
    armed_recv_ = recv;
    armed_rank_ = rank;
    return "";
  }

  void Disarm() {
    std::lock_guard<std::mutex> lock(mu_);
    armed_ = nullptr;
  }

  // Gloo's message for the failed connection to `rank`, or "".
  std::string FailureOf(int rank) {
    std::lock_guard<std::mutex> lock(mu_);
    return failures_[rank];
  }

 private:
  void Run() {
    for (uint64_t generation = 0;; ++generation) {
      std::unique_ptr<UnboundBuffer> alarm;
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (stop_) return;
        alarm = PostAlarm(kAlarmSlot + generation);
        if (alarm == nullptr) return;  // No healthy connection left.
        alarm_ = alarm.get();
      }
      try {
        alarm->waitRecv(kAlarmWait);  // false: aborted at shutdown
      } catch (const std::exception&) {
        // A connection failed; the next PostAlarm finds out which.
      }
      std::lock_guard<std::mutex> lock(mu_);
      alarm_ = nullptr;
    }
  }

  // Posts a receive on `slot` from every peer not yet known to have failed,
  // recording those whose connection has (posting throws for them). The
  // receives of earlier generations stay posted and inert. Called with mu_.
  std::unique_ptr<UnboundBuffer> PostAlarm(uint64_t slot) {
    std::unique_ptr<UnboundBuffer> alarm;
    try {
      alarm = context_->createUnboundBuffer(&alarm_byte_, 0);
    } catch (const std::exception&) {
      return nullptr;  // Out of memory: stop watching; waits still time out.
    }
    int watched = 0;
    for (int r = 0; r < context_->size; ++r) {
      if (r == context_->rank || !failures_[r].empty()) continue;
      try {
        alarm->recv(r, slot, 0, 0);
        ++watched;
      } catch (const std::exception& e) {
        failures_[r] = GlooErrorMessage(e);
        if (failures_[r].empty()) failures_[r] = "connection failed";
        if (armed_ != nullptr && armed_rank_ == r) {
          if (armed_recv_) {
            armed_->abortWaitRecv();
          } else {
            armed_->abortWaitSend();
          }
          armed_ = nullptr;
        }
      }
    }
    return watched > 0 ? std::move(alarm) : nullptr;
  }

  const std::shared_ptr<gloo::Context> context_;
  char alarm_byte_ = 0;
  std::mutex mu_;
  bool stop_ = false;
  std::vector<std::string> failures_;  // by rank; "" while healthy
  UnboundBuffer* alarm_ = nullptr;
  UnboundBuffer* armed_ = nullptr;
  bool armed_recv_ = false;
  int armed_rank_ = -1;
  std::thread thread_;  // Last: starts after the members above exist.
};

// A grow-only scratch allocation, left uninitialised so that only the pages
// actually used are ever touched.
class Scratch {
 public:
  char* Get(size_t bytes) {
    if (bytes > size_) {
      data_.reset(new char[bytes]);
      size_ = bytes;
    }
    return data_.get();
  }

 private:
  std::unique_ptr<char[]> data_;
  size_t size_ = 0;
};

}  // namespace

namespace internal {

// Everything a communicator owns; Communicator::Impl is this type.
struct CommunicatorState {
  ConnectOptions options;
  std::shared_ptr<gloo::transport::Device> device;
  std::shared_ptr<gloo::rendezvous::Context> context;
  std::unique_ptr<FailureWatch> watch;  // Reset before the context.

  std::map<uint32_t, uint16_t> next_seq;  // by group id
  std::atomic<uint64_t> bytes_sent{0};
  // By destination rank; only the communicator's own thread writes them.
  std::vector<std::atomic<uint64_t>> bytes_sent_to;
  Status broken;  // The first transport failure; ok while healthy.
  std::atomic<int> broken_peer{-1};  // the rank that failure names
  Scratch receive_slots;
  Scratch scratch;

  ~CommunicatorState() {
    watch.reset();
    context.reset();
    device.reset();
  }

  const std::string& PeerName(int rank) const {
    return options.peer_names[rank];
  }

  Status MarkBroken(Status status, int peer = -1) {
    if (broken.ok()) {
      broken = status;
      broken_peer = peer;
      try {
        context->closeConnections();
      } catch (const std::exception&) {
        // Already failing; the peers will time out instead.
      }
    }
    return status;
  }
};

}  // namespace internal

struct Communicator::Impl : internal::CommunicatorState {};

namespace {

using internal::CommunicatorState;

// One pending transfer: its buffer and the group member on the other side.
struct Transfer {
  std::unique_ptr<UnboundBuffer> buffer;
  int member = -1;
};

// The state of one collective call on one group.
class Op {
 public:
  Op(CommunicatorState& impl, const DcnGroup& group, const std::string& phase)
      : Op(impl, group, phase, SlotBase(group.id, impl.next_seq[group.id]++)) {}
  Op(CommunicatorState& impl, const DcnGroup& group, const std::string& phase,
     uint64_t slot_base)
      : impl_(impl), group_(group), phase_(phase), slot_base_(slot_base) {}

  int size() const { return static_cast<int>(group_.members.size()); }
  int me() const { return group_.my_index; }
  // Member index at ring distance `d` (may be negative) from this member.
  int Ring(int d) const {
    const int m = size();
    return ((me() + d) % m + m) % m;
  }

  // Posts a receive of `bytes` from member `from` into `dst`.
  Status Recv(void* dst, size_t bytes, int from, int step, Transfer* out) {
    out->member = from;
    try {
      out->buffer = impl_.context->createUnboundBuffer(dst, bytes);
      out->buffer->recv(Rank(from), slot_base_ + static_cast<uint64_t>(step), 0,
                        bytes);
    } catch (const std::exception& e) {
      return Fail(from, e, /*timed_out=*/false);
    }
    return OkStatus();
  }

  // Posts a send of `bytes` at `src` to member `to`; WaitSends waits for it.
  Status Send(const void* src, size_t bytes, int to, int step) {
    Transfer& t = sends_.emplace_back();
    t.member = to;
    try {
      t.buffer =
          impl_.context->createUnboundBuffer(const_cast<void*>(src), bytes);
      t.buffer->send(Rank(to), slot_base_ + static_cast<uint64_t>(step), 0,
                     bytes);
    } catch (const std::exception& e) {
      return Fail(to, e, /*timed_out=*/false);
    }
    impl_.bytes_sent.fetch_add(bytes, std::memory_order_relaxed);
    impl_.bytes_sent_to[Rank(to)].fetch_add(bytes, std::memory_order_relaxed);
    return OkStatus();
  }

  // Waits for a receive posted by Recv, then releases its buffer.
  Status WaitRecv(Transfer& t) {
    RETURN_IF_ERROR(Wait(t, /*recv=*/true));
    t.buffer.reset();
    return OkStatus();
  }

  Status WaitSends() {
    while (!sends_.empty()) {
      RETURN_IF_ERROR(Wait(sends_.front(), /*recv=*/false));
      sends_.pop_front();
    }
    return OkStatus();
  }

 private:
  int Rank(int member) const { return group_.members[member]; }

  Status Wait(Transfer& t, bool recv) {
    const int rank = Rank(t.member);
    UnboundBuffer& buffer = *t.buffer;
    auto wait = [&](std::chrono::milliseconds timeout) {
      return recv ? buffer.waitRecv(timeout) : buffer.waitSend(timeout);
    };
    std::string error;
    bool timed_out = false;
    std::string failed = impl_.watch->Arm(&buffer, recv, rank);
    if (failed.empty()) {
      bool done = false;
      try {
        done = wait(impl_.options.timeout);
      } catch (const gloo::IoException& e) {
        error = GlooErrorMessage(e);
        timed_out = error.find("Timed out waiting") != std::string::npos;
      } catch (const std::exception& e) {
        error = GlooErrorMessage(e);
      }
      impl_.watch->Disarm();
      if (done) return OkStatus();
      if (error.empty()) failed = impl_.watch->FailureOf(rank);  // aborted
    }
    if (!failed.empty()) {
      // The connection has failed, but this transfer may have completed
      // before it did. Checking costs nothing more: a zero wait that fails
      // only closes connections that Failure closes anyway.
      try {
        if (wait(std::chrono::milliseconds::zero())) return OkStatus();
      } catch (const std::exception&) {
      }
      error = failed;
    }
    if (error.empty()) error = "the wait was aborted";
    return Failure(t.member, error, timed_out);
  }

  Status Fail(int member, const std::exception& e, bool timed_out) {
    return Failure(member, GlooErrorMessage(e), timed_out);
  }

  // With one buffer per transfer, an error concerns the peer of that
  // transfer.
  Status Failure(int member, const std::string& error, bool timed_out) {
    const std::string& peer = impl_.PeerName(Rank(member));
    if (timed_out) {
      return impl_.MarkBroken(
          DeadlineExceeded(peer + " did not answer within " +
                           Seconds(impl_.options.timeout) + " s during " +
                           phase_),
          Rank(member));
    }
    return impl_.MarkBroken(
        Unavailable(peer + " failed during " + phase_ + ": " + error),
        Rank(member));
  }

  CommunicatorState& impl_;
  const DcnGroup& group_;
  const std::string& phase_;
  const uint64_t slot_base_;
  std::deque<Transfer> sends_;
};

char* Bytes(void* p) { return static_cast<char*>(p); }
const char* Bytes(const void* p) { return static_cast<const char*>(p); }

// The ring reduce-scatter of the file comment over chunks
// [displs[c], +counts[c]) (in elements). Partial sums of the chunks this
// member forwards are written to `partials` (at the chunks' own offsets) and
// sent from there; the fully reduced chunk of this member goes to
// `final_out`. With `then_all_gather` (the all-reduce), partials is the
// output array, final_out its own chunk, and the all-gather half follows in
// the same stream.
Status RingReduce(Op& op, Scratch& slots, const void* in, void* partials,
                  void* final_out, const std::vector<size_t>& counts,
                  const std::vector<size_t>& displs, DType dtype,
                  ReduceOp reduce_op, bool then_all_gather) {
  const int m = op.size();
  const size_t esize = comm::SizeOf(dtype);
  const int prev = op.Ring(-1), next = op.Ring(1);
  const size_t seg_elems =
      SegmentElems(*std::max_element(counts.begin(), counts.end()), esize);
  const int last_rs_step = m - 2;
  const int last_step = then_all_gather ? 2 * m - 3 : last_rs_step;

  struct Unit {
    int step;
    size_t offset, count;  // elements of the whole array
  };
  std::vector<Unit> reduce_units, gather_units;
  for (int s = 0; s <= last_rs_step; ++s) {
    const int c = op.Ring(-s - 2);
    ForEachSegment(displs[c], counts[c], seg_elems, [&](size_t o, size_t n) {
      reduce_units.push_back({s, o, n});
    });
  }
  if (then_all_gather) {
    for (int t = 0; t <= m - 2; ++t) {
      const int c = op.Ring(-t - 1);
      ForEachSegment(displs[c], counts[c], seg_elems, [&](size_t o, size_t n) {
        gather_units.push_back({m - 1 + t, o, n});
      });
    }
  }

  char* const slot_base = slots.Get(kReceiveWindow * seg_elems * esize);
  auto slot = [&](size_t i) {
    return slot_base + (i % kReceiveWindow) * seg_elems * esize;
  };
  std::vector<Transfer> reduce_recvs(reduce_units.size());
  auto post_reduce_recv = [&](size_t i) {
    return op.Recv(slot(i), reduce_units[i].count * esize, prev,
                   reduce_units[i].step, &reduce_recvs[i]);
  };
  for (size_t i = 0; i < reduce_units.size() && i < kReceiveWindow; ++i) {
    RETURN_IF_ERROR(post_reduce_recv(i));
  }
  std::vector<Transfer> gather_recvs(gather_units.size());
  auto post_gather_recv = [&](size_t i) {
    const Unit& u = gather_units[i];
    return op.Recv(Bytes(partials) + u.offset * esize, u.count * esize, prev,
                   u.step, &gather_recvs[i]);
  };
  for (size_t i = 0; i < gather_units.size() && i < kReceiveWindow; ++i) {
    RETURN_IF_ERROR(post_gather_recv(i));
  }
  {
    const int c = op.Ring(-1);
    Status status;
    ForEachSegment(displs[c], counts[c], seg_elems, [&](size_t o, size_t n) {
      if (status.ok()) {
        status = op.Send(Bytes(in) + o * esize, n * esize, next, /*step=*/0);
      }
    });
    RETURN_IF_ERROR(status);
  }

  const size_t own_offset = displs[op.me()];
  for (size_t i = 0; i < reduce_units.size(); ++i) {
    const Unit& u = reduce_units[i];
    RETURN_IF_ERROR(op.WaitRecv(reduce_recvs[i]));
    char* dst = u.step == last_rs_step
                    ? Bytes(final_out) + (u.offset - own_offset) * esize
                    : Bytes(partials) + u.offset * esize;
    comm::Reduce2(dtype, reduce_op, dst, Bytes(in) + u.offset * esize, slot(i),
                  u.count);
    if (i + kReceiveWindow < reduce_units.size()) {
      RETURN_IF_ERROR(post_reduce_recv(i + kReceiveWindow));
    }
    if (u.step < last_step) {
      RETURN_IF_ERROR(op.Send(dst, u.count * esize, next, u.step + 1));
    }
  }
  for (size_t i = 0; i < gather_units.size(); ++i) {
    const Unit& u = gather_units[i];
    RETURN_IF_ERROR(op.WaitRecv(gather_recvs[i]));
    if (i + kReceiveWindow < gather_units.size()) {
      RETURN_IF_ERROR(post_gather_recv(i + kReceiveWindow));
    }
    if (u.step < last_step) {
      RETURN_IF_ERROR(op.Send(Bytes(partials) + u.offset * esize,
                              u.count * esize, next, u.step + 1));
    }
  }
  return op.WaitSends();
}

// Ring all-gather of chunks [displs[c], +counts[c]) into `out`; `in` holds
// this member's chunk.
Status RingAllGather(Op& op, const void* in, void* out,
                     const std::vector<size_t>& counts,
                     const std::vector<size_t>& displs, DType dtype) {
  const int m = op.size();
  const size_t esize = comm::SizeOf(dtype);
  const int prev = op.Ring(-1), next = op.Ring(1);
  const size_t seg_elems =
      SegmentElems(*std::max_element(counts.begin(), counts.end()), esize);

  struct Unit {
    int step;
    size_t offset, count;
  };
  std::vector<Unit> units;
  for (int t = 0; t <= m - 2; ++t) {
    const int c = op.Ring(-t - 1);
    ForEachSegment(displs[c], counts[c], seg_elems, [&](size_t o, size_t n) {
      units.push_back({t, o, n});
    });
  }
  std::vector<Transfer> recvs(units.size());
  auto post_recv = [&](size_t i) {
    return op.Recv(Bytes(out) + units[i].offset * esize, units[i].count * esize,
                   prev, units[i].step, &recvs[i]);
  };
  for (size_t i = 0; i < units.size() && i < kReceiveWindow; ++i) {
    RETURN_IF_ERROR(post_recv(i));
  }
  const size_t own_offset = displs[op.me()], own_count = counts[op.me()];
  {
    Status status;
    ForEachSegment(0, own_count, seg_elems, [&](size_t o, size_t n) {
      if (status.ok()) {
        status = op.Send(Bytes(in) + o * esize, n * esize, next, /*step=*/0);
      }
    });
    RETURN_IF_ERROR(status);
  }
  char* own_out = Bytes(out) + own_offset * esize;
  if (own_out != in && own_count > 0) {
    std::memmove(own_out, in, own_count * esize);
  }
  for (size_t i = 0; i < units.size(); ++i) {
    const Unit& u = units[i];
    RETURN_IF_ERROR(op.WaitRecv(recvs[i]));
    if (i + kReceiveWindow < units.size()) {
      RETURN_IF_ERROR(post_recv(i + kReceiveWindow));
    }
    if (u.step < m - 2) {
      RETURN_IF_ERROR(op.Send(Bytes(out) + u.offset * esize, u.count * esize,
                              next, u.step + 1));
    }
  }
  return op.WaitSends();
}

std::vector<size_t> Displacements(const std::vector<size_t>& counts) {
  std::vector<size_t> displs(counts.size());
  size_t offset = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    displs[i] = offset;
    offset += counts[i];
  }
  return displs;
}

size_t Sum(const std::vector<size_t>& counts) {
  size_t total = 0;
  for (size_t c : counts) total += c;
  return total;
}

// Dissemination barrier: in round r every member signals the member 2^r
// places after it and waits for the one 2^r places before it.
Status DisseminationBarrier(Op& op) {
  const int m = op.size();
  char token = 1, received = 0;
  for (int round = 0, distance = 1; distance < m; ++round, distance *= 2) {
    Transfer recv;
    RETURN_IF_ERROR(op.Recv(&received, 1, op.Ring(-distance), round, &recv));
    RETURN_IF_ERROR(op.Send(&token, 1, op.Ring(distance), round));
    RETURN_IF_ERROR(op.WaitRecv(recv));
  }
  return op.WaitSends();
}

// Runs `body` and turns anything it throws into a status, so that no
// exception leaves the communicator.
template <typename Fn>
Status Guard(const std::string& phase, Fn body) {
  try {
    return body();
  } catch (const std::exception& e) {
    return Internal(phase + ": unexpected error in the DCN transport: " +
                    GlooErrorMessage(e));
  }
}

}  // namespace

Communicator::Communicator(std::unique_ptr<Impl> impl)
    : impl_(std::move(impl)) {}

Communicator::~Communicator() = default;

Result<std::unique_ptr<Communicator>> Communicator::Connect(
    gloo::rendezvous::Store& store, const ConnectOptions& options) {
  if (options.size < 1 || options.rank < 0 || options.rank >= options.size) {
    return InvalidArgument("DCN communicator: rank " +
                           std::to_string(options.rank) + " of size " +
                           std::to_string(options.size) +
                           " is out of range (need 0 <= rank < size)");
  }
  if (options.timeout <= std::chrono::milliseconds::zero()) {
    return InvalidArgument(
        "DCN communicator: the timeout must be positive, "
        "got " +
        std::to_string(options.timeout.count()) + " ms");
  }
  if (!options.peer_names.empty() &&
      options.peer_names.size() != static_cast<size_t>(options.size)) {
    return InvalidArgument("DCN communicator: peer_names has " +
                           std::to_string(options.peer_names.size()) +
                           " names for " + std::to_string(options.size) +
                           " ranks");
  }
  IgnoreSigpipe();

  auto impl = std::make_unique<Impl>();
  impl->options = options;
  impl->bytes_sent_to =
      std::vector<std::atomic<uint64_t>>(std::max(options.size, 1));
  if (impl->options.peer_names.empty()) {
    for (int r = 0; r < options.size; ++r) {
      impl->options.peer_names.push_back("rank " + std::to_string(r));
    }
  }
  const std::string who = "rank " + std::to_string(options.rank) + " of " +
                          std::to_string(options.size) +
                          " in DCN communicator '" + options.key_prefix + "'";
  try {
    gloo::transport::tcp::attr attr;
    attr.hostname = options.hostname;
    impl->device = gloo::transport::tcp::CreateDevice(attr);
  } catch (const std::exception& e) {
    return Unavailable(who + " cannot listen on '" + options.hostname +
                       "': " + GlooErrorMessage(e));
  }
  try {
    auto context =
        std::make_shared<gloo::rendezvous::Context>(options.rank, options.size);
    context->setTimeout(options.timeout);
    if (options.key_prefix.empty()) {
      context->connectFullMesh(store, impl->device);
    } else {
      gloo::rendezvous::PrefixStore view(options.key_prefix, store);
      context->connectFullMesh(view, impl->device);
    }
    impl->context = std::move(context);
  } catch (const std::exception& e) {
    const std::string message = GlooErrorMessage(e);
    if (message.find("timeout") != std::string::npos ||
        message.find("Timed out") != std::string::npos) {
      return DeadlineExceeded(who + " did not meet all its peers within " +
                              Seconds(options.timeout) + " s: " + message);
    }
    return Unavailable(who + " cannot connect to its peers: " + message);
  }
  try {
    impl->watch = std::make_unique<FailureWatch>(impl->context);
  } catch (const std::exception& e) {
    return Unavailable(who +
                       " cannot watch its connections: " + GlooErrorMessage(e));
  }
  // Connect returns once every member can exchange data with every other.
  DcnGroup everyone{.members = {}, .my_index = options.rank, .id = 0};
  for (int r = 0; r < options.size; ++r) everyone.members.push_back(r);
  const std::string phase = "dcn:connect:" + options.key_prefix;
  Status joined = Guard(phase, [&] {
    Op op(*impl, everyone, phase, kConnectSlot);
    return DisseminationBarrier(op);
  });
  if (!joined.ok()) return joined;
  // bytes_sent() counts the collectives' traffic only.
  impl->bytes_sent.store(0);
  for (auto& b : impl->bytes_sent_to) b.store(0);
  return std::unique_ptr<Communicator>(new Communicator(std::move(impl)));
}

int Communicator::rank() const { return impl_->options.rank; }
int Communicator::size() const { return impl_->options.size; }

uint64_t Communicator::bytes_sent() const {
  return impl_->bytes_sent.load(std::memory_order_relaxed);
}

int Communicator::broken_peer() const { return impl_->broken_peer.load(); }

uint64_t Communicator::bytes_sent_to(int rank) const {
  if (rank < 0 || rank >= static_cast<int>(impl_->bytes_sent_to.size())) {
    return 0;
  }
  return impl_->bytes_sent_to[rank].load(std::memory_order_relaxed);
}

std::shared_ptr<gloo::Context> Communicator::gloo_context() {
  return impl_->context;
}

namespace {

Status CheckGroup(const CommunicatorState& impl, const DcnGroup& g,
                  const std::string& phase) {
  if (!impl.broken.ok()) {
    return Status(impl.broken.code(),
                  "DCN communicator is unusable after an earlier failure "
                  "(" +
                      impl.broken.message() + "); refused " + phase);
  }
  const int m = static_cast<int>(g.members.size());
  if (m < 1 || m > kMaxGroupSize) {
    return InvalidArgument(phase + ": a DCN group needs 1.." +
                           std::to_string(kMaxGroupSize) + " members, got " +
                           std::to_string(m));
  }
  if (g.my_index < 0 || g.my_index >= m ||
      g.members[g.my_index] != impl.options.rank) {
    return InvalidArgument(phase + ": my_index " + std::to_string(g.my_index) +
                           " does not name this process (rank " +
                           std::to_string(impl.options.rank) +
                           ") in the group");
  }
  std::vector<bool> seen(impl.options.size, false);
  for (int r : g.members) {
    if (r < 0 || r >= impl.options.size || seen[r]) {
      return InvalidArgument(phase + ": group member rank " +
                             std::to_string(r) +
                             " is out of range or repeated (communicator "
                             "size " +
                             std::to_string(impl.options.size) + ")");
    }
    seen[r] = true;
  }
  return OkStatus();
}

Status CheckCounts(const DcnGroup& g, const std::vector<size_t>& counts,
                   const std::string& what, const std::string& phase) {
  if (counts.size() != g.members.size()) {
    return InvalidArgument(
        phase + ": " + what + " has " + std::to_string(counts.size()) +
        " entries for a group of " + std::to_string(g.members.size()));
  }
  return OkStatus();
}

}  // namespace

Status Communicator::AllReduce(const DcnGroup& g, const void* in, void* out,
                               size_t count, DType dtype, ReduceOp op,
                               const std::string& phase) {
  RETURN_IF_ERROR(CheckGroup(*impl_, g, phase));
  return Guard(phase, [&]() -> Status {
    Op state(*impl_, g, phase);
    const int m = state.size();
    if (m == 1 || count == 0) {
      if (out != in && count > 0) {
        std::memmove(out, in, count * comm::SizeOf(dtype));
      }
      return OkStatus();
    }
    std::vector<size_t> counts(m), displs(m);
    for (int c = 0; c < m; ++c) {
      const comm::Segment s = comm::PartitionSegment(count, m, c);
      counts[c] = s.count;
      displs[c] = s.offset;
    }
    return RingReduce(state, impl_->receive_slots, in, out,
                      Bytes(out) + displs[state.me()] * comm::SizeOf(dtype),
                      counts, displs, dtype, op, /*then_all_gather=*/true);
  });
}

Status Communicator::ReduceScatter(const DcnGroup& g, const void* in, void* out,
                                   const std::vector<size_t>& counts,
                                   DType dtype, ReduceOp op,
                                   const std::string& phase) {
  RETURN_IF_ERROR(CheckGroup(*impl_, g, phase));
  RETURN_IF_ERROR(CheckCounts(g, counts, "counts", phase));
  return Guard(phase, [&]() -> Status {
    Op state(*impl_, g, phase);
    const size_t esize = comm::SizeOf(dtype);
    const std::vector<size_t> displs = Displacements(counts);
    const size_t own = counts[state.me()];
    if (state.size() == 1 || Sum(counts) == 0) {
      const void* src = Bytes(in) + displs[state.me()] * esize;
      if (out != src && own > 0) std::memmove(out, src, own * esize);
      return OkStatus();
    }
    // Forwarded partial sums live in scratch (only with more than two
    // members), so the input is never written.
    char* partials =
        state.size() > 2 ? impl_->scratch.Get(Sum(counts) * esize) : nullptr;
    return RingReduce(state, impl_->receive_slots, in, partials, out, counts,
                      displs, dtype, op, /*then_all_gather=*/false);
  });
}

Status Communicator::AllGather(const DcnGroup& g, const void* in, void* out,
                               const std::vector<size_t>& counts, DType dtype,
                               const std::string& phase) {
  RETURN_IF_ERROR(CheckGroup(*impl_, g, phase));
  RETURN_IF_ERROR(CheckCounts(g, counts, "counts", phase));
  return Guard(phase, [&]() -> Status {
    Op state(*impl_, g, phase);
    const std::vector<size_t> displs = Displacements(counts);
    if (state.size() == 1 || Sum(counts) == 0) {
      const size_t bytes = counts[state.me()] * comm::SizeOf(dtype);
      if (out != in && bytes > 0) std::memmove(out, in, bytes);
      return OkStatus();
    }
    return RingAllGather(state, in, out, counts, displs, dtype);
  });
}

Status Communicator::Broadcast(const DcnGroup& g, int root, void* buf,
                               size_t count, DType dtype,
                               const std::string& phase) {
  RETURN_IF_ERROR(CheckGroup(*impl_, g, phase));
  const int m = static_cast<int>(g.members.size());
  if (root < 0 || root >= m) {
    return InvalidArgument(phase + ": broadcast root " + std::to_string(root) +
                           " is not a member index of a group of " +
                           std::to_string(m));
  }
  return Guard(phase, [&]() -> Status {
    Op state(*impl_, g, phase);
    if (m == 1 || count == 0) return OkStatus();
    const size_t esize = comm::SizeOf(dtype);
    const size_t seg_elems = SegmentElems(count, esize);
    // The chain runs root, root+1, ..., root+m-1 (member indices mod m).
    const int position = (state.me() - root + m) % m;
    const bool has_next = position < m - 1;
    const int prev = state.Ring(-1), next = state.Ring(1);
    if (position == 0) {
      Status status;
      ForEachSegment(0, count, seg_elems, [&](size_t o, size_t n) {
        if (status.ok()) {
          status =
              state.Send(Bytes(buf) + o * esize, n * esize, next, /*step=*/0);
        }
      });
      RETURN_IF_ERROR(status);
      return state.WaitSends();
    }
    std::vector<Transfer> recvs;
    std::vector<std::pair<size_t, size_t>> segments;
    ForEachSegment(0, count, seg_elems,
                   [&](size_t o, size_t n) { segments.emplace_back(o, n); });
    recvs.resize(segments.size());
    auto post_recv = [&](size_t i) {
      return state.Recv(Bytes(buf) + segments[i].first * esize,
                        segments[i].second * esize, prev, 0, &recvs[i]);
    };
    for (size_t i = 0; i < segments.size() && i < kReceiveWindow; ++i) {
      RETURN_IF_ERROR(post_recv(i));
    }
    for (size_t i = 0; i < segments.size(); ++i) {
      RETURN_IF_ERROR(state.WaitRecv(recvs[i]));
      if (i + kReceiveWindow < segments.size()) {
        RETURN_IF_ERROR(post_recv(i + kReceiveWindow));
      }
      if (has_next) {
        RETURN_IF_ERROR(state.Send(Bytes(buf) + segments[i].first * esize,
                                   segments[i].second * esize, next, 0));
      }
    }
    return state.WaitSends();
  });
}

Status Communicator::AllToAll(const DcnGroup& g, const void* in, void* out,
                              const std::vector<size_t>& send_counts,
                              const std::vector<size_t>& recv_counts,
                              DType dtype, const std::string& phase) {
  RETURN_IF_ERROR(CheckGroup(*impl_, g, phase));
  RETURN_IF_ERROR(CheckCounts(g, send_counts, "send_counts", phase));
  RETURN_IF_ERROR(CheckCounts(g, recv_counts, "recv_counts", phase));
  if (send_counts[g.my_index] != recv_counts[g.my_index]) {
    return InvalidArgument(phase + ": all-to-all sends " +
                           std::to_string(send_counts[g.my_index]) +
                           " elements to itself but expects to receive " +
                           std::to_string(recv_counts[g.my_index]));
  }
  return Guard(phase, [&]() -> Status {
    Op state(*impl_, g, phase);
    const int m = state.size(), me = state.me();
    const size_t esize = comm::SizeOf(dtype);
    const std::vector<size_t> sdispls = Displacements(send_counts);
    const std::vector<size_t> rdispls = Displacements(recv_counts);
    const size_t in_bytes = Sum(send_counts) * esize;
    const size_t out_bytes = Sum(recv_counts) * esize;
    // In place (or overlapping): send from a copy of the input.
    const auto in_at = reinterpret_cast<uintptr_t>(in);
    const auto out_at = reinterpret_cast<uintptr_t>(out);
    if (in_bytes > 0 && out_bytes > 0 && in_at < out_at + out_bytes &&
        out_at < in_at + in_bytes) {
      char* copy = impl_->scratch.Get(in_bytes);
      std::memcpy(copy, in, in_bytes);
      in = copy;
    }
    std::vector<Transfer> recvs(m);
    for (int k = 1; k < m; ++k) {
      const int from = state.Ring(-k);
      if (recv_counts[from] == 0) continue;
      RETURN_IF_ERROR(state.Recv(Bytes(out) + rdispls[from] * esize,
                                 recv_counts[from] * esize, from, 0,
                                 &recvs[from]));
    }
    for (int k = 1; k < m; ++k) {
      const int to = state.Ring(k);
      if (send_counts[to] == 0) continue;
      RETURN_IF_ERROR(state.Send(Bytes(in) + sdispls[to] * esize,
                                 send_counts[to] * esize, to, 0));
    }
    if (send_counts[me] > 0) {
      std::memcpy(Bytes(out) + rdispls[me] * esize,
                  Bytes(in) + sdispls[me] * esize, send_counts[me] * esize);
    }
    for (int k = 1; k < m; ++k) {
      const int from = state.Ring(-k);
      if (recv_counts[from] == 0) continue;
      RETURN_IF_ERROR(state.WaitRecv(recvs[from]));
    }
    return state.WaitSends();
  });
}

Status Communicator::Barrier(const DcnGroup& g, const std::string& phase) {
  RETURN_IF_ERROR(CheckGroup(*impl_, g, phase));
  return Guard(phase, [&] {
    Op state(*impl_, g, phase);
    return DisseminationBarrier(state);
  });
}

}  // namespace multislice::dcn
