// The controller's durable state: queued resources, operations and hosts in
// one SQLite database (WAL journal). Every change is one transaction, so a
// controller killed at any moment (kill -9) restarts with each record as of
// its last completed change.
//
// Schema version 1 (table meta, key "schema_version"); a database of another
// version is refused rather than guessed at. Records are JSON documents
// (QueuedResourceRecord::ToStorage and friends) keyed by name.
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
};

class Store {
 public:
  // Opens (creating when absent) the database at `path`.
  static Result<std::unique_ptr<Store>> Open(const std::string& path);
  ~Store();
  Store(const Store&) = delete;
  Store& operator=(const Store&) = delete;

  Result<StoreSnapshot> Load();
  // Applies `change` in one transaction: all of it or none.
  Status Apply(const StoreChange& change);

 private:
  explicit Store(sqlite3* db) : db_(db) {}
  Status Exec(const std::string& sql);
  sqlite3* db_;
};

}  // namespace multislice::control
