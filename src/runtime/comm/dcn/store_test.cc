// Tests of the rendezvous store: address parsing, key prefixes, bounded
// waits, and the attempt record on file:// and on a real redis-server that
// the test starts on a free loopback port.
#include "runtime/comm/dcn/store.h"

#include <arpa/inet.h>
#include <gloo/common/error.h>
#include <gtest/gtest.h>
#include <hiredis/hiredis.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "common/temp_dir.h"
#include "runtime/comm/dcn/test_redis_server.h"

extern char** environ;

namespace multislice::dcn {
namespace {

using std::chrono::milliseconds;
using testing::FreeLoopbackPort;
using testing::RedisServer;
using Clock = std::chrono::steady_clock;

StoreAddress FileAddress(const std::string& dir) {
  StoreAddress a;
  a.kind = StoreAddress::Kind::kFile;
  a.path = dir;
  return a;
}

std::vector<char> Bytes(const std::string& s) {
  return std::vector<char>(s.begin(), s.end());
}

std::string Text(const std::vector<char>& v) {
  return std::string(v.begin(), v.end());
}

// A TCP port on 127.0.0.1 that nothing listens on right now.

TEST(ParseStoreAddressTest, AcceptsFileAndRedisForms) {
  Result<StoreAddress> file = ParseStoreAddress("file:///tmp/rendezvous");
  ASSERT_TRUE(file.ok()) << file.status().message();
  EXPECT_EQ(file->kind, StoreAddress::Kind::kFile);
  EXPECT_EQ(file->path, "/tmp/rendezvous");
  EXPECT_EQ(file->ToString(), "file:///tmp/rendezvous");

  Result<StoreAddress> relative = ParseStoreAddress("file://run/store");
  ASSERT_TRUE(relative.ok());
  EXPECT_EQ(relative->path, "run/store");

  Result<StoreAddress> redis = ParseStoreAddress("redis://10.0.0.7:7000");
  ASSERT_TRUE(redis.ok()) << redis.status().message();
  EXPECT_EQ(redis->kind, StoreAddress::Kind::kRedis);
  EXPECT_EQ(redis->host, "10.0.0.7");
  EXPECT_EQ(redis->port, 7000);
  EXPECT_EQ(redis->ToString(), "redis://10.0.0.7:7000");

  Result<StoreAddress> default_port = ParseStoreAddress("redis://coordinator");
  ASSERT_TRUE(default_port.ok());
  EXPECT_EQ(default_port->host, "coordinator");
  EXPECT_EQ(default_port->port, 6379);

  Result<StoreAddress> secret =
      ParseStoreAddress("redis://ms-run:p%40ss%3Aword@10.0.0.7:7000");
  ASSERT_TRUE(secret.ok()) << secret.status().message();
  EXPECT_EQ(secret->user, "ms-run");
  EXPECT_EQ(secret->password, "p@ss:word");
  EXPECT_EQ(secret->host, "10.0.0.7");
  EXPECT_EQ(secret->ToString(), "redis://ms-run@10.0.0.7:7000");  // no secret

  Result<StoreAddress> ipv6 = ParseStoreAddress("redis://[::1]:6380");
  ASSERT_TRUE(ipv6.ok()) << ipv6.status().message();
  EXPECT_EQ(ipv6->host, "::1");
  EXPECT_EQ(ipv6->port, 6380);
  EXPECT_EQ(ipv6->ToString(), "redis://[::1]:6380");
}

TEST(ParseStoreAddressTest, RejectsOtherFormsNamingTheValue) {
  for (const char* bad :
       {"", "/tmp/dir", "file://", "file:/tmp/x", "redis://", "redis://:6379",
        "redis://host:", "redis://host:0", "redis://host:65536",
        "redis://host:12x", "redis://[::1", "redis://[::1]x", "redis://a/b:1",
        "http://host:80", "FILE:///tmp", "redis://user@host:1",
        "redis://user:@host:1", "redis://u:p%zz@host:1"}) {
    Result<StoreAddress> r = ParseStoreAddress(bad);
    ASSERT_FALSE(r.ok()) << "accepted '" << bad << "'";
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(r.status().message().find("'" + std::string(bad) + "'"),
              std::string::npos)
        << r.status().message();
    EXPECT_NE(r.status().message().find("file://DIR or redis://HOST:PORT"),
              std::string::npos)
        << r.status().message();
  }
}

TEST(OpenStoreTest, PrefixesKeys) {
  TempDir dir;
  const StoreAddress address = FileAddress(dir.path() + "/store");
  auto run3 = OpenStore(address, "run/3", milliseconds(2000));
  ASSERT_TRUE(run3.ok()) << run3.status().message();
  auto raw = OpenStore(address, "", milliseconds(2000));
  ASSERT_TRUE(raw.ok());
  auto run4 = OpenStore(address, "run/4/", milliseconds(300));
  ASSERT_TRUE(run4.ok());

  (*run3)->set("key", Bytes("value3"));
  (*run4)->set("key", Bytes("value4"));
  EXPECT_EQ(Text((*run3)->get("key")), "value3");
  EXPECT_EQ(Text((*run4)->get("key")), "value4");
  EXPECT_EQ(Text((*raw)->get("run/3/key")), "value3");
  EXPECT_EQ(Text((*raw)->get("run/4/key")), "value4");
  (*raw)->wait({"run/3/key", "run/4/key"});

  // A key of another prefix is not visible.
  (*raw)->set("run/5/only", Bytes("x"));
  EXPECT_THROW((*run4)->wait({"only"}, milliseconds(100)), gloo::IoException);
}

TEST(OpenStoreTest, GetOfAMissingKeyEndsAtTheTimeout) {
  TempDir dir;
  auto store = OpenStore(FileAddress(dir.path()), "p", milliseconds(300));
  ASSERT_TRUE(store.ok());
  const auto start = Clock::now();
  try {
    (*store)->get("missing");
    FAIL() << "get() of a missing key returned";
  } catch (const gloo::IoException& e) {
    EXPECT_NE(std::string(e.what()).find("p/missing"), std::string::npos)
        << e.what();
  }
  // Gloo's own FileStore would wait 30 s here.
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(5));

  // A wait's own timeout can only shorten the configured one.
  const auto wait_start = Clock::now();
  EXPECT_THROW((*store)->wait({"missing"}, milliseconds(60000)),
               gloo::IoException);
  EXPECT_LT(Clock::now() - wait_start, std::chrono::seconds(5));
}

TEST(OpenStoreTest, GetWaitsForAKeySetLater) {
  TempDir dir;
  const StoreAddress address = FileAddress(dir.path());
  auto reader = OpenStore(address, "p", milliseconds(5000));
  auto writer = OpenStore(address, "p", milliseconds(5000));
  ASSERT_TRUE(reader.ok() && writer.ok());
  std::thread later([&] {
    std::this_thread::sleep_for(milliseconds(100));
    (*writer)->set("late", Bytes("here"));
  });
  EXPECT_EQ(Text((*reader)->get("late")), "here");
  later.join();
}

// The device threads of a worker share one store.
TEST(OpenStoreTest, OneStoreServesManyThreadsAtOnce) {
  TempDir dir;
  auto store = OpenStore(FileAddress(dir.path()), "p", milliseconds(5000));
  ASSERT_TRUE(store.ok());
  constexpr int kThreads = 16, kKeys = 500;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int k = 0; k < kKeys; ++k) {
        const std::string key = std::to_string(t) + "/" + std::to_string(k);
        (*store)->set(key, Bytes(key));
        // Read a key another thread writes, waiting for it if needed.
        const std::string other =
            std::to_string((t + 1) % kThreads) + "/" + std::to_string(k);
        EXPECT_EQ(Text((*store)->get(other)), other);
      }
    });
  }
  for (std::thread& t : threads) t.join();
}

TEST(OpenStoreTest, CreatesTheDirectory) {
  TempDir dir;
  const std::string nested = dir.path() + "/a/b/c";
  auto store = OpenStore(FileAddress(nested), "", milliseconds(100));
  ASSERT_TRUE(store.ok()) << store.status().message();
  EXPECT_TRUE(std::filesystem::is_directory(nested));
}

TEST(OpenStoreTest, UnreachableRedisIsUnavailable) {
  StoreAddress address;
  address.kind = StoreAddress::Kind::kRedis;
  address.host = "127.0.0.1";
  address.port = FreeLoopbackPort();
  auto store = OpenStore(address, "p", milliseconds(100));
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(store.status().message().find(address.ToString()),
            std::string::npos)
      << store.status().message();

  Status claim = ClaimAttempt(address, "run", 1);
  EXPECT_EQ(claim.code(), StatusCode::kUnavailable) << claim.message();
}

TEST(ClaimAttemptTest, FileRecordRefusesStaleAttempts) {
  TempDir dir;
  const StoreAddress address = FileAddress(dir.path() + "/store");
  EXPECT_TRUE(ClaimAttempt(address, "R", 2).ok());
  Status stale = ClaimAttempt(address, "R", 1);
  EXPECT_EQ(stale.code(), StatusCode::kAborted);
  EXPECT_EQ(stale.message(),
            "attempt 1 of run 'R' is stale: attempt 2 has already started");
  EXPECT_TRUE(ClaimAttempt(address, "R", 2).ok());
  EXPECT_TRUE(ClaimAttempt(address, "R", 3).ok());
  EXPECT_EQ(ClaimAttempt(address, "R", 2).message(),
            "attempt 2 of run 'R' is stale: attempt 3 has already started");
  // Runs are independent, whatever their ids contain.
  EXPECT_TRUE(ClaimAttempt(address, "other/run id", 0).ok());
  EXPECT_TRUE(ClaimAttempt(address, "R/1", 1).ok());
  EXPECT_EQ(ClaimAttempt(address, "R", 1).code(), StatusCode::kAborted);
  EXPECT_EQ(ClaimAttempt(address, "R", -1).code(),
            StatusCode::kInvalidArgument);

  // The record is versioned and kept outside every attempt's key prefix.
  std::ifstream record(dir.path() + "/store/run-R.attempt");
  std::string header, value;
  std::getline(record, header);
  std::getline(record, value);
  EXPECT_EQ(header, "multislice-attempt v1");
  EXPECT_EQ(value, "3");
}

TEST(ClaimAttemptTest, FileRecordIsAtomicUnderConcurrentClaims) {
  TempDir dir;
  const StoreAddress address = FileAddress(dir.path());
  constexpr int kAttempts = 16;
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int a = 0; a < kAttempts; ++a) {
    threads.emplace_back([&, a] {
      Status s = ClaimAttempt(address, "race", a);
      if (!s.ok()) {
        if (s.code() != StatusCode::kAborted) ++failures;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_TRUE(ClaimAttempt(address, "race", kAttempts - 1).ok());
  EXPECT_EQ(ClaimAttempt(address, "race", kAttempts - 2).code(),
            StatusCode::kAborted);
}

TEST(ClaimAttemptTest, CorruptRecordIsReported) {
  TempDir dir;
  std::ofstream(dir.path() + "/run-R.attempt") << "garbage\n";
  Status s = ClaimAttempt(FileAddress(dir.path()), "R", 1);
  EXPECT_EQ(s.code(), StatusCode::kInternal);
  EXPECT_NE(s.message().find("run-R.attempt"), std::string::npos)
      << s.message();
}

TEST(RedisStoreTest, ClaimAttemptAndPrefixedKeys) {
  RedisServer server;
  ASSERT_TRUE(server.ready())
      << "could not start /usr/bin/redis-server (is it installed?)";
  const StoreAddress address = server.address();

  EXPECT_TRUE(ClaimAttempt(address, "R", 2).ok());
  Status stale = ClaimAttempt(address, "R", 1);
  EXPECT_EQ(stale.code(), StatusCode::kAborted);
  EXPECT_EQ(stale.message(),
            "attempt 1 of run 'R' is stale: attempt 2 has already started");
  EXPECT_TRUE(ClaimAttempt(address, "R", 2).ok());
  EXPECT_TRUE(ClaimAttempt(address, "R", 5).ok());
  EXPECT_EQ(ClaimAttempt(address, "R", 4).message(),
            "attempt 4 of run 'R' is stale: attempt 5 has already started");
  EXPECT_TRUE(ClaimAttempt(address, "S", 0).ok());

  auto run = OpenStore(address, "R/5", milliseconds(300));
  ASSERT_TRUE(run.ok()) << run.status().message();
  auto raw = OpenStore(address, "", milliseconds(300));
  ASSERT_TRUE(raw.ok());
  (*run)->set("rank_0", Bytes("host-a"));
  EXPECT_EQ(Text((*run)->get("rank_0")), "host-a");
  EXPECT_EQ(Text((*raw)->get("R/5/rank_0")), "host-a");

  const auto start = Clock::now();
  EXPECT_THROW((*run)->get("rank_1"), gloo::IoException);
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(5));
}

// Issue 12, defect 5: the coordinator was open to anyone who reached it.
// With an ACL user per run (as the controller creates them), a worker's
// credentials reach its own run's keys only, and wrong ones are refused.
TEST(RedisStoreTest, AclUserReachesOnlyItsOwnRun) {
  RedisServer server;
  ASSERT_TRUE(server.ready())
      << "could not start /usr/bin/redis-server (is it installed?)";
  const StoreAddress admin = server.address();
  redisContext* c = redisConnect("127.0.0.1", admin.port);
  ASSERT_TRUE(c != nullptr && c->err == 0);
  auto* reply = static_cast<redisReply*>(redisCommand(
      c,
      "ACL SETUSER ms-R on >secret-R resetkeys ~R/* ~multislice/attempt/R "
      "resetchannels -@all +get +set +setnx +exists +eval +ping"));
  ASSERT_NE(reply, nullptr);
  EXPECT_EQ(reply->type, REDIS_REPLY_STATUS) << reply->str;
  freeReplyObject(reply);
  redisFree(c);

  StoreAddress worker = admin;
  worker.user = "ms-R";
  worker.password = "secret-R";
  EXPECT_TRUE(ClaimAttempt(worker, "R", 1).ok());
  auto own = OpenStore(worker, "R/1", milliseconds(300));
  ASSERT_TRUE(own.ok()) << own.status().message();
  (*own)->set("rank_0", Bytes("host-a"));
  EXPECT_EQ(Text((*own)->get("rank_0")), "host-a");

  // Another run's keys: refused.
  Status other = ClaimAttempt(worker, "S", 99);
  EXPECT_FALSE(other.ok());
  EXPECT_NE(other.message().find("NOPERM"), std::string::npos)
      << other.message();
  auto foreign = OpenStore(worker, "S/1", milliseconds(300));
  ASSERT_TRUE(foreign.ok());
  EXPECT_THROW((*foreign)->set("rank_0", Bytes("x")), gloo::IoException);

  // Wrong password: refused at once, the message without the password.
  StoreAddress wrong = worker;
  wrong.password = "guess";
  Status refused = ClaimAttempt(wrong, "R", 2);
  EXPECT_EQ(refused.code(), StatusCode::kUnavailable);
  EXPECT_NE(refused.message().find("refused the credentials"),
            std::string::npos)
      << refused.message();
  EXPECT_EQ(refused.message().find("guess"), std::string::npos);
  EXPECT_FALSE(OpenStore(wrong, "R/2", milliseconds(300)).ok());
}

}  // namespace
}  // namespace multislice::dcn
