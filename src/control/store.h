// The controller's durable state: queued resources, operations and hosts in
// one SQLite database (WAL journal). Every change is one transaction, so a
// controller killed at any moment (kill -9) restarts with each record as of
// its last completed change.
//
// Schema version 1 (table meta, key "schema_version"); a database of another
// version is refused rather than guessed at. Records are JSON documents
// (QueuedResourceRecord::ToStorage and friends) keyed by name.
//
// One controller per data directory: Open() takes LockDataDir() on the
// database's directory, so a second controller started on the same
// directory is refused instead of writing the same database. The database
// and its -wal and -shm files are mode 0600 (they hold every startup
// script).
//
// Thread-safety: none; the controller calls it under its own lock.
#pragma once

#include <sqlite3.h>

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/status.h"
#include "control/api_types.h"

namespace multislice::control {

inline constexpr int kStoreSchemaVersion = 1;

struct StoreSnapshot {
  std::vector<QueuedResourceRecord> queued_resources;  // by seq
  std::vector<OperationRecord> operations;
  std::vector<nlohmann::json> hosts;  // the controller's host documents
};

// What one transaction writes.
struct StoreChange {
  std::vector<QueuedResourceRecord> put_queued_resources;
  std::vector<std::string> delete_queued_resources;  // by name
  std::vector<OperationRecord> put_operations;
  std::vector<nlohmann::json> put_hosts;  // each with a string "id"
  std::vector<std::string> delete_hosts;  // by id
};

// An exclusive lock on a data directory, held until destruction (or the
// end of the process: a killed controller leaves nothing to clean up).
class DataDirLock {
 public:
  DataDirLock() = default;  // holds nothing
  DataDirLock(DataDirLock&& other) noexcept;
  DataDirLock& operator=(DataDirLock&& other) noexcept;
  ~DataDirLock();

  bool held() const { return fd_ >= 0; }
  const std::string& dir() const { return dir_; }

 private:
  friend Result<DataDirLock> LockDataDir(const std::string& dir);
  DataDirLock(int fd, std::string dir) : fd_(fd), dir_(std::move(dir)) {}
  int fd_ = -1;
  std::string dir_;
};

// Takes an exclusive flock(2) on DIR/controller.lock (created mode 0600)
// and writes this process's pid in it. While it is held, another attempt
// (from another process, or another call in this one: flock locks belong
// to the open file) fails with FailedPrecondition "data directory DIR is in
// use by another controller (pid N); stop it first or choose another
// --data-dir". Does not wait.
Result<DataDirLock> LockDataDir(const std::string& dir);

class Store {
 public:
  // Opens (creating when absent, mode 0600) the database at `path`, holding
  // LockDataDir() on its directory for the store's lifetime.
  static Result<std::unique_ptr<Store>> Open(const std::string& path);
  // The same with the lock of the database's directory already taken by
  // the caller (taken early, before other work in the directory); the
  // store keeps it. `lock` must be held.
  static Result<std::unique_ptr<Store>> Open(const std::string& path,
                                             DataDirLock lock);
  ~Store();
  Store(const Store&) = delete;
  Store& operator=(const Store&) = delete;

  Result<StoreSnapshot> Load();
  // Applies `change` in one transaction: all of it or none. Any failure
  // (SQLite, a record that cannot be serialized such as a string that is
  // not UTF-8, a host without an "id") rolls the transaction back and is
  // returned as an error; the store stays usable for the next change.
  Status Apply(const StoreChange& change);

 private:
  Store(sqlite3* db, DataDirLock lock) : db_(db), lock_(std::move(lock)) {}
  Status Exec(const std::string& sql);
  Status CreateSchema(const std::string& path);
  // The statements of Apply(), inside its transaction; may throw.
  Status WriteChange(const StoreChange& change);
  sqlite3* db_;
  DataDirLock lock_;
};

}  // namespace multislice::control
