// SQLite persistence of the controller (see store.h).
#include "control/store.h"

#include <functional>

namespace multislice::control {
namespace {

// A prepared statement, finalized on scope exit.
class Statement {
 public:
  Statement(sqlite3* db, const char* sql) {
    if (sqlite3_prepare_v2(db, sql, -1, &stmt_, nullptr) != SQLITE_OK) {
      stmt_ = nullptr;
    }
  }
  ~Statement() { sqlite3_finalize(stmt_); }
  sqlite3_stmt* get() const { return stmt_; }
  bool ok() const { return stmt_ != nullptr; }

 private:
  sqlite3_stmt* stmt_ = nullptr;
};

Status SqlError(sqlite3* db, const std::string& what) {
  return Internal("state store: " + what + ": " + sqlite3_errmsg(db));
}

}  // namespace

Result<std::unique_ptr<Store>> Store::Open(const std::string& path) {
  sqlite3* db = nullptr;
  if (sqlite3_open_v2(
          path.c_str(), &db,
          SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX,
          nullptr) != SQLITE_OK) {
    std::string message = db ? sqlite3_errmsg(db) : "out of memory";
    sqlite3_close(db);
    return Internal("state store " + path + ": cannot open: " + message);
  }
  std::unique_ptr<Store> store(new Store(db));
  sqlite3_busy_timeout(db, 5000);
  // WAL: a crashed process loses nothing committed; synchronous=NORMAL is
  // safe against process crashes (only a power loss may drop the last
  // transactions), which is the failure this controller is built for.
  RETURN_IF_ERROR(store->Exec("PRAGMA journal_mode=WAL"));
  RETURN_IF_ERROR(store->Exec("PRAGMA synchronous=NORMAL"));
  RETURN_IF_ERROR(store->Exec(
      "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT);"
      "CREATE TABLE IF NOT EXISTS queued_resources (name TEXT PRIMARY KEY, "
      "seq INTEGER NOT NULL, doc TEXT NOT NULL);"
      "CREATE TABLE IF NOT EXISTS operations (name TEXT PRIMARY KEY, "
      "doc TEXT NOT NULL);"
      "CREATE TABLE IF NOT EXISTS hosts (id TEXT PRIMARY KEY, doc TEXT NOT "
      "NULL);"
      "INSERT OR IGNORE INTO meta VALUES ('schema_version', '1');"));
  Statement version(db, "SELECT value FROM meta WHERE key='schema_version'");
  if (!version.ok() || sqlite3_step(version.get()) != SQLITE_ROW) {
    return SqlError(db, "reading the schema version");
  }
  const std::string found =
      reinterpret_cast<const char*>(sqlite3_column_text(version.get(), 0));
  if (found != std::to_string(kStoreSchemaVersion)) {
    return FailedPrecondition("state store " + path + " has schema version " +
                              found + "; this controller reads version " +
                              std::to_string(kStoreSchemaVersion));
  }
  return store;
}

Store::~Store() { sqlite3_close(db_); }

Status Store::Exec(const std::string& sql) {
  char* error = nullptr;
  if (sqlite3_exec(db_, sql.c_str(), nullptr, nullptr, &error) != SQLITE_OK) {
    std::string message = error ? error : "unknown error";
    sqlite3_free(error);
    return Internal("state store: " + message);
  }
  return OkStatus();
}

Result<StoreSnapshot> Store::Load() {
  StoreSnapshot snapshot;
  auto read =
      [&](const char* sql,
          const std::function<Status(const nlohmann::json&)>& take) -> Status {
    Statement stmt(db_, sql);
    if (!stmt.ok()) return SqlError(db_, "preparing a read");
    int rc;
    while ((rc = sqlite3_step(stmt.get())) == SQLITE_ROW) {
      const char* text =
          reinterpret_cast<const char*>(sqlite3_column_text(stmt.get(), 0));
      nlohmann::json doc = nlohmann::json::parse(text ? text : "", nullptr,
                                                 /*allow_exceptions=*/false);
      if (doc.is_discarded()) {
        return Internal("state store: a stored document is not JSON");
      }
      RETURN_IF_ERROR(take(doc));
    }
    return rc == SQLITE_DONE ? OkStatus() : SqlError(db_, "reading");
  };
  RETURN_IF_ERROR(read("SELECT doc FROM queued_resources ORDER BY seq",
                       [&](const nlohmann::json& doc) -> Status {
                         ASSIGN_OR_RETURN(
                             QueuedResourceRecord r,
                             QueuedResourceRecord::FromStorage(doc));
                         snapshot.queued_resources.push_back(std::move(r));
                         return OkStatus();
                       }));
  RETURN_IF_ERROR(read(
      "SELECT doc FROM operations", [&](const nlohmann::json& doc) -> Status {
        ASSIGN_OR_RETURN(OperationRecord op, OperationRecord::FromStorage(doc));
        snapshot.operations.push_back(std::move(op));
        return OkStatus();
      }));
  RETURN_IF_ERROR(read("SELECT doc FROM hosts ORDER BY id",
                       [&](const nlohmann::json& doc) -> Status {
                         snapshot.hosts.push_back(doc);
                         return OkStatus();
                       }));
  return snapshot;
}

Status Store::Apply(const StoreChange& change) {
  RETURN_IF_ERROR(Exec("BEGIN IMMEDIATE"));
  auto fail = [&](const std::string& what) {
    Status s = SqlError(db_, what);
    Exec("ROLLBACK").ok();
    return s;
  };
  auto put = [&](const char* sql, const std::string& key,
                 const std::string& doc, const int64_t* seq) -> bool {
    Statement stmt(db_, sql);
    if (!stmt.ok()) return false;
    int i = 1;
    sqlite3_bind_text(stmt.get(), i++, key.c_str(), -1, SQLITE_TRANSIENT);
    if (seq) sqlite3_bind_int64(stmt.get(), i++, *seq);
    sqlite3_bind_text(stmt.get(), i++, doc.c_str(), -1, SQLITE_TRANSIENT);
    return sqlite3_step(stmt.get()) == SQLITE_DONE;
  };
  for (const QueuedResourceRecord& r : change.put_queued_resources) {
    if (!put("INSERT OR REPLACE INTO queued_resources VALUES (?, ?, ?)", r.name,
             r.ToStorage().dump(), &r.seq)) {
      return fail("writing queued resource " + r.name);
    }
  }
  for (const std::string& name : change.delete_queued_resources) {
    Statement stmt(db_, "DELETE FROM queued_resources WHERE name = ?");
    if (!stmt.ok()) return fail("deleting");
    sqlite3_bind_text(stmt.get(), 1, name.c_str(), -1, SQLITE_TRANSIENT);
    if (sqlite3_step(stmt.get()) != SQLITE_DONE) {
      return fail("deleting queued resource " + name);
    }
  }
  for (const OperationRecord& op : change.put_operations) {
    if (!put("INSERT OR REPLACE INTO operations VALUES (?, ?)", op.name,
             op.ToStorage().dump(), nullptr)) {
      return fail("writing operation " + op.name);
    }
  }
  for (const nlohmann::json& host : change.put_hosts) {
    if (!put("INSERT OR REPLACE INTO hosts VALUES (?, ?)",
             host.at("id").get<std::string>(), host.dump(), nullptr)) {
      return fail("writing a host");
    }
  }
  if (sqlite3_exec(db_, "COMMIT", nullptr, nullptr, nullptr) != SQLITE_OK) {
    return fail("committing");
  }
  return OkStatus();
}

}  // namespace multislice::control
