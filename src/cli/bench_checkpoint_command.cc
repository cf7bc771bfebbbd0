// `multislice bench checkpoint`: how fast a synchronous checkpoint save of a
// train config's model writes, against the disk's sequential write bandwidth
// measured in the same run and the same directory (issue 4's "at least 50 %
// of the disk's sequential write bandwidth").
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>

#include "cli/commands.h"
#include "cli/flags.h"
#include "model/decoder.h"
#include "train/checkpoint.h"
#include "train/config.h"
#include "train/train_state.h"
#include "train/trainer.h"

namespace multislice::cli {
namespace {

constexpr char kName[] = "multislice bench checkpoint";
using Clock = std::chrono::steady_clock;

struct CheckpointBenchFlags {
  std::string config_path = "configs/quickstart.yml";
  std::vector<std::string> overrides;
  std::string directory = ".";
  int reps = 5;
  bool json = false;
};

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Writes `bytes` to a fresh file in 8 MiB chunks, fsyncs it and its
// directory: the plain sequential write a save is compared with. Seconds.
Result<double> SequentialWrite(const std::string& dir, size_t bytes) {
  const std::string path = dir + "/seqwrite.bin";
  std::vector<char> chunk(8 << 20);
  std::mt19937 rng(1);
  for (char& c : chunk) c = static_cast<char>(rng());
  const Clock::time_point start = Clock::now();
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) return Internal(path + ": cannot create");
  for (size_t done = 0; done < bytes;) {
    const size_t n = std::min(chunk.size(), bytes - done);
    const ssize_t w = ::write(fd, chunk.data(), n);
    if (w <= 0) {
      ::close(fd);
      return Internal(path + ": write failed");
    }
    done += static_cast<size_t>(w);
  }
  ::fsync(fd);
  ::close(fd);
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
  const double seconds =
      std::chrono::duration<double>(Clock::now() - start).count();
  std::filesystem::remove(path);
  return seconds;
}

int Run(const CheckpointBenchFlags& flags) {
  auto fail = [](const Status& s) {
    std::fprintf(stderr, "%s: %s\n", kName, s.message().c_str());
    return ExitCodeFor(s);
  };
  auto config = LoadTrainConfig(flags.config_path, flags.overrides);
  if (!config.ok()) return fail(config.status());
  if (flags.reps < 1) {
    return fail(InvalidArgument("--reps: expected at least 1, got " +
                                std::to_string(flags.reps)));
  }
  const model::DecoderConfig model = train::DecoderConfigOf(*config);
  if (Status s = model::ValidateConfig(model); !s.ok()) return fail(s);
  const int64_t n = model::NumParameters(model);

  std::error_code ec;
  const std::string dir = flags.directory + "/multislice-bench-checkpoint-" +
                          std::to_string(::getpid());
  std::filesystem::create_directories(dir, ec);
  if (ec) {
    return fail(
        InvalidArgument("--directory: '" + flags.directory +
                        "' cannot hold a new directory: " + ec.message()));
  }
  // The state of one data replica: weights and both AdamW moments.
  std::vector<float> params(static_cast<size_t>(n)), m(params.size()),
      v(params.size());
  model::InitParameters(model, 1, params.data());
  for (size_t i = 0; i < params.size(); ++i) {
    m[i] = params[i] * 1e-3f;
    v[i] = params[i] * params[i] * 1e-6f;
  }
  const train::StateShard shard{0, params.data(), m.data(), v.data(), n};
  const size_t state_bytes = 3 * params.size() * sizeof(float);

  std::vector<double> save_seconds, write_seconds;
  uint64_t saved_bytes = 0;
  Status status;
  for (int rep = 0; rep < flags.reps && status.ok(); ++rep) {
    // Alternate the two so that both see the same state of the disk.
    auto write = SequentialWrite(dir, state_bytes);
    if (!write.ok()) {
      status = write.status();
      break;
    }
    write_seconds.push_back(*write);
    CheckpointOptions options;
    options.directory = dir + "/checkpoints";
    options.async = false;
    options.max_to_keep = 1;
    CheckpointManager manager(options);
    train::IteratorState iterator;
    // The copy out of the training buffers is not the save's: a trainer
    // makes it before handing the blobs over (and trains on meanwhile when
    // saving asynchronously).
    std::vector<Blob> blobs = train::ShardBlobs({shard});
    const Clock::time_point start = Clock::now();
    status = manager.Save(rep + 1, std::move(blobs),
                          train::StateMetadata(rep + 1, model, {"data"}, {1}, 1,
                                               {shard}, iterator));
    save_seconds.push_back(
        std::chrono::duration<double>(Clock::now() - start).count());
    saved_bytes = manager.last_save_bytes();
  }
  std::filesystem::remove_all(dir, ec);
  if (!status.ok()) return fail(status);

  const double save = Median(save_seconds), write = Median(write_seconds);
  const double save_mbps = static_cast<double>(saved_bytes) / save / 1e6;
  const double write_mbps = static_cast<double>(state_bytes) / write / 1e6;
  if (flags.json) {
    nlohmann::json out = {{"parameters", n},
                          {"state_bytes", state_bytes},
                          {"saved_bytes", saved_bytes},
                          {"reps", flags.reps},
                          {"save_seconds_median", save},
                          {"save_mb_per_s", save_mbps},
                          {"sequential_write_seconds_median", write},
                          {"sequential_write_mb_per_s", write_mbps},
                          {"ratio", save_mbps / write_mbps},
                          {"save_seconds", save_seconds},
                          {"sequential_write_seconds", write_seconds}};
    std::printf("%s\n", out.dump().c_str());
  } else {
    std::printf(
        "model of %lld parameters: state %.1f MB (weights + AdamW m, v)\n"
        "sync checkpoint save: %.1f MB in %.4f s = %.0f MB/s (median of %d; "
        "CRC32C + write + fsync + rename + commit)\n"
        "sequential write of the same bytes + fsync: %.4f s = %.0f MB/s\n"
        "save / sequential write = %.2f\n",
        static_cast<long long>(n), state_bytes / 1e6, saved_bytes / 1e6, save,
        save_mbps, flags.reps, write, write_mbps, save_mbps / write_mbps);
  }
  return 0;
}

}  // namespace

void AddBenchCheckpointCommand(CLI::App& bench, CommandTable& table) {
  CLI::App* cmd = bench.add_subcommand(
      "checkpoint",
      "A synchronous checkpoint save of a train config's model state "
      "(weights and AdamW moments, already copied out of the training "
      "buffers) against a plain sequential write + fsync "
      "of the same bytes in the same directory, alternated, median of "
      "--reps.\n"
      "Example:\n"
      "  multislice bench checkpoint --config configs/quickstart.yml "
      "--directory runs");
  auto flags = std::make_shared<CheckpointBenchFlags>();
  AddStringFlag(cmd, "config", &flags->config_path,
                "The train config whose model size is saved.");
  cmd->add_option("overrides", flags->overrides, "key=value overrides.");
  AddStringFlag(cmd, "directory", &flags->directory,
                "Where to write (a temporary directory is made inside).");
  AddIntFlag(cmd, "reps", &flags->reps, "Repetitions of each measurement.");
  AddBoolFlag(cmd, "json", &flags->json, "Print one JSON object.");
  table[cmd] = [flags] { return Run(*flags); };
}

}  // namespace multislice::cli
