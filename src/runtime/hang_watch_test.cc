#include "runtime/hang_watch.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <future>
#include <memory>

#include "common/temp_dir.h"
#include "runtime/comm/dcn/store.h"

namespace multislice::runtime {
namespace {

using std::chrono::milliseconds;
using std::chrono::steady_clock;

// One simulated worker: its watch over one device whose oldest collective
// has been in flight for `stuck_for`.
struct FakeWorker {
  std::shared_ptr<gloo::rendezvous::Store> store;
  std::promise<HangDigest> digest;
  std::unique_ptr<HangWatch> watch;

  FakeWorker(const dcn::StoreAddress& address, int process, int processes,
             steady_clock::duration stuck_for) {
    store = *dcn::OpenStore(address, "run/0/", milliseconds(5000));
    HangWatchOptions o;
    o.store = store.get();
    o.process = process;
    for (int p = 0; p < processes; ++p) {
      o.names.push_back("worker " + std::to_string(p));
    }
    o.live = [processes] {
      std::vector<int> all;
      for (int p = 0; p < processes; ++p) all.push_back(p);
      return all;
    };
    o.report = [process] {
      DeviceProgress progress(process);
      progress.Issued(1, "all_reduce[data]#1 grads");
      return WorkerHangReport{process,
                              "worker " + std::to_string(process),
                              "host",
                              {{progress.Snapshot(), 0}}};
    };
    o.oldest_pending = [stuck_for] { return stuck_for; };
    o.poll = milliseconds(50);
    o.grace = milliseconds(1000);
    o.on_digest = [this](const HangDigest& d) { digest.set_value(d); };
    watch = std::make_unique<HangWatch>(std::move(o));
  }
};

TEST(HangWatchTest, TheWorkersThatAnswerNameTheOneThatDoesNot) {
  TempDir dir;
  const dcn::StoreAddress address =
      *dcn::ParseStoreAddress("file://" + dir.path() + "/store");
  const std::string path = dir.path() + "/run/hang_digest.json";
  // Worker 0's collective is stuck; worker 2 is only computing; worker 1
  // never answers (no watch at all).
  FakeWorker w0(address, 0, 3, std::chrono::seconds(10));
  FakeWorker w2(address, 2, 3, steady_clock::duration::zero());
  const steady_clock::time_point armed = steady_clock::now();
  w0.watch->Arm(milliseconds(200), path);
  w2.watch->Arm(milliseconds(200), path);
  auto f0 = w0.digest.get_future(), f2 = w2.digest.get_future();
  ASSERT_EQ(f0.wait_for(std::chrono::seconds(10)), std::future_status::ready);
  ASSERT_EQ(f2.wait_for(std::chrono::seconds(10)), std::future_status::ready);
  // The grace for the silent worker, a few polls, no more.
  EXPECT_LT(steady_clock::now() - armed, std::chrono::seconds(4));
  const HangDigest d0 = f0.get(), d2 = f2.get();
  ASSERT_EQ(d0.culprits.size(), 1u);
  EXPECT_EQ(d0.culprits[0].process, 1);
  EXPECT_EQ(d0.silent, std::vector<int>{1});
  ASSERT_EQ(d0.workers.size(), 2u);
  // Worker 0 wrote the file; worker 2 printed worker 0's digest.
  EXPECT_EQ(d0.file, path);
  EXPECT_EQ(ToJson(d2), ToJson(d0));
  std::ifstream in(path);
  std::string text((std::istreambuf_iterator<char>(in)), {});
  Result<HangDigest> from_file = ParseHangDigest(text);
  ASSERT_TRUE(from_file.ok()) << from_file.status().message();
  EXPECT_EQ(ToJson(*from_file), ToJson(d0));
}

TEST(HangWatchTest, NothingHappensUnarmedOrBelowTheThreshold) {
  TempDir dir;
  const dcn::StoreAddress address =
      *dcn::ParseStoreAddress("file://" + dir.path() + "/store");
  FakeWorker unarmed(address, 0, 2, std::chrono::seconds(100));
  FakeWorker below(address, 1, 2, milliseconds(100));
  below.watch->Arm(milliseconds(5000), dir.path() + "/digest.json");
  std::this_thread::sleep_for(milliseconds(600));
  EXPECT_FALSE(unarmed.watch->round_started());
  EXPECT_FALSE(below.watch->round_started());
  EXPECT_FALSE(std::filesystem::exists(dir.path() + "/digest.json"));
}

}  // namespace
}  // namespace multislice::runtime
