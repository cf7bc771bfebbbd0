// A bound on the connections one client address holds on a server at once.
//
// cpp-httplib 0.11 runs one thread per connection and offers no hook
// between accept() and the first request, so a client that sends slowly can
// hold every thread. ConnectionGate is the server's task queue (a thread
// pool): its enqueue() runs on the accept thread right after accept(), and
// finds the connection just accepted among this process's descriptors (the
// connected TCP socket on the listening port whose inode it has not seen).
// When that connection's address already holds `max_per_address`, the gate
// shuts it down before a thread reads from it. Descriptors are re-checked
// at each accept, so closed connections stop counting.
//
// Thread-safety: enqueue() from the accept thread only, as cpp-httplib calls
// it; the pool's threads run the tasks.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "control/http.h"

namespace multislice::control {

class ConnectionGate : public httplib::TaskQueue {
 public:
  // `port`: the listening port (known once bound, before the first accept).
  ConnectionGate(size_t threads, int max_per_address, const int* port)
      : pool_(threads), max_per_address_(max_per_address), port_(port) {}

  void enqueue(std::function<void()> fn) override;
  void shutdown() override { pool_.shutdown(); }

  // Connections refused so far.
  int64_t refused() const { return refused_; }

 private:
  struct Connection {
    int fd;
    std::string address;
  };
  // Drops closed connections, then records the new ones; returns the
  // newest (highest descriptor) of those, if any.
  const Connection* Track();

  httplib::ThreadPool pool_;
  const int max_per_address_;
  const int* port_;
  std::map<ino_t, Connection> open_;  // by socket inode
  int64_t refused_ = 0;
};

}  // namespace multislice::control
