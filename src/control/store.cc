// SQLite persistence of the controller (see store.h).
#include "control/store.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <functional>
#include <utility>

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

// One write transaction: Begin() runs BEGIN IMMEDIATE; unless Commit()
// succeeded, destruction rolls back, so that an error or an exception
// anywhere in between never leaves a transaction open (which would make
// every later BEGIN fail).
class Transaction {
 public:
  explicit Transaction(sqlite3* db) : db_(db) {}
  Transaction(const Transaction&) = delete;
  Transaction& operator=(const Transaction&) = delete;
  ~Transaction() {
    // SQLite may have rolled back already (e.g. on SQLITE_FULL).
    if (begun_ && !committed_ && sqlite3_get_autocommit(db_) == 0) {
      sqlite3_exec(db_, "ROLLBACK", nullptr, nullptr, nullptr);
    }
  }

  Status Begin() {
    if (sqlite3_exec(db_, "BEGIN IMMEDIATE", nullptr, nullptr, nullptr) !=
        SQLITE_OK) {
      return SqlError(db_, "starting a transaction");
    }
    begun_ = true;
    return OkStatus();
  }
  Status Commit() {
    if (sqlite3_exec(db_, "COMMIT", nullptr, nullptr, nullptr) != SQLITE_OK) {
      return SqlError(db_, "committing");
    }
    committed_ = true;
    return OkStatus();
  }

 private:
  sqlite3* db_;
  bool begun_ = false;
  bool committed_ = false;
};

// Creates `path` mode 0600 when absent and narrows it (and any -wal and
// -shm beside it) to 0600 when present: SQLite gives its -wal and -shm
// files the mode of the database.
Status MakePrivate(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) {
    return Internal("state store " + path +
                    ": cannot create it: " + std::strerror(errno));
  }
  const int changed = ::fchmod(fd, 0600);
  const int chmod_errno = errno;
  ::close(fd);
  if (changed != 0) {
    return Internal("state store " + path + ": cannot make it mode 0600: " +
                    std::strerror(chmod_errno));
  }
  for (const char* suffix : {"-wal", "-shm"}) {
    const std::string side = path + suffix;
    if (::chmod(side.c_str(), 0600) != 0 && errno != ENOENT) {
      return Internal("state store " + side +
                      ": cannot make it mode 0600: " + std::strerror(errno));
    }
  }
  return OkStatus();
}

// The pid written in a lock file, or "" when there is none yet.
std::string LockHolder(int fd) {
  char buf[32] = {};
  const ssize_t n = ::pread(fd, buf, sizeof(buf) - 1, 0);
  std::string text = n > 0 ? std::string(buf, static_cast<size_t>(n)) : "";
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) {
    text.pop_back();
  }
  const bool digits = !text.empty() &&
                      text.find_first_not_of("0123456789") == std::string::npos;
  return digits ? text : "";
}

std::string DirOf(const std::string& path) {
  std::filesystem::path dir = std::filesystem::path(path).parent_path();
  return dir.empty() ? "." : dir.string();
}

}  // namespace

DataDirLock::DataDirLock(DataDirLock&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)), dir_(std::move(other.dir_)) {}

DataDirLock& DataDirLock::operator=(DataDirLock&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = std::exchange(other.fd_, -1);
    dir_ = std::move(other.dir_);
  }
  return *this;
}

DataDirLock::~DataDirLock() {
  if (fd_ >= 0) ::close(fd_);  // releases the flock
}

Result<DataDirLock> LockDataDir(const std::string& dir) {
  std::error_code ec;
  std::string shown = std::filesystem::absolute(dir, ec).lexically_normal();
  if (ec || shown.empty()) shown = dir;
  while (shown.size() > 1 && shown.back() == '/') shown.pop_back();
  const std::string path = shown + "/controller.lock";
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) {
    return FailedPrecondition("data directory " + shown + ": cannot open " +
                              path + ": " + std::strerror(errno));
  }
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int lock_errno = errno;
    const std::string holder = LockHolder(fd);
    ::close(fd);
    if (lock_errno != EWOULDBLOCK) {
      return FailedPrecondition("data directory " + shown + ": cannot lock " +
                                path + ": " + std::strerror(lock_errno));
    }
    return FailedPrecondition(
        "data directory " + shown + " is in use by another controller (" +
        (holder.empty() ? std::string("pid not yet written")
                        : "pid " + holder) +
        "); stop it first or choose another --data-dir");
  }
  const std::string pid = std::to_string(::getpid()) + "\n";
  if (::fchmod(fd, 0600) != 0 || ::ftruncate(fd, 0) != 0 ||
      ::pwrite(fd, pid.data(), pid.size(), 0) !=
          static_cast<ssize_t>(pid.size())) {
    const int write_errno = errno;
    ::close(fd);
    return FailedPrecondition("data directory " + shown + ": cannot write " +
                              path + ": " + std::strerror(write_errno));
  }
  return DataDirLock(fd, shown);
}

Result<std::unique_ptr<Store>> Store::Open(const std::string& path) {
  ASSIGN_OR_RETURN(DataDirLock lock, LockDataDir(DirOf(path)));
  return Open(path, std::move(lock));
}

Result<std::unique_ptr<Store>> Store::Open(const std::string& path,
                                           DataDirLock lock) {
  if (!lock.held()) {
    return FailedPrecondition("state store " + path +
                              ": opened without its data directory's lock");
  }
  RETURN_IF_ERROR(MakePrivate(path));
  sqlite3* db = nullptr;
  if (sqlite3_open_v2(
          path.c_str(), &db,
          SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX,
          nullptr) != SQLITE_OK) {
    std::string message = db ? sqlite3_errmsg(db) : "out of memory";
    sqlite3_close(db);
    return Internal("state store " + path + ": cannot open: " + message);
  }
  std::unique_ptr<Store> store(new Store(db, std::move(lock)));
  sqlite3_busy_timeout(db, 5000);
  // WAL: a crashed process loses nothing committed; synchronous=NORMAL is
  // safe against process crashes (only a power loss may drop the last
  // transactions), which is the failure this controller is built for.
  RETURN_IF_ERROR(store->Exec("PRAGMA journal_mode=WAL"));
  RETURN_IF_ERROR(store->Exec("PRAGMA synchronous=NORMAL"));
  RETURN_IF_ERROR(store->CreateSchema(path));
  return store;
}

Status Store::CreateSchema(const std::string& path) {
  {
    Transaction txn(db_);
    RETURN_IF_ERROR(txn.Begin());
    RETURN_IF_ERROR(Exec(
        "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT);"
        "CREATE TABLE IF NOT EXISTS queued_resources (name TEXT PRIMARY KEY, "
        "seq INTEGER NOT NULL, doc TEXT NOT NULL);"
        "CREATE TABLE IF NOT EXISTS operations (name TEXT PRIMARY KEY, "
        "doc TEXT NOT NULL);"
        "CREATE TABLE IF NOT EXISTS hosts (id TEXT PRIMARY KEY, doc TEXT NOT "
        "NULL);"
        "INSERT OR IGNORE INTO meta VALUES ('schema_version', '1');"));
    RETURN_IF_ERROR(txn.Commit());
  }
  Statement version(db_, "SELECT value FROM meta WHERE key='schema_version'");
  if (!version.ok() || sqlite3_step(version.get()) != SQLITE_ROW) {
    return SqlError(db_, "reading the schema version");
  }
  const char* text =
      reinterpret_cast<const char*>(sqlite3_column_text(version.get(), 0));
  const std::string found = text ? text : "(none)";
  if (found != std::to_string(kStoreSchemaVersion)) {
    return FailedPrecondition("state store " + path + " has schema version " +
                              found + "; this controller reads version " +
                              std::to_string(kStoreSchemaVersion));
  }
  return OkStatus();
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
  Transaction txn(db_);
  RETURN_IF_ERROR(txn.Begin());
  try {
    RETURN_IF_ERROR(WriteChange(change));
  } catch (const std::exception& e) {
    return Internal(std::string("state store: the change was rolled back: ") +
                    e.what());
  }
  return txn.Commit();
}

Status Store::WriteChange(const StoreChange& change) {
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
      return SqlError(db_, "writing queued resource " + r.name);
    }
  }
  for (const std::string& name : change.delete_queued_resources) {
    Statement stmt(db_, "DELETE FROM queued_resources WHERE name = ?");
    if (!stmt.ok()) return SqlError(db_, "deleting");
    sqlite3_bind_text(stmt.get(), 1, name.c_str(), -1, SQLITE_TRANSIENT);
    if (sqlite3_step(stmt.get()) != SQLITE_DONE) {
      return SqlError(db_, "deleting queued resource " + name);
    }
  }
  for (const OperationRecord& op : change.put_operations) {
    if (!put("INSERT OR REPLACE INTO operations VALUES (?, ?)", op.name,
             op.ToStorage().dump(), nullptr)) {
      return SqlError(db_, "writing operation " + op.name);
    }
  }
  for (const nlohmann::json& host : change.put_hosts) {
    if (!put("INSERT OR REPLACE INTO hosts VALUES (?, ?)",
             host.at("id").get<std::string>(), host.dump(), nullptr)) {
      return SqlError(db_, "writing a host");
    }
  }
  for (const std::string& id : change.delete_hosts) {
    Statement stmt(db_, "DELETE FROM hosts WHERE id = ?");
    if (!stmt.ok()) return SqlError(db_, "deleting");
    sqlite3_bind_text(stmt.get(), 1, id.c_str(), -1, SQLITE_TRANSIENT);
    if (sqlite3_step(stmt.get()) != SQLITE_DONE) {
      return SqlError(db_, "deleting host " + id);
    }
  }
  return OkStatus();
}

}  // namespace multislice::control
