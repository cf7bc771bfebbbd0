#include <sqlite3.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>

#include "common/temp_dir.h"
#include "control/store.h"
#include "gtest/gtest.h"

namespace multislice::control {
namespace {

QueuedResourceRecord Record(const std::string& id, int64_t seq) {
  QueuedResourceRecord r;
  r.id = id;
  r.name = "projects/p/locations/z/queuedResources/" + id;
  r.project = "p";
  r.zone = "z";
  r.seq = seq;
  r.spec = *ParseQueuedResource(
      {{"tpu",
        {{"node_spec",
          {{{"node_id", id}, {"node", {{"accelerator_type", "cpu-2"}}}}}}}}},
      id, 0);
  r.nodes = {{id, "CREATING", "HEALTHY", {}, false, nullptr, 0}};
  return r;
}

TEST(StoreTest, ChangesSurviveReopening) {
  TempDir dir;
  const std::string path = dir.path() + "/state.db";
  {
    auto store = Store::Open(path);
    ASSERT_TRUE(store.ok()) << store.status().message();
    StoreChange c;
    c.put_queued_resources = {Record("b", 2), Record("a", 1)};
    OperationRecord op;
    op.name = "op1";
    op.verb = "create";
    c.put_operations = {op};
    c.put_hosts = {{{"id", "host-1"}, {"lost", false}}};
    ASSERT_TRUE((*store)->Apply(c).ok());
    StoreChange d;
    d.delete_queued_resources = {Record("b", 2).name};
    QueuedResourceRecord a = Record("a", 1);
    a.attempt = 5;
    d.put_queued_resources = {a};
    ASSERT_TRUE((*store)->Apply(d).ok());
  }
  auto store = Store::Open(path);
  ASSERT_TRUE(store.ok());
  auto snapshot = (*store)->Load();
  ASSERT_TRUE(snapshot.ok()) << snapshot.status().message();
  ASSERT_EQ(snapshot->queued_resources.size(), 1u);
  EXPECT_EQ(snapshot->queued_resources[0].id, "a");
  EXPECT_EQ(snapshot->queued_resources[0].attempt, 5);
  ASSERT_EQ(snapshot->operations.size(), 1u);
  EXPECT_EQ(snapshot->operations[0].verb, "create");
  ASSERT_EQ(snapshot->hosts.size(), 1u);
  EXPECT_EQ(snapshot->hosts[0]["id"], "host-1");
}

TEST(StoreTest, UsesWalAndRefusesOtherSchemaVersions) {
  TempDir dir;
  const std::string path = dir.path() + "/state.db";
  ASSERT_TRUE(Store::Open(path).ok());
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  sqlite3_stmt* stmt = nullptr;
  sqlite3_prepare_v2(db, "PRAGMA journal_mode", -1, &stmt, nullptr);
  ASSERT_EQ(sqlite3_step(stmt), SQLITE_ROW);
  EXPECT_STREQ(reinterpret_cast<const char*>(sqlite3_column_text(stmt, 0)),
               "wal");
  sqlite3_finalize(stmt);
  sqlite3_exec(db, "UPDATE meta SET value='9' WHERE key='schema_version'",
               nullptr, nullptr, nullptr);
  sqlite3_close(db);
  auto store = Store::Open(path);
  ASSERT_FALSE(store.ok());
  EXPECT_NE(store.status().message().find("schema version 9"),
            std::string::npos);
}

// Applies `change`, counting an exception (what the store did before it
// had a transaction guard) as a failure.
Status ApplyCatching(Store& store, const StoreChange& change) {
  try {
    return store.Apply(change);
  } catch (const std::exception& e) {
    return Internal(std::string("threw: ") + e.what());
  }
}

TEST(StoreTest, AFailedWriteRollsBackAndTheNextWriteSucceeds) {
  TempDir dir;
  auto store = Store::Open(dir.path() + "/state.db");
  ASSERT_TRUE(store.ok()) << store.status().message();
  // A record json::dump cannot write (a string that is not UTF-8), after
  // one it can: nothing of the change may remain.
  QueuedResourceRecord unwritable = Record("b", 2);
  unwritable.failed_error = "bad \xFF byte";
  StoreChange bad;
  bad.put_queued_resources = {Record("a", 1), unwritable};
  Status failed = ApplyCatching(**store, bad);
  EXPECT_FALSE(failed.ok());
  EXPECT_EQ(
      failed.message().rfind("state store: the change was rolled back", 0), 0u)
      << failed.message();
  // A host without an id: nlohmann's at() throws.
  StoreChange no_id;
  no_id.put_queued_resources = {Record("a", 1)};
  no_id.put_hosts = {{{"lost", false}}};
  EXPECT_FALSE(ApplyCatching(**store, no_id).ok());
  // No transaction was left open: a normal write works.
  StoreChange good;
  good.put_queued_resources = {Record("c", 3)};
  Status s = ApplyCatching(**store, good);
  ASSERT_TRUE(s.ok()) << s.message();
  auto snapshot = (*store)->Load();
  ASSERT_TRUE(snapshot.ok()) << snapshot.status().message();
  ASSERT_EQ(snapshot->queued_resources.size(), 1u);
  EXPECT_EQ(snapshot->queued_resources[0].id, "c");
  EXPECT_TRUE(snapshot->hosts.empty());
}

TEST(StoreTest, AnSqlErrorRollsBackToo) {
  TempDir dir;
  const std::string path = dir.path() + "/state.db";
  auto store = Store::Open(path);
  ASSERT_TRUE(store.ok());
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(db, "DROP TABLE hosts", nullptr, nullptr, nullptr),
            SQLITE_OK);
  sqlite3_close(db);
  StoreChange change;
  change.put_queued_resources = {Record("a", 1)};
  change.put_hosts = {{{"id", "host-1"}}};
  EXPECT_FALSE(ApplyCatching(**store, change).ok());
  change.put_hosts.clear();
  Status s = ApplyCatching(**store, change);
  EXPECT_TRUE(s.ok()) << s.message();
}

mode_t ModeOf(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return 07777;
  return st.st_mode & 07777;
}

TEST(StoreTest, DatabaseAndItsWalAreMode0600) {
  TempDir dir;
  const std::string path = dir.path() + "/state.db";
  const mode_t old_umask = ::umask(022);
  {
    auto store = Store::Open(path);
    ::umask(old_umask);
    ASSERT_TRUE(store.ok()) << store.status().message();
    StoreChange c;
    c.put_queued_resources = {Record("a", 1)};
    ASSERT_TRUE((*store)->Apply(c).ok());
    // While open, the WAL and its index exist.
    EXPECT_EQ(ModeOf(path), 0600u);
    EXPECT_EQ(ModeOf(path + "-wal"), 0600u);
    EXPECT_EQ(ModeOf(path + "-shm"), 0600u);
    EXPECT_EQ(ModeOf(dir.path() + "/controller.lock"), 0600u);
  }
  // A database left readable by an older version is narrowed on open.
  ASSERT_EQ(::chmod(path.c_str(), 0644), 0);
  auto store = Store::Open(path);
  ASSERT_TRUE(store.ok()) << store.status().message();
  EXPECT_EQ(ModeOf(path), 0600u);
}

TEST(StoreTest, ASecondOpenerOfTheDataDirectoryIsRefused) {
  TempDir dir;
  const std::string path = dir.path() + "/state.db";
  auto first = Store::Open(path);
  ASSERT_TRUE(first.ok()) << first.status().message();
  const std::string in_use = "data directory " + dir.path() +
                             " is in use by another controller (pid " +
                             std::to_string(::getpid()) +
                             "); stop it first or choose another --data-dir";
  // flock locks belong to the open file: a second open in this process
  // conflicts as another process would.
  auto second = Store::Open(path);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(second.status().message(), in_use);
  Result<DataDirLock> lock = LockDataDir(dir.path() + "/");
  ASSERT_FALSE(lock.ok());
  EXPECT_EQ(lock.status().message(), in_use);
  // Another process is refused the same way, naming our pid.
  const pid_t child = ::fork();
  if (child == 0) {
    Result<DataDirLock> theirs = LockDataDir(dir.path());
    ::_exit(!theirs.ok() && theirs.status().message() == in_use ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  // Released with the store: the next opener gets it and writes its pid.
  first->reset();
  auto again = Store::Open(path);
  ASSERT_TRUE(again.ok()) << again.status().message();
  std::ifstream pid_file(dir.path() + "/controller.lock");
  std::string pid;
  pid_file >> pid;
  EXPECT_EQ(pid, std::to_string(::getpid()));
}

TEST(StoreTest, OpenWithALockTakenEarlier) {
  TempDir dir;
  Result<DataDirLock> lock = LockDataDir(dir.path());
  ASSERT_TRUE(lock.ok()) << lock.status().message();
  EXPECT_TRUE(lock->held());
  EXPECT_EQ(lock->dir(), dir.path());
  auto store = Store::Open(dir.path() + "/state.db", std::move(*lock));
  ASSERT_TRUE(store.ok()) << store.status().message();
  EXPECT_FALSE(LockDataDir(dir.path()).ok());  // the store holds it
  EXPECT_FALSE(Store::Open(dir.path() + "/other.db", DataDirLock()).ok());
  // A lock survives a move; the moved-from one holds nothing.
  TempDir other;
  Result<DataDirLock> a = LockDataDir(other.path());
  ASSERT_TRUE(a.ok());
  DataDirLock b = std::move(*a);
  EXPECT_FALSE(a->held());
  EXPECT_TRUE(b.held());
  EXPECT_FALSE(LockDataDir(other.path()).ok());
  b = DataDirLock();
  EXPECT_TRUE(LockDataDir(other.path()).ok());
}

}  // namespace
}  // namespace multislice::control
