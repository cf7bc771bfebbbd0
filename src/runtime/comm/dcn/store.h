// The rendezvous store every worker of a job meets in, and the record of the
// job's current restart attempt.
//
// Addresses: `file://DIR` (a directory every worker can reach; the default on
// one machine) or `redis://[USER:PASSWORD@]HOST:PORT` (across machines; with
// credentials, every connection authenticates first, as a Redis ACL user
// when USER is given). The store handed to
// Gloo is Gloo's own FileStore or RedisStore, wrapped so that every key is
// prefixed by "<run_id>/<attempt>/" (a restarted job never meets a stale peer)
// and every wait, including the one inside get(), is bounded by the timeout.
#pragma once

#include <gloo/rendezvous/store.h>

#include <chrono>
#include <memory>
#include <string>
#include <string_view>

#include "common/status.h"

namespace multislice::dcn {

struct StoreAddress {
  enum class Kind { kFile, kRedis };
  Kind kind = Kind::kFile;
  std::string path;      // kFile: the directory
  std::string host;      // kRedis
  int port = 6379;       // kRedis
  std::string user;      // kRedis: empty for the default user
  std::string password;  // kRedis: empty for none

  // The address without the password (for messages).
  std::string ToString() const;
};

// Parses "file://DIR" or "redis://[USER:PASSWORD@]HOST:PORT" (USER and
// PASSWORD percent-decoded). kInvalidArgument names the
// value and the accepted forms.
Result<StoreAddress> ParseStoreAddress(std::string_view address);

// Opens the store (creating a file store's directory if needed) and returns
// a Gloo store whose keys live under `prefix`. Waits are bounded by `timeout`
// and throw gloo::IoException naming the keys, as Gloo's own stores do.
Result<std::shared_ptr<gloo::rendezvous::Store>> OpenStore(
    const StoreAddress& address, const std::string& prefix,
    std::chrono::milliseconds timeout);

// Records `attempt` as the current attempt of `run_id`, unless a newer one is
// already recorded: then returns kAborted, saying both numbers. Atomic with
// respect to other callers (a lock file for file://, a Lua script for
// redis://). The record is kept outside any attempt's prefix.
Status ClaimAttempt(const StoreAddress& address, const std::string& run_id,
                    int attempt);

}  // namespace multislice::dcn
