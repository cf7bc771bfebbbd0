#include <sqlite3.h>

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
  r.nodes = {{id, "CREATING", "HEALTHY", {}, false}};
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

}  // namespace
}  // namespace multislice::control
