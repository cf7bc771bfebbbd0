// DCN: collectives between host processes over Gloo's TCP transport.
//
// A Communicator is one Gloo context: a full mesh of TCP pairs between `size`
// processes, formed through the rendezvous store under a key prefix. The
// runtime makes one per device column (the devices with the same local index
// in every slice), so that k columns move data over k independent streams at
// once, as the hosts of TPU slices do.
//
// Collectives run on any subgroup of the communicator's ranks: a DcnGroup
// lists the member ranks in group order. The algorithms are our own, written
// on Gloo's unbound buffers (send/recv by rank and slot) so that they can use
// uneven splits, count bytes, and name the peer and phase of a failure: ring
// reduce-scatter / all-gather / all-reduce pipelined in segments (reduction of
// one segment overlaps the transfer of the next), direct all-to-all, a
// pipelined chain broadcast, and a dissemination barrier.
//
// Thread-safety: one thread at a time per Communicator (the device's DCN
// stream). Every wait is bounded by the timeout; a peer that dies or stops
// answering ends the call in kUnavailable / kDeadlineExceeded with a message
// that names the peer (by the name given in ConnectOptions::peer_names) and
// the phase.
#pragma once

#include <gloo/context.h>
#include <gloo/rendezvous/store.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "runtime/comm/types.h"

namespace multislice::dcn {

using comm::DType;
using comm::ReduceOp;

struct ConnectOptions {
  int rank = 0;
  int size = 1;
  // Address to bind and advertise (this host's DCN address).
  std::string hostname = "127.0.0.1";
  // Keys of this communicator in the store, e.g. "dcn/col3".
  std::string key_prefix;
  std::chrono::milliseconds timeout{60000};
  // Human names of every rank for error messages, e.g. "slice 1 worker 0".
  std::vector<std::string> peer_names;
};

// A subgroup of a communicator's ranks. `members[i]` is the communicator rank
// of group member i; this process is members[my_index].
struct DcnGroup {
  std::vector<int> members;
  int my_index = 0;
  // Identifies the group among the communicator's groups; every member must
  // use the same id (the runtime derives it from mesh axes and coordinates).
  uint32_t id = 0;
};

class Communicator {
 public:
  static Result<std::unique_ptr<Communicator>> Connect(
      gloo::rendezvous::Store& store, const ConnectOptions& options);
  ~Communicator();

  int rank() const;
  int size() const;

  // out = op over every member's in; in == out allowed. `phase` names the
  // operation in error messages (e.g. "dcn:all_reduce:layer3").
  Status AllReduce(const DcnGroup& g, const void* in, void* out, size_t count,
                   DType dtype, ReduceOp op, const std::string& phase);

  // in holds sum(counts) elements; member i's out receives the reduction of
  // elements [sum(counts[0..i)), +counts[i]).
  Status ReduceScatter(const DcnGroup& g, const void* in, void* out,
                       const std::vector<size_t>& counts, DType dtype,
                       ReduceOp op, const std::string& phase);

  // Member i's in holds counts[i] elements; every out receives all members'
  // inputs concatenated in member order.
  Status AllGather(const DcnGroup& g, const void* in, void* out,
                   const std::vector<size_t>& counts, DType dtype,
                   const std::string& phase);

  // Member `root`'s buf is copied into every member's buf.
  Status Broadcast(const DcnGroup& g, int root, void* buf, size_t count,
                   DType dtype, const std::string& phase);

  // send_counts[j]: elements of in (packed in member order) for member j;
  // recv_counts[i]: elements from member i, packed in member order in out.
  Status AllToAll(const DcnGroup& g, const void* in, void* out,
                  const std::vector<size_t>& send_counts,
                  const std::vector<size_t>& recv_counts, DType dtype,
                  const std::string& phase);

  Status Barrier(const DcnGroup& g, const std::string& phase);

  // Total bytes this process has sent through this communicator.
  uint64_t bytes_sent() const;
  // The part of it sent to communicator rank `rank`.
  uint64_t bytes_sent_to(int rank) const;

  // The rank the first transport failure named (a peer that died or did not
  // answer), or -1 while healthy. Safe from any thread.
  int broken_peer() const;

  // The underlying Gloo context, for baselines that run Gloo's own
  // algorithms on the same connections.
  std::shared_ptr<gloo::Context> gloo_context();

 private:
  struct Impl;
  explicit Communicator(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace multislice::dcn
