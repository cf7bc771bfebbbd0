#include "train/checkpoint.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <barrier>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <iostream>
#include <thread>

#include "common/temp_dir.h"
#include "gtest/gtest.h"

namespace multislice {
namespace {

namespace fs = std::filesystem;

std::vector<std::byte> Pattern(size_t size, uint32_t seed) {
  std::vector<std::byte> data(size);
  uint32_t x = seed * 2654435761u + 1;
  for (size_t i = 0; i < size; ++i) {
    x = x * 1664525u + 1013904223u;
    data[i] = static_cast<std::byte>(x >> 24);
  }
  return data;
}

Blob MakeBlob(const std::string& name, size_t size, uint32_t seed) {
  return Blob{
      name, "bf16", {static_cast<int64_t>(size / 2), 1}, Pattern(size, seed)};
}

std::vector<Blob> StepBlobs(int64_t step, int host) {
  const uint32_t seed = static_cast<uint32_t>(step * 100 + host);
  return {MakeBlob("layer0/w", 4096, seed),
          MakeBlob("layer3/w", 1000, seed + 1), MakeBlob("empty", 0, seed + 2),
          Blob{"data_iterator", "json", {}, Pattern(37, seed + 3)}};
}

CheckpointOptions SyncOptions(const std::string& dir) {
  CheckpointOptions options;
  options.directory = dir;
  options.async = false;
  return options;
}

CheckpointOptions AsyncOptions(const std::string& dir) {
  CheckpointOptions options = SyncOptions(dir);
  options.async = true;
  return options;
}

void ExpectStepRestored(const RestoredState& state, int64_t step, int host) {
  EXPECT_EQ(state.step, step);
  EXPECT_EQ(state.host, host);
  std::vector<Blob> expected = StepBlobs(step, host);
  ASSERT_EQ(state.blobs.size(), expected.size());
  for (const Blob& blob : expected) {
    auto it = state.blobs.find(blob.name);
    ASSERT_NE(it, state.blobs.end()) << blob.name;
    EXPECT_EQ(it->second.dtype, blob.dtype);
    EXPECT_EQ(it->second.shape, blob.shape);
    EXPECT_TRUE(it->second.data == blob.data) << blob.name;
  }
  EXPECT_EQ(state.metadata.value("step", -1), step);
}

void SaveStep(CheckpointManager& manager, int64_t step, int host = 0) {
  ASSERT_TRUE(manager.Save(step, StepBlobs(step, host), {{"step", step}}).ok());
}

bool AllInline(int /*host*/) { return false; }

// Runs `host_count` hosts of one job on threads, each with its own manager
// on `dir` (asynchronous where `async(host)`) and a real barrier between
// them, and returns the status each one's `run` returned.
std::vector<Status> RunHosts(
    int host_count, const std::string& dir,
    const std::function<bool(int host)>& async,
    const std::function<Status(CheckpointManager&, int host)>& run) {
  std::barrier sync_point(host_count);
  std::vector<Status> results(host_count);
  std::vector<std::thread> hosts;
  for (int host = 0; host < host_count; ++host) {
    hosts.emplace_back([&, host] {
      CheckpointOptions options = SyncOptions(dir);
      options.host = host;
      options.host_count = host_count;
      options.async = async(host);
      options.barrier = [&](const std::string&) {
        sync_point.arrive_and_wait();
        return OkStatus();
      };
      CheckpointManager manager(options);
      results[host] = run(manager, host);
    });
  }
  for (std::thread& t : hosts) t.join();
  return results;
}

// Flips one bit at `offset` of `path`.
void FlipByte(const std::string& path, std::streamoff offset) {
  std::fstream file(path, std::ios::in | std::ios::out | std::ios::binary);
  ASSERT_TRUE(file.good()) << path;
  file.seekg(offset);
  char c = 0;
  file.read(&c, 1);
  c ^= 0x01;
  file.seekp(offset);
  file.write(&c, 1);
}

TEST(Crc32cTest, KnownVectors) {
  EXPECT_EQ(Crc32c("", 0), 0u);
  EXPECT_EQ(Crc32c("123456789", 9), 0xE3069283u);  // the CRC-32C check value
  std::string zeros(32, '\0');
  EXPECT_EQ(Crc32c(zeros.data(), zeros.size()), 0x8A9136AAu);  // RFC 3720
  // Incremental equals one-shot, across the 8-byte fast path.
  std::vector<std::byte> data = Pattern(1003, 7);
  uint32_t crc = Crc32c(data.data(), 501);
  crc = Crc32c(data.data() + 501, data.size() - 501, crc);
  EXPECT_EQ(crc, Crc32c(data.data(), data.size()));
  // The table fallback agrees with the instruction, at every length.
  EXPECT_EQ(Crc32cPortable("123456789", 9), 0xE3069283u);
  for (size_t n : {0, 1, 7, 8, 9, 500, 1003}) {
    EXPECT_EQ(Crc32cPortable(data.data(), n), Crc32c(data.data(), n)) << n;
  }
  EXPECT_EQ(
      Crc32cPortable(data.data() + 501, 502, Crc32cPortable(data.data(), 501)),
      Crc32c(data.data(), data.size()));
}

TEST(CheckpointTest, SyncRoundTripOneHost) {
  TempDir tmp;
  ASSERT_TRUE(tmp.ok());
  const std::string dir = tmp.path() + "/runs/r/checkpoints";
  CheckpointManager manager(SyncOptions(dir));
  EXPECT_EQ(manager.LatestCompleteStep().status().code(),
            StatusCode::kNotFound);
  SaveStep(manager, 10);
  SaveStep(manager, 20);
  EXPECT_TRUE(fs::exists(dir + "/20/COMMITTED"));
  EXPECT_TRUE(fs::exists(dir + "/20/host0.bin"));
  EXPECT_TRUE(fs::exists(dir + "/20/host0.json"));
  EXPECT_FALSE(fs::exists(dir + "/20.tmp"));
  EXPECT_GT(manager.last_save_bytes(), 4096u + 1000u + 37u);

  Result<int64_t> latest = manager.LatestCompleteStep();
  ASSERT_TRUE(latest.ok());
  EXPECT_EQ(*latest, 20);
  Result<int> hosts = manager.HostCount(20);
  ASSERT_TRUE(hosts.ok());
  EXPECT_EQ(*hosts, 1);
  Result<RestoredState> state = manager.Restore(10, 0);
  ASSERT_TRUE(state.ok()) << state.status().message();
  ExpectStepRestored(*state, 10, 0);
  std::vector<std::string> warnings;
  state = manager.RestoreLatest(0, &warnings);
  ASSERT_TRUE(state.ok()) << state.status().message();
  ExpectStepRestored(*state, 20, 0);
  EXPECT_TRUE(warnings.empty());
}

TEST(CheckpointTest, MultiHostRoundTripWithThreadsAndRealBarrier) {
  TempDir tmp;
  ASSERT_TRUE(tmp.ok());
  constexpr int kHosts = 4;
  const std::vector<Status> results = RunHosts(
      kHosts, tmp.path(),
      [](int host) { return host % 2 == 0; },  // a mix of both modes
      [](CheckpointManager& manager, int host) {
        for (int64_t step : {5, 6}) {
          Status s = manager.Save(step, StepBlobs(step, host),
                                  {{"step", step}, {"host", host}});
          if (!s.ok()) return s;
        }
        return manager.Wait();
      });
  for (int host = 0; host < kHosts; ++host) {
    EXPECT_TRUE(results[host].ok()) << host << ": " << results[host].message();
  }

  // A reader with another host count gathers every old host's shards.
  CheckpointManager reader(SyncOptions(tmp.path()));
  Result<int64_t> latest = reader.LatestCompleteStep();
  ASSERT_TRUE(latest.ok());
  EXPECT_EQ(*latest, 6);
  Result<int> count = reader.HostCount(6);
  ASSERT_TRUE(count.ok());
  ASSERT_EQ(*count, kHosts);
  for (int host = 0; host < kHosts; ++host) {
    Result<RestoredState> state = reader.Restore(6, host);
    ASSERT_TRUE(state.ok()) << state.status().message();
    ExpectStepRestored(*state, 6, host);
    EXPECT_EQ(state->host_count, kHosts);
    EXPECT_EQ(state->metadata.value("host", -1), host);
  }
  EXPECT_FALSE(reader.Restore(6, kHosts).ok());
}

TEST(CheckpointTest, AsyncSaveReturnsBeforeTheWriteEnds) {
  TempDir tmp;
  ASSERT_TRUE(tmp.ok());
  // The barrier blocks the background writer at "ckpt:write" (after the
  // files are written, before the commit) until the test releases it, so
  // Save can only have returned if it did not write inline.
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  std::promise<void> writing;
  int barrier_calls = 0;
  std::vector<std::string> barrier_names;
  CheckpointOptions options = AsyncOptions(tmp.path());
  options.barrier = [&](const std::string& name) {
    barrier_names.push_back(name);
    if (++barrier_calls == 2) {
      writing.set_value();
      if (released.wait_for(std::chrono::seconds(60)) !=
          std::future_status::ready) {
        return DeadlineExceeded("test never released the barrier");
      }
    }
    return OkStatus();
  };
  CheckpointManager manager(options);
  std::vector<Blob> blobs;
  blobs.push_back(MakeBlob("big", 64 << 20, 3));
  ASSERT_TRUE(manager.Save(1, std::move(blobs), {{"step", 1}}).ok());
  // Save returned; the writer now reaches the barrier on its own.
  ASSERT_EQ(writing.get_future().wait_for(std::chrono::seconds(60)),
            std::future_status::ready);
  EXPECT_TRUE(fs::exists(tmp.path() + "/1.tmp/host0.bin"));
  EXPECT_FALSE(fs::exists(tmp.path() + "/1/COMMITTED"));
  EXPECT_EQ(manager.LatestCompleteStep().status().code(),
            StatusCode::kNotFound);
  release.set_value();
  Status waited = manager.Wait();
  ASSERT_TRUE(waited.ok()) << waited.message();
  EXPECT_TRUE(fs::exists(tmp.path() + "/1/COMMITTED"));
  // Each barrier is named by its save's step, so that a host that joined
  // the job later meets the same ones.
  EXPECT_EQ(barrier_names,
            (std::vector<std::string>{"1/ckpt:prepare", "1/ckpt:write",
                                      "1/ckpt:commit"}));
  Result<RestoredState> state = manager.Restore(1, 0);
  ASSERT_TRUE(state.ok()) << state.status().message();
  EXPECT_TRUE(state->blobs.at("big").data == Pattern(64 << 20, 3));
  EXPECT_GE(manager.last_save_bytes(), uint64_t{64} << 20);
}

TEST(CheckpointTest, AsyncErrorIsReturnedByTheNextWait) {
  TempDir tmp;
  ASSERT_TRUE(tmp.ok());
  CheckpointOptions options = AsyncOptions(tmp.path());
  bool fail = true;
  options.barrier = [&](const std::string&) {
    return fail ? Unavailable("host 1 vanished") : OkStatus();
  };
  CheckpointManager manager(options);
  ASSERT_TRUE(manager.Save(1, StepBlobs(1, 0), {}).ok());
  Status waited = manager.Wait();
  EXPECT_FALSE(waited.ok());
  EXPECT_NE(waited.message().find("ckpt:prepare"), std::string::npos)
      << waited.message();
  EXPECT_TRUE(manager.Wait().ok());  // reported once
  fail = false;
  ASSERT_TRUE(manager.Save(2, StepBlobs(2, 0), {{"step", 2}}).ok());
  ASSERT_TRUE(manager.Save(3, StepBlobs(3, 0), {{"step", 3}}).ok());
  ASSERT_TRUE(manager.Wait().ok());
  Result<std::vector<int64_t>> steps = manager.CompleteSteps();
  ASSERT_TRUE(steps.ok());
  EXPECT_EQ(*steps, (std::vector<int64_t>{2, 3}));
}

TEST(CheckpointTest, InterruptedSavesAreNeverRestored) {
  TempDir tmp;
  ASSERT_TRUE(tmp.ok());
  CheckpointManager manager(SyncOptions(tmp.path()));
  SaveStep(manager, 1);
  // Step 2: written into 2.tmp, never renamed (killed before the commit).
  fs::copy(tmp.path() + "/1", tmp.path() + "/2.tmp");
  fs::remove(tmp.path() + "/2.tmp/COMMITTED");
  // Step 3: renamed but COMMITTED never written.
  fs::copy(tmp.path() + "/1", tmp.path() + "/3");
  fs::remove(tmp.path() + "/3/COMMITTED");

  Result<int64_t> latest = manager.LatestCompleteStep();
  ASSERT_TRUE(latest.ok());
  EXPECT_EQ(*latest, 1);
  EXPECT_EQ(manager.Restore(3, 0).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(manager.Restore(2, 0).status().code(), StatusCode::kNotFound);
  Result<RestoredState> state = manager.RestoreLatest(0, nullptr);
  ASSERT_TRUE(state.ok());
  ExpectStepRestored(*state, 1, 0);

  // The next commit removes both leftovers; re-saving step 3 replaces it.
  SaveStep(manager, 3);
  EXPECT_FALSE(fs::exists(tmp.path() + "/2.tmp"));
  latest = manager.LatestCompleteStep();
  ASSERT_TRUE(latest.ok());
  EXPECT_EQ(*latest, 3);
  state = manager.Restore(3, 0);
  ASSERT_TRUE(state.ok()) << state.status().message();
  ExpectStepRestored(*state, 3, 0);
}

TEST(CheckpointTest, FlippedByteNamesTheBlobAndRestoreLatestFallsBack) {
  TempDir tmp;
  ASSERT_TRUE(tmp.ok());
  const std::string dir = tmp.path() + "/runs/r/checkpoints";
  CheckpointManager manager(SyncOptions(dir));
  SaveStep(manager, 10);
  SaveStep(manager, 20);
  // layer3/w follows layer0/w (4096 bytes).
  FlipByte(dir + "/20/host0.bin", 4096 + 500);

  Result<RestoredState> state = manager.Restore(20, 0);
  ASSERT_FALSE(state.ok());
  const std::string expected =
      dir + "/20/host0.bin: blob 'layer3/w' checksum mismatch";
  EXPECT_EQ(state.status().message(), expected);
  EXPECT_EQ(state.status().message().find('\n'), std::string::npos);

  std::vector<std::string> warnings;
  state = manager.RestoreLatest(0, &warnings);
  ASSERT_TRUE(state.ok()) << state.status().message();
  ExpectStepRestored(*state, 10, 0);
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_EQ(warnings[0], expected);
}

TEST(CheckpointTest, TruncatedHostFileIsDetected) {
  TempDir tmp;
  ASSERT_TRUE(tmp.ok());
  CheckpointManager manager(SyncOptions(tmp.path()));
  SaveStep(manager, 1);
  SaveStep(manager, 2);
  const std::string bin = tmp.path() + "/2/host0.bin";
  fs::resize_file(bin, 4096 + 10);
  Result<RestoredState> state = manager.Restore(2, 0);
  ASSERT_FALSE(state.ok());
  EXPECT_NE(state.status().message().find(bin + ": blob 'layer3/w'"),
            std::string::npos)
      << state.status().message();
  EXPECT_NE(state.status().message().find("truncated"), std::string::npos);

  // A truncated index is reported too, naming the file.
  const std::string index = tmp.path() + "/1/host0.json";
  fs::resize_file(index, fs::file_size(index) / 2);
  state = manager.Restore(1, 0);
  ASSERT_FALSE(state.ok());
  EXPECT_EQ(state.status().message().rfind(index + ":", 0), 0u)
      << state.status().message();

  std::vector<std::string> warnings;
  state = manager.RestoreLatest(0, &warnings);
  EXPECT_FALSE(state.ok());
  EXPECT_EQ(warnings.size(), 2u);
}

TEST(CheckpointTest, MaxToKeepDeletesOldSteps) {
  TempDir tmp;
  ASSERT_TRUE(tmp.ok());
  CheckpointOptions options = SyncOptions(tmp.path());
  options.max_to_keep = 2;
  CheckpointManager manager(options);
  for (int64_t step : {100, 200, 300, 400}) SaveStep(manager, step);
  Result<std::vector<int64_t>> steps = manager.CompleteSteps();
  ASSERT_TRUE(steps.ok());
  EXPECT_EQ(*steps, (std::vector<int64_t>{300, 400}));
  EXPECT_FALSE(fs::exists(tmp.path() + "/100"));
  EXPECT_FALSE(fs::exists(tmp.path() + "/200"));
}

TEST(CheckpointTest, UnwritableDirectoryIsNamed) {
  TempDir tmp;
  ASSERT_TRUE(tmp.ok());
  // A regular file where a directory should be: fails even for root.
  const std::string file = tmp.path() + "/not-a-dir";
  std::ofstream(file) << "x";
  CheckpointManager manager(SyncOptions(file + "/checkpoints"));
  Status status = manager.Save(1, StepBlobs(1, 0), {});
  ASSERT_FALSE(status.ok());
  EXPECT_NE(status.message().find(file + "/checkpoints"), std::string::npos)
      << status.message();

  CheckpointManager async_manager(AsyncOptions(file + "/checkpoints"));
  ASSERT_TRUE(async_manager.Save(1, StepBlobs(1, 0), {}).ok());
  status = async_manager.Wait();
  ASSERT_FALSE(status.ok());
  EXPECT_NE(status.message().find(file + "/checkpoints"), std::string::npos)
      << status.message();
}

TEST(CheckpointTest, InvalidOptionsAndBlobs) {
  TempDir tmp;
  ASSERT_TRUE(tmp.ok());
  CheckpointManager manager(SyncOptions(tmp.path()));
  std::vector<Blob> duplicate = {MakeBlob("a", 4, 1), MakeBlob("a", 4, 2)};
  EXPECT_EQ(manager.Save(1, duplicate, {}).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(manager.Save(-1, {}, {}).code(), StatusCode::kInvalidArgument);
  CheckpointOptions options = SyncOptions(tmp.path());
  options.host_count = 2;  // no barrier
  CheckpointManager no_barrier(options);
  EXPECT_EQ(no_barrier.Save(1, {}, {}).code(), StatusCode::kInvalidArgument);
}

// Waits for one byte on `fd` for at most `timeout_ms`.
bool ReadByteWithin(int fd, int timeout_ms) {
  pollfd p{fd, POLLIN, 0};
  if (::poll(&p, 1, timeout_ms) != 1) return false;
  char c;
  return ::read(fd, &c, 1) == 1;
}

// Reaps `pid`, waiting at most `timeout_ms`; kills it if it overstays.
bool ReapWithin(pid_t pid, int timeout_ms, int* wait_status) {
  for (int waited = 0; waited < timeout_ms; waited += 10) {
    if (::waitpid(pid, wait_status, WNOHANG) == pid) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ::kill(pid, SIGKILL);
  ::waitpid(pid, wait_status, 0);
  return false;
}

// Runs `child` in a forked process that ignores SIGXFSZ (a write past a file
// size limit then fails with EFBIG) and expects it to return 0 within 60 s.
void ExpectChildReturnsZero(const std::function<int()>& child) {
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::signal(SIGXFSZ, SIG_IGN);
    ::_exit(child());
  }
  int wait_status = 0;
  ASSERT_TRUE(ReapWithin(pid, 60000, &wait_status));
  ASSERT_TRUE(WIFEXITED(wait_status));
  EXPECT_EQ(WEXITSTATUS(wait_status), 0);
}

TEST(CheckpointTest, CompleteStepIsNeverOverwritten) {
  TempDir tmp;
  ASSERT_TRUE(tmp.ok());
  CheckpointManager manager(SyncOptions(tmp.path()));
  SaveStep(manager, 7);
  Status status = manager.Save(7, StepBlobs(8, 0), {{"step", 8}});
  EXPECT_EQ(status.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(status.message().find(tmp.path() + "/7 is already a complete"),
            std::string::npos)
      << status.message();
  Result<RestoredState> state = manager.Restore(7, 0);
  ASSERT_TRUE(state.ok()) << state.status().message();
  ExpectStepRestored(*state, 7, 0);
}

TEST(CheckpointTest, AsyncSaveAfterAFailureReportsItAndStillSaves) {
  TempDir tmp;
  ASSERT_TRUE(tmp.ok());
  CheckpointOptions options = AsyncOptions(tmp.path());
  int calls = 0;
  options.barrier = [&](const std::string&) {
    return ++calls == 1 ? Unavailable("peer lost") : OkStatus();
  };
  CheckpointManager manager(options);
  ASSERT_TRUE(manager.Save(1, StepBlobs(1, 0), {{"step", 1}}).ok());
  Status status = manager.Save(2, StepBlobs(2, 0), {{"step", 2}});
  EXPECT_EQ(status.code(), StatusCode::kUnavailable);
  EXPECT_NE(status.message().find("previous checkpoint save failed"),
            std::string::npos)
      << status.message();
  ASSERT_TRUE(manager.Wait().ok());
  Result<std::vector<int64_t>> steps = manager.CompleteSteps();
  ASSERT_TRUE(steps.ok());
  EXPECT_EQ(*steps, std::vector<int64_t>{2});
}

TEST(CheckpointTest, AHostThatFailsPreventsTheCommitWithoutAHang) {
  TempDir tmp;
  ASSERT_TRUE(tmp.ok());
  const std::vector<Status> results = RunHosts(
      3, tmp.path(), AllInline, [](CheckpointManager& manager, int host) {
        std::vector<Blob> blobs = StepBlobs(1, host);
        if (host == 1) blobs.push_back(blobs.front());  // a duplicate name
        return manager.Save(1, std::move(blobs), {});
      });
  EXPECT_EQ(results[1].code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(results[2].ok()) << results[2].message();
  ASSERT_FALSE(results[0].ok());
  EXPECT_NE(results[0].message().find(tmp.path() + "/1.tmp/host1.json"),
            std::string::npos)
      << results[0].message();
  CheckpointManager reader(SyncOptions(tmp.path()));
  EXPECT_EQ(reader.LatestCompleteStep().status().code(), StatusCode::kNotFound);
}

TEST(CheckpointTest, WriteErrorNamesTheFile) {
  // A file size limit makes write() fail (EFBIG) as a full disk would
  // (ENOSPC); set in a child so that the test process keeps no limit.
  TempDir tmp;
  ASSERT_TRUE(tmp.ok());
  ASSERT_NO_FATAL_FAILURE(ExpectChildReturnsZero([&] {
    rlimit limit{1 << 20, 1 << 20};
    if (::setrlimit(RLIMIT_FSIZE, &limit) != 0) return 2;
    CheckpointManager manager(SyncOptions(tmp.path()));
    std::vector<Blob> blobs;
    blobs.push_back(MakeBlob("big", 4 << 20, 1));
    Status status = manager.Save(1, std::move(blobs), {});
    const std::string expected = tmp.path() + "/1.tmp/host0.bin: write failed";
    return !status.ok() && status.message().find(expected) != std::string::npos
               ? 0
               : 1;
  }));
  CheckpointManager reader(SyncOptions(tmp.path()));
  EXPECT_EQ(reader.LatestCompleteStep().status().code(), StatusCode::kNotFound);
}

TEST(CheckpointTest, ProcessKilledMidSaveLeavesThePreviousStep) {
  TempDir tmp;
  ASSERT_TRUE(tmp.ok());
  int pipe_fds[2];
  ASSERT_EQ(::pipe(pipe_fds), 0);
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    // Child: commit step 1, then start writing a 256 MiB step 2. The
    // barrier tells the parent once the write phase begins; a second
    // barrier (after the write) never returns, so the child can be killed
    // only before its commit, mid-write or just after it.
    ::close(pipe_fds[0]);
    CheckpointOptions options = SyncOptions(tmp.path());
    CheckpointManager first(options);
    if (!first.Save(1, StepBlobs(1, 0), {{"step", 1}}).ok()) ::_exit(3);
    int calls = 0;
    options.barrier = [&](const std::string&) {
      if (++calls == 1) {
        (void)!::write(pipe_fds[1], "w", 1);
      } else {
        ::pause();
      }
      return OkStatus();
    };
    CheckpointManager second(options);
    std::vector<Blob> blobs;
    blobs.push_back(MakeBlob("big", 256 << 20, 9));
    (void)second.Save(2, std::move(blobs), {{"step", 2}});
    ::_exit(4);
  }
  ::close(pipe_fds[1]);
  const bool started = ReadByteWithin(pipe_fds[0], 60000);
  ::close(pipe_fds[0]);
  ::kill(pid, SIGKILL);
  int wait_status = 0;
  ASSERT_TRUE(ReapWithin(pid, 30000, &wait_status));
  ASSERT_TRUE(started) << "child never reached the write phase";
  ASSERT_TRUE(WIFSIGNALED(wait_status));
  EXPECT_EQ(WTERMSIG(wait_status), SIGKILL);

  CheckpointManager reader(SyncOptions(tmp.path()));
  Result<int64_t> latest = reader.LatestCompleteStep();
  ASSERT_TRUE(latest.ok());
  EXPECT_EQ(*latest, 1);
  EXPECT_FALSE(fs::exists(tmp.path() + "/2/COMMITTED"));
  std::vector<std::string> warnings;
  Result<RestoredState> state = reader.RestoreLatest(0, &warnings);
  ASSERT_TRUE(state.ok()) << state.status().message();
  ExpectStepRestored(*state, 1, 0);
  EXPECT_TRUE(warnings.empty());
}

// A full disk mid-run, in a child with a file size limit (EFBIG; ENOSPC on
// a real full disk behaves the same): the async save of step 2 fails in the
// writer; Poll reports it once, as soon as the writer is done (not only at
// the next Save), with the step, the file and strerror's text; nothing of
// step 2 is left, and step 1 restores intact.
TEST(CheckpointTest, FailedAsyncSaveIsPolledAndLeavesNoTrace) {
  TempDir tmp;
  ASSERT_TRUE(tmp.ok());
  ASSERT_NO_FATAL_FAILURE(ExpectChildReturnsZero([&] {
    CheckpointManager manager(AsyncOptions(tmp.path()));
    if (!manager.Save(1, StepBlobs(1, 0), {{"step", 1}}).ok()) return 2;
    if (!manager.Wait().ok()) return 3;
    rlimit limit{1 << 20, RLIM_INFINITY};
    if (::setrlimit(RLIMIT_FSIZE, &limit) != 0) return 4;
    std::vector<Blob> blobs;
    blobs.push_back(MakeBlob("big", 4 << 20, 1));
    if (!manager.Save(2, std::move(blobs), {}).ok()) return 5;
    Status polled;
    for (int i = 0; i < 6000 && polled.ok(); ++i) {
      polled = manager.Poll();
      if (polled.ok()) ::usleep(10000);
    }
    const std::string expected = "checkpoint of step 2 failed: " + tmp.path() +
                                 "/2.tmp/host0.bin: write failed: File too "
                                 "large";
    if (polled.message() != expected) {
      std::fprintf(stderr, "polled: '%s'\n", polled.message().c_str());
      return 6;
    }
    return manager.Poll().ok() && manager.Wait().ok() ? 0 : 7;
  }));
  EXPECT_FALSE(fs::exists(tmp.path() + "/2.tmp"));
  EXPECT_FALSE(fs::exists(tmp.path() + "/2"));
  CheckpointManager reader(SyncOptions(tmp.path()));
  Result<RestoredState> state = reader.RestoreLatest(0, nullptr);
  ASSERT_TRUE(state.ok()) << state.status().message();
  ExpectStepRestored(*state, 1, 0);
}

// Poll never blocks: ok while a save is being written.
TEST(CheckpointTest, PollIsOkWhileASaveIsInFlight) {
  TempDir tmp;
  ASSERT_TRUE(tmp.ok());
  CheckpointOptions options = AsyncOptions(tmp.path());
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  int calls = 0;
  options.barrier = [&](const std::string&) {
    if (++calls == 2) released.wait();  // hold the save in its write phase
    return OkStatus();
  };
  CheckpointManager manager(options);
  ASSERT_TRUE(manager.Save(1, StepBlobs(1, 0), {{"step", 1}}).ok());
  EXPECT_TRUE(manager.Poll().ok());
  release.set_value();
  EXPECT_TRUE(manager.Wait().ok());
  EXPECT_TRUE(fs::exists(tmp.path() + "/1/COMMITTED"));
}

// Hosts 0 and 1 write their files of step 2 and host 2 cannot (its blobs
// are rejected): host 0 does not commit and removes the step's .tmp
// directory with what the others wrote into it, and the complete step 1 is
// untouched.
TEST(CheckpointTest, FailedSaveOfAPeerIsCleanedUpByHostZero) {
  TempDir tmp;
  ASSERT_TRUE(tmp.ok());
  constexpr int kHosts = 3;
  const std::vector<Status> results = RunHosts(
      kHosts, tmp.path(), AllInline, [](CheckpointManager& manager, int host) {
        Status saved = manager.Save(1, StepBlobs(1, host), {{"step", 1}});
        if (!saved.ok()) return saved;
        std::vector<Blob> blobs = StepBlobs(2, host);
        if (host == 2) blobs.push_back(blobs.front());  // a duplicate name
        return manager.Save(2, std::move(blobs), {});
      });
  EXPECT_EQ(results[2].code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(results[1].ok()) << results[1].message();
  EXPECT_NE(results[0].message().find("2.tmp/host2.json is missing"),
            std::string::npos)
      << results[0].message();
  EXPECT_FALSE(fs::exists(tmp.path() + "/2.tmp"));
  EXPECT_FALSE(fs::exists(tmp.path() + "/2"));
  CheckpointManager reader(SyncOptions(tmp.path()));
  Result<std::vector<int64_t>> steps = reader.CompleteSteps();
  ASSERT_TRUE(steps.ok());
  EXPECT_EQ(*steps, std::vector<int64_t>{1});
  for (int host = 0; host < kHosts; ++host) {
    Result<RestoredState> state = reader.Restore(1, host);
    ASSERT_TRUE(state.ok()) << state.status().message();
    ExpectStepRestored(*state, 1, host);
  }
}

// A host that abstains from a save keeps the step from committing without
// a hang, whichever host it is (host 0 by not committing, host 1 by writing
// no index), and gets no error of its own; host 0 alone learns of the
// refused commit. The next save commits as usual. Host 0 saves inline,
// host 1 in the background.
TEST(CheckpointTest, AbstainingHostPreventsTheCommit) {
  for (int abstainer : {0, 1}) {
    TempDir tmp;
    ASSERT_TRUE(tmp.ok());
    constexpr int kHosts = 2;
    std::vector<Status> first(kHosts);
    const std::vector<Status> second = RunHosts(
        kHosts, tmp.path(), [](int host) { return host == 1; },
        [&](CheckpointManager& manager, int host) {
          first[host] =
              host == abstainer
                  ? manager.Abstain(1, Internal("metrics lost"))
                  : manager.Save(1, StepBlobs(1, host), {{"step", 1}});
          if (first[host].ok()) first[host] = manager.Wait();
          Status saved = manager.Save(2, StepBlobs(2, host), {{"step", 2}});
          return saved.ok() ? manager.Wait() : saved;
        });
    const std::string at = "abstainer " + std::to_string(abstainer);
    EXPECT_TRUE(first[abstainer].ok()) << at << first[abstainer].message();
    if (abstainer == 1) {
      EXPECT_NE(first[0].message().find("1.tmp/host1.json is missing"),
                std::string::npos)
          << at << first[0].message();
    } else {
      EXPECT_TRUE(first[1].ok()) << at << first[1].message();
    }
    for (int host = 0; host < kHosts; ++host) {
      EXPECT_TRUE(second[host].ok()) << at << second[host].message();
    }
    EXPECT_FALSE(fs::exists(tmp.path() + "/1.tmp")) << at;
    EXPECT_FALSE(fs::exists(tmp.path() + "/1")) << at;
    CheckpointManager reader(SyncOptions(tmp.path()));
    Result<std::vector<int64_t>> steps = reader.CompleteSteps();
    ASSERT_TRUE(steps.ok());
    EXPECT_EQ(*steps, std::vector<int64_t>{2}) << at;
  }
}

TEST(CheckpointTest, SyncSaveThroughput256MiB) {
  TempDir tmp;
  ASSERT_TRUE(tmp.ok());
  CheckpointManager manager(SyncOptions(tmp.path()));
  std::vector<Blob> blobs;
  constexpr size_t kBlobBytes = 64 << 20;
  for (int i = 0; i < 4; ++i) {
    blobs.push_back(MakeBlob("shard" + std::to_string(i), kBlobBytes, i));
  }
  // The checksum's share of the save time, for the record.
  const auto crc_start = std::chrono::steady_clock::now();
  uint32_t crc = 0;
  for (const Blob& blob : blobs)
    crc = Crc32c(blob.data.data(), kBlobBytes, crc);
  const double crc_seconds = std::chrono::duration<double>(
                                 std::chrono::steady_clock::now() - crc_start)
                                 .count();
  ASSERT_TRUE(manager.Save(1, std::move(blobs), {}).ok());
  const double seconds = manager.last_save_seconds();
  const double mib =
      static_cast<double>(manager.last_save_bytes()) / (1024.0 * 1024.0);
  EXPECT_GE(mib, 256.0);
  ASSERT_GT(seconds, 0.0);
  std::cout << "sync save of " << mib << " MiB took " << seconds
            << " s: " << mib / seconds
            << " MiB/s (CRC32C + write + fsync + commit); CRC32C alone: "
            << 256.0 / crc_seconds << " MiB/s (crc " << crc << ")\n";
  RecordProperty("save_mib_per_second", std::to_string(mib / seconds));
}

}  // namespace
}  // namespace multislice
