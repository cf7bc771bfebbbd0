// pack.h: what is left out of a script directory, the refusal before
// packing, and the progress line on a terminal.
#include "control/agent/pack.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>
#include <sstream>

#include "common/temp_dir.h"
#include "control/agent/local_cluster_test_util.h"

namespace multislice::control {
namespace {

namespace fs = std::filesystem;
using testing::ReadWholeFile;

void Write(const std::string& path, const std::string& text) {
  fs::create_directories(fs::path(path).parent_path());
  std::ofstream(path) << text;
}

// The member names of a tar.gz, by `tar -tzf` (into a file, no shell).
std::set<std::string> Members(const std::string& archive,
                              const std::string& dir) {
  testing::CliProcess list({"/usr/bin/tar", "-tzf", archive}, dir + "/list",
                           "");
  EXPECT_EQ(list.Wait(std::chrono::seconds(30)), 0) << list.Output();
  std::set<std::string> names;
  std::istringstream lines(list.Output());
  for (std::string line; std::getline(lines, line);) names.insert(line);
  return names;
}

class PackTest : public ::testing::Test {
 protected:
  std::string code() { return dir_.path() + "/code"; }
  PackOptions Options() {
    PackOptions options;
    options.dir = code();
    options.archive = dir_.path() + "/code.tar.gz";
    options.err = nullptr;
    return options;
  }
  TempDir dir_{"pack-test-"};
};

TEST_F(PackTest, OutputFoldersAndAControllersDataAreNeverPacked) {
  Write(code() + "/train.sh", "echo train\n");
  Write(code() + "/lib/util.sh", "echo util\n");
  // This run's own folder, marked before packing; an earlier run's of the
  // old layout (no marker); a job's; a controller's data directory.
  ASSERT_TRUE(MarkOutputFolder(code() + "/runs/now").ok());
  Write(code() + "/runs/now/output_slice_0001_worker_0000.txt", "x");
  Write(code() + "/2026-11-30-07-48-08/output_slice_0000_worker_0000.txt", "");
  Write(code() + "/jobs/demo/main_command_log_slice_0_worker_0", "log");
  Write(code() + "/jobs/demo/code.tar.gz", "old archive");
  Write(code() + "/ctl/agent-token", "secret");
  Write(code() + "/ctl/token", "secret");
  Result<DirectorySize> size = MeasureDirectory(code());
  ASSERT_TRUE(size.ok()) << size.status().message();
  EXPECT_EQ(size->files, 2u);
  EXPECT_EQ(size->bytes, 21u);
  Result<PackSummary> packed = PackDirectory(Options());
  ASSERT_TRUE(packed.ok()) << packed.status().message();
  EXPECT_EQ(Members(Options().archive, dir_.path()),
            (std::set<std::string>{"./", "./train.sh", "./lib/",
                                   "./lib/util.sh", "./runs/", "./jobs/"}));
}

TEST_F(PackTest, AnOutputFolderAsTheScriptDirIsRefused) {
  ASSERT_TRUE(MarkOutputFolder(code()).ok());
  Result<PackSummary> packed = PackDirectory(Options());
  EXPECT_EQ(packed.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(packed.status().message().find("--script_dir: " + code() +
                                           " is an output folder"),
            std::string::npos)
      << packed.status().message();
}

TEST_F(PackTest, TooLargeIsRefusedBeforePackingNamingTheLargest) {
  Write(code() + "/small.txt", "x");
  fs::create_directories(code() + "/data");
  // Sparse: 300 MiB that take no disk.
  std::ofstream(code() + "/data/big.bin").close();
  fs::resize_file(code() + "/data/big.bin", 300ull << 20);
  PackOptions options = Options();
  options.flag = "--SCRIPT_DIR";
  const auto start = std::chrono::steady_clock::now();
  Result<PackSummary> packed = PackDirectory(options);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(2));
  ASSERT_EQ(packed.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(packed.status().message(),
            "--SCRIPT_DIR: " + code() +
                " holds 300 MiB in 2 files to pack (data/ 300 MiB, "
                "small.txt 1 B), more than the 256 MiB the agents accept; "
                "point it at the folder the command needs (output folders "
                "of multislice run and job are never packed)");
  EXPECT_FALSE(fs::exists(options.archive));
}

TEST_F(PackTest, ATerminalSeesProgressAndEveryoneTheSize) {
  // 24 MiB that gzip cannot shrink: packing takes long enough to be drawn.
  fs::create_directories(code());
  std::mt19937_64 random(7);
  std::string bytes(24 << 20, '\0');
  for (size_t i = 0; i + 8 <= bytes.size(); i += 8) {
    const uint64_t v = random();
    std::memcpy(&bytes[i], &v, 8);
  }
  std::ofstream(code() + "/weights.bin", std::ios::binary) << bytes;
  const std::string err_path = dir_.path() + "/err";
  PackOptions options = Options();
  options.err = std::fopen(err_path.c_str(), "w");
  options.terminal = true;
  options.program = "multislice run";
  Result<PackSummary> packed = PackDirectory(options);
  std::fclose(options.err);
  ASSERT_TRUE(packed.ok()) << packed.status().message();
  const std::string err = ReadWholeFile(err_path);
  EXPECT_NE(err.find("\r\33[Kmultislice run: packing " + code() + ": "),
            std::string::npos)
      << err;
  EXPECT_NE(err.find(" of 24 MiB ("), std::string::npos) << err;
  EXPECT_NE(err.find("multislice run: packed " + code() +
                     ": 1 file, 24 MiB into 24 MiB"),
            std::string::npos)
      << err;
  EXPECT_EQ(packed->size.files, 1u);
  EXPECT_GT(packed->archive_bytes, 24u << 20);
}

TEST(FormatBytesTest, BinaryUnits) {
  EXPECT_EQ(FormatBytes(1), "1 B");
  EXPECT_EQ(FormatBytes(1536), "1.5 KiB");
  EXPECT_EQ(FormatBytes(730ull << 20), "730 MiB");
  EXPECT_EQ(FormatBytes(1932735283ull), "1.8 GiB");
}

// Runs git in `dir` (a test repository); its exit code.
int Git(const std::string& dir, std::vector<std::string> args) {
  args.insert(args.begin(), {"/usr/bin/git", "-C", dir});
  testing::CliProcess git(args, dir + "/../git.log", "");
  return git.Wait(std::chrono::seconds(30));
}

// In a git work tree only what git would commit is packed: the README's
// `run --script_dir .` in this repository packed build/ (2.1 GiB) before.
TEST_F(PackTest, InAGitWorkTreeOnlyWhatGitWouldCommitIsPacked) {
  Write(code() + "/.gitignore", "/build/\n*.o\n");
  Write(code() + "/train.sh", "echo train\n");
  Write(code() + "/gone.sh", "x");
  ASSERT_EQ(Git(code(), {"init", "-q"}), 0);
  ASSERT_EQ(Git(code(), {"add", ".gitignore", "train.sh", "gone.sh"}), 0);
  fs::remove(code() + "/gone.sh");                           // tracked, deleted
  Write(code() + "/new/notes.txt", "untracked\n");           // untracked, kept
  Write(code() + "/build/big.bin", std::string(4096, 'b'));  // ignored
  Write(code() + "/lib.o", "obj");                           // ignored
  ASSERT_TRUE(MarkOutputFolder(code() + "/out").ok());       // not ignored
  Write(code() + "/out/output_slice_0000_worker_0001.txt", "x");
  Result<DirectorySize> size = MeasureDirectory(code());
  ASSERT_TRUE(size.ok()) << size.status().message();
  EXPECT_TRUE(size->git);
  EXPECT_EQ(size->files, 3u);
  EXPECT_EQ(size->bytes, 12u + 11u + 10u);  // .gitignore, train.sh, notes
  Result<PackSummary> packed = PackDirectory(Options());
  ASSERT_TRUE(packed.ok()) << packed.status().message();
  EXPECT_EQ(Members(Options().archive, dir_.path()),
            (std::set<std::string>{".gitignore", "train.sh", "new/notes.txt"}));
  // A folder git ignores as a whole is packed by the walk, all of it.
  PackOptions ignored = Options();
  ignored.dir = code() + "/build";
  Result<PackSummary> walked = PackDirectory(ignored);
  ASSERT_TRUE(walked.ok()) << walked.status().message();
  EXPECT_FALSE(walked->size.git);
  EXPECT_EQ(walked->size.bytes, 4096u);
}

}  // namespace
}  // namespace multislice::control
