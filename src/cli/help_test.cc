// `multislice --help` and every command's --help: grouped commands with one
// short line each, examples, the `multislice help COMMAND` pointer, and no
// line wider than kHelpWidth, for every command in the command table.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include "cli/cli_test_util.h"
#include "cli/command.h"
#include "cli/commands.h"
#include "common/temp_dir.h"

namespace multislice::cli {
namespace {

std::vector<std::string> Lines(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

class HelpTest : public ::testing::Test {
 protected:
  HelpTest() {
    ConfigureRootApp(root_);
    AddAllCommands(root_, table_);
  }

  // Every command and subcommand, depth first, with its full name.
  void Walk(const CLI::App* app, const std::string& name,
            std::vector<std::pair<std::string, const CLI::App*>>* out) {
    for (const CLI::App* sub : app->get_subcommands({})) {
      const std::string full = name + " " + sub->get_name();
      out->push_back({full, sub});
      Walk(sub, full, out);
    }
  }

  CLI::App root_{"", "multislice"};
  CommandTable table_;
};

TEST_F(HelpTest, NoLineOfAnyHelpIsWiderThanTheLimit) {
  std::vector<std::pair<std::string, const CLI::App*>> commands = {
      {"multislice", &root_}};
  Walk(&root_, "multislice", &commands);
  ASSERT_GT(commands.size(), 25u);  // every command and its subcommands
  for (const auto& [name, app] : commands) {
    const std::string help = app->help(name);
    if (app != &root_) {
      // The root's examples are not repeated under every command.
      EXPECT_EQ(help.find("multislice help COMMAND"), std::string::npos)
          << name << " --help:\n"
          << help;
    }
    for (const std::string& line : Lines(help)) {
      EXPECT_LE(line.size(), kHelpWidth) << name << " --help:\n" << line;
    }
  }
  // --help-all too.
  for (const std::string& line :
       Lines(root_.help("multislice", CLI::AppFormatMode::All))) {
    EXPECT_LE(line.size(), kHelpWidth + 4) << line;
  }
}

TEST_F(HelpTest, RootListsCommandsInGroupsWithOneLineEach) {
  const std::string help = root_.help("multislice");
  std::vector<std::string> lines = Lines(help);
  size_t last = 0;
  for (const char* group :
       {kTrainGroup, kPlanGroup, kClusterGroup, kBenchmarkGroup}) {
    const size_t at = help.find(std::string("\n") + group + ":\n");
    ASSERT_NE(at, std::string::npos) << group << "\n" << help;
    EXPECT_GT(at, last) << "groups out of order: " << group;
    last = at;
  }
  EXPECT_EQ(help.find(kOtherGroup), std::string::npos)
      << "a command was added without RegisterCommand:\n"
      << help;
  // Each command: one line, its name then its summary.
  for (const CLI::App* sub : root_.get_subcommands({})) {
    int found = 0;
    for (size_t i = 0; i < lines.size(); ++i) {
      if (lines[i].rfind("  " + sub->get_name() + " ", 0) != 0) continue;
      ++found;
      EXPECT_GT(lines[i].size(), sub->get_name().size() + 10) << lines[i];
      // The next line is another command, a blank line or a group.
      ASSERT_LT(i + 1, lines.size());
      EXPECT_TRUE(lines[i + 1].empty() || lines[i + 1].rfind("  ", 0) != 0 ||
                  lines[i + 1][2] != ' ')
          << "summary of " << sub->get_name() << " wraps: " << lines[i + 1];
    }
    EXPECT_EQ(found, 1) << sub->get_name();
  }
}

TEST_F(HelpTest, RootHasExamplesAndThePointerToCommandHelp) {
  const std::string help = root_.help("multislice");
  int examples = 0;
  for (const std::string& line : Lines(help)) {
    examples += line.rfind("  multislice ", 0) == 0;
  }
  EXPECT_GE(examples, 5) << help;
  EXPECT_NE(help.find("multislice help COMMAND"), std::string::npos) << help;
}

// What bash makes of `printf '%s\n' WORDS`: one word per line.
std::string BashWords(const std::string& words) {
  const std::string path = ::testing::TempDir() + "/help_words.sh";
  FILE* f = std::fopen(path.c_str(), "w");
  std::fprintf(f, "printf '%%s\\n' %s\n", words.c_str());
  std::fclose(f);
  FILE* p = ::popen(("bash " + path).c_str(), "r");
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  ::pclose(p);
  return out;
}

TEST(WrapHelpTextTest, ProseWrapsAtSpacesKeepingTheIndent) {
  const std::string line =
      "   " + std::string(60, 'a') + " " + std::string(30, 'b') + " ccc";
  EXPECT_EQ(WrapHelpText(line, 80), "   " + std::string(60, 'a') + "\n   " +
                                        std::string(30, 'b') + " ccc");
  EXPECT_EQ(WrapHelpText("short\n  kept", 80), "short\n  kept");
}

TEST(WrapHelpTextTest, ExamplesStillPasteIntoAShell) {
  const std::string words =
      "--accelerator_type cpu-1 --num_slices 2 --output_dir /shared/jobs "
      "--command 'multislice train configs/quickstart.yml "
      "base_output_directory=$MULTISLICE_OUTPUT_DIR "
      "run_name=$MULTISLICE_RUN_NAME' --keep \"a b c d e f g h i j k l m n o "
      "p q r s t u v w x y z a b c d e f g h i j k l m n o p q r s t\"";
  const std::string wrapped = WrapHelpText("  multislice job " + words, 60);
  for (const std::string& line : Lines(wrapped)) {
    EXPECT_LE(line.size(), 60u) << wrapped;
  }
  EXPECT_GE(Lines(wrapped).size(), 4u) << wrapped;
  ASSERT_EQ(wrapped.rfind("  multislice job ", 0), 0u);
  EXPECT_EQ(BashWords(wrapped.substr(17)), BashWords(words)) << wrapped;
}

// A mistyped flag or command is one line naming it and, when one is close,
// the flag or command meant (exit 2); nothing close: no guess.
TEST(MistypedTest, FlagsAndCommandsSayWhatWasMeant) {
  TempDir dir("mistyped-test-");
  struct Case {
    std::vector<std::string> args;
    std::string expected;
  };
  const Case cases[] = {
      {{"train", "configs/quickstart.yml", "--num_slice", "2"},
       "multislice train: unknown flag --num_slice; did you mean "
       "'--num_slices'? (see multislice train --help)\n"},
      {{"shardings", "--ici_fdsp_parallelism=2"},
       "multislice shardings: unknown flag --ici_fdsp_parallelism; did you "
       "mean '--ici_fsdp_parallelism'? (see multislice shardings --help)\n"},
      {{"shardings", "-dd", "2", "--zzzzzz"},
       "multislice shardings: unknown flag --zzzzzz (see multislice "
       "shardings --help)\n"},
      {{"trian"}, "multislice: unknown command 'trian'; did you mean 'train'?"},
      {{"queued-resources", "lst"},
       "multislice queued-resources: unknown command 'lst'; did you mean "
       "'list'? (expected one of create, list,"},
  };
  int i = 0;
  for (const Case& c : cases) {
    using namespace testing_util;
    Child child = Spawn(c.args, {}, dir.path(), "m" + std::to_string(i++));
    EXPECT_EQ(WaitExit(child, 30), 2) << c.expected;
    const std::string err = ReadFile(child.err);
    EXPECT_EQ(std::count(err.begin(), err.end(), '\n'), 1) << err;
    EXPECT_EQ(err.rfind(c.expected, 0), 0u) << err;
  }
}

// A port nothing listens on now (bound, then closed).
int FreePort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  socklen_t len = sizeof addr;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  ::close(fd);
  return ntohs(addr.sin_port);
}

// The README starts a controller in the background and goes on at once:
// `admin wait-ready` waits for it (its token file, its API), and gives up
// after --timeout_seconds with the reason when none comes.
TEST(WaitReadyTest, WaitsForAStartingControllerAndGivesUpOnNone) {
  using namespace testing_util;
  TempDir dir("wait-ready-test-");
  const std::string url = "http://127.0.0.1:" + std::to_string(FreePort());
  const std::string data = dir.path() + "/ctl";
  const std::vector<std::string> env = {
      "MULTISLICE_CONTROLLER=" + url,
      "MULTISLICE_TOKEN_FILE=" + data + "/token"};
  Child none = Spawn({"admin", "wait-ready", "--timeout_seconds", "1"}, env,
                     dir.path(), "none");
  EXPECT_EQ(WaitExit(none, 30), 1);
  EXPECT_NE(ReadFile(none.err).find("not ready within 1 s: --token-file"),
            std::string::npos)
      << ReadFile(none.err);
  Child controller = Spawn({"controller", "--port",
                            url.substr(url.rfind(':') + 1), "--data-dir", data},
                           {}, dir.path(), "controller");
  Child wait = Spawn({"admin", "wait-ready"}, env, dir.path(), "wait");
  EXPECT_EQ(WaitExit(wait, 60), 0) << ReadFile(wait.err);
  EXPECT_EQ(ReadFile(wait.out),
            "the controller is ready (0 hosts registered)\n");
  ::kill(-controller.pid, SIGTERM);
  EXPECT_GE(WaitExit(controller, 30), 0);
}

}  // namespace
}  // namespace multislice::cli
