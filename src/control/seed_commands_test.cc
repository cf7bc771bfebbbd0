// The seed document's gcloud commands as a test: every line of
// testdata/seed_gcloud_lines.txt (the seed's `gcloud compute tpus` lines with
// `multislice` in their place, rules at the top of that file) runs in bash
// against `multislice controller --local-hosts 2` and must succeed with the
// output the seed shows. A second test checks that those lines are the
// seed's own, when the seed is at hand.
#include <sys/stat.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "control/agent/local_cluster_test_util.h"
#include "gtest/gtest.h"

namespace multislice::control {
namespace {

using testing::CliProcess;
using testing::LocalController;
using testing::ReadWholeFile;

// One `$ ` line of the data file (with its continuations) and the output
// lines the file expects of it.
struct SeedLine {
  std::string command;                // as written, after "$ "
  std::vector<std::string> expected;  // the `> ` lines, "..." included
  bool new_tutorial = false;          // a `## ` line came before it
  bool from_seed = false;             // in one of the seed's tutorials
};

std::vector<SeedLine> ReadSeedLines(const std::string& path) {
  std::vector<SeedLine> lines;
  std::istringstream in(ReadWholeFile(path));
  bool new_tutorial = false, beyond_seed = false, continued = false;
  for (std::string line; std::getline(in, line);) {
    if (continued) {
      lines.back().command += "\n" + line;
      continued = !line.empty() && line.back() == '\\';
      continue;
    }
    const size_t start = line.find_first_not_of(' ');
    if (start == std::string::npos) continue;
    const std::string text = line.substr(start);
    if (text.rfind("## ", 0) == 0) {
      new_tutorial = true;
      beyond_seed = text.find("Beyond the seed") != std::string::npos;
    } else if (text.rfind("$ ", 0) == 0) {
      lines.push_back({text.substr(2), {}, new_tutorial, !beyond_seed});
      new_tutorial = false;
      continued = text.back() == '\\';
    } else if (text.rfind("> ", 0) == 0 && !lines.empty()) {
      lines.back().expected.push_back(text.substr(2));
    }
  }
  return lines;
}

// The seed's notation for choices and optional flags, resolved: `[A|B]`
// runs A, `(X)` and `[X]` run X.
std::string Resolved(const std::string& command) {
  static const std::regex kChoice(R"(\[\s*([^\]|]*?)\s*\|[^\]]*\])");
  static const std::regex kOptional(R"([\[(](--[a-z-]+)[\])])");
  return std::regex_replace(std::regex_replace(command, kChoice, "$1"),
                            kOptional, "$1");
}

std::vector<std::string> Words(const std::string& line) {
  std::istringstream in(line);
  std::vector<std::string> words;
  for (std::string w; in >> w;) words.push_back(w);
  return words;
}

// Whether each run of `expected` lines between "..." lines appears as
// consecutive lines of `output`, word by word.
bool Shows(const std::string& output, const std::vector<std::string>& expected,
           std::string* missing) {
  std::vector<std::vector<std::string>> out;
  std::istringstream in(output);
  for (std::string line; std::getline(in, line);) out.push_back(Words(line));
  std::vector<std::vector<std::vector<std::string>>> runs(1);
  for (const std::string& e : expected) {
    if (e == "...") {
      runs.emplace_back();
    } else {
      runs.back().push_back(Words(e));
    }
  }
  for (const auto& run : runs) {
    bool found = run.empty();
    for (size_t at = 0; !found && at + run.size() <= out.size(); ++at) {
      found = std::equal(run.begin(), run.end(), out.begin() + at);
    }
    if (!found) {
      *missing = "";
      for (const auto& words : run) {
        for (const std::string& w : words) *missing += w + " ";
        *missing += "/ ";
      }
      return false;
    }
  }
  return true;
}

class SeedCommandsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(dir_.ok());
    // `multislice` and the seed's `command-to-run` on the PATH of the
    // commands and, through the controller and its agents, of the workers.
    const std::string bin = dir_.path() + "/bin";
    std::filesystem::create_directories(bin);
    std::filesystem::create_symlink(MULTISLICE_BINARY, bin + "/multislice");
    std::ofstream(bin + "/command-to-run")
        << "#!/bin/bash\necho \"command-to-run on slice $MEGASCALE_SLICE_ID "
           "worker $TPU_WORKER_ID\"\n";
    ::chmod((bin + "/command-to-run").c_str(), 0755);
    ::setenv("PATH", (bin + ":" + std::getenv("PATH")).c_str(), 1);
    ::unsetenv("CLOUDSDK_CORE_PROJECT");
    ::unsetenv("CLOUDSDK_COMPUTE_ZONE");
    std::ofstream(stdin_path()) << "command-to-run\n";
    ASSERT_TRUE(cluster_.Start(2, "cpu-1", {"--zone", "us-central1-a"}).ok())
        << cluster_.log();
    ::setenv("MULTISLICE_CONTROLLER", cluster_.url().c_str(), 1);
    ::setenv("MULTISLICE_TOKEN_FILE", cluster_.token_file().c_str(), 1);
  }

  std::string stdin_path() const { return dir_.path() + "/stdin"; }

  // Runs `script` in bash after the exports so far; exit code and output.
  std::pair<int, std::string> Bash(const std::string& script) {
    const std::string log = dir_.path() + "/run-" + std::to_string(++runs_);
    CliProcess bash(
        {"/bin/bash", "-c",
         "set -e\n" + exports_ + "{\n" + script + "\n} < " + stdin_path()},
        log, dir_.path());
    const int code = bash.Wait(std::chrono::seconds(60));
    return {code, bash.Output()};
  }

  // The seed's `> ` lines with the variables of the exports so far.
  std::vector<std::string> Expanded(const std::vector<std::string>& lines) {
    std::string heredoc = "cat <<SEED_EOF\n";
    for (const std::string& l : lines) heredoc += l + "\n";
    auto [code, out] = Bash(heredoc + "SEED_EOF");
    EXPECT_EQ(code, 0) << out;
    std::vector<std::string> expanded;
    std::istringstream in(out);
    for (std::string l; std::getline(in, l);) expanded.push_back(l);
    return expanded;
  }

  // What a user does between the seed's tutorials: delete what is left.
  void DeleteEveryQueuedResource() {
    auto [code, out] = Bash(
        "for q in $(multislice queued-resources list --zone=\"$ZONE\" "
        "--format='value(name.basename())'); do\n"
        "  multislice queued-resources delete \"$q\" --zone=\"$ZONE\" "
        "--force\ndone");
    ASSERT_EQ(code, 0) << out;
  }

  void WaitUntilGone() {
    auto [code, out] = Bash(
        "for i in $(seq 600); do\n"
        "  multislice queued-resources describe \"$QR_ID\" --zone=\"$ZONE\" "
        ">/dev/null 2>&1 || exit 0\n  sleep 0.1\ndone\nexit 1");
    ASSERT_EQ(code, 0) << "the queued resource was not deleted: " << out;
  }

  TempDir dir_{"seed-commands-test-"};
  LocalController cluster_{MULTISLICE_BINARY, dir_.path()};
  std::string exports_;
  int runs_ = 0;
};

TEST_F(SeedCommandsTest, EveryGcloudLineOfTheSeedRuns) {
  const std::vector<SeedLine> lines = ReadSeedLines(SEED_LINES_FILE);
  int commands = 0;
  for (const SeedLine& line : lines) {
    const std::string command = Resolved(line.command);
    if (line.new_tutorial) DeleteEveryQueuedResource();
    if (command.rfind("export ", 0) == 0) {
      exports_ += command + "\n";
      continue;
    }
    SCOPED_TRACE(command);
    auto [code, out] = Bash(command);
    EXPECT_EQ(code, 0) << out << cluster_.log();
    std::string missing;
    EXPECT_TRUE(Shows(out, Expanded(line.expected), &missing))
        << "missing: " << missing << "\noutput:\n"
        << out;
    if (command.find("--async") != std::string::npos &&
        command.find(" delete ") != std::string::npos) {
      WaitUntilGone();
    }
    if (command.find("multislice") != std::string::npos) ++commands;
  }
  // Every gcloud line: 13 of the seed's, 8 beyond it.
  EXPECT_EQ(commands, 21);
}

TEST(SeedLinesTest, AreTheSeedsOwn) {
  const std::string seed = ReadWholeFile(SEED_DOCUMENT);
  if (seed.empty()) GTEST_SKIP() << SEED_DOCUMENT << " is not here";
  int checked = 0;
  for (const SeedLine& line : ReadSeedLines(SEED_LINES_FILE)) {
    if (!line.from_seed) continue;
    std::string gcloud = line.command;
    const size_t at = gcloud.find("multislice");
    if (at == std::string::npos) continue;  // our values, not gcloud lines
    gcloud.replace(at, 10, "gcloud compute tpus");
    EXPECT_NE(seed.find("$ " + gcloud), std::string::npos)
        << "not in the seed: " << gcloud;
    ++checked;
  }
  EXPECT_EQ(checked, 13);
}

}  // namespace
}  // namespace multislice::control
