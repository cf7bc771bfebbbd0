// The gcloud-shaped client end to end: `multislice controller
// --local-hosts 2` (real agents) driven by `multislice queued-resources` and
// `multislice admin`, checking their exact output and exit codes.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "common/temp_dir.h"
#include "gtest/gtest.h"

namespace {

struct CommandRun {
  int code;
  std::string out;
};

// Runs `multislice ARGS` through the shell (ARGS are this test's literals);
// stderr is merged into out when merge_stderr.
CommandRun Multislice(const std::string& args, bool merge_stderr = false) {
  std::string cmd = std::string(MULTISLICE_BINARY) + " " + args +
                    (merge_stderr ? " 2>&1" : " 2>/dev/null");
  FILE* p = ::popen(cmd.c_str(), "r");
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  int status = ::pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

std::vector<std::string> Words(const std::string& line) {
  std::istringstream in(line);
  std::vector<std::string> out;
  std::string w;
  while (in >> w) out.push_back(w);
  return out;
}

std::vector<std::string> Lines(const std::string& text) {
  std::istringstream in(text);
  std::vector<std::string> out;
  std::string l;
  while (std::getline(in, l)) out.push_back(l);
  return out;
}

TEST(QueuedResourcesCliTest, CreateListDescribeResetDelete) {
  multislice::TempDir dir;
  ASSERT_TRUE(dir.ok());
  const std::string data = dir.path() + "/ctl";
  const std::string out_path = dir.path() + "/ctl.out";
  pid_t controller = ::fork();
  if (controller == 0) {
    FILE* out = std::freopen(out_path.c_str(), "w", stdout);
    (void)out;
    ::execl(MULTISLICE_BINARY, MULTISLICE_BINARY, "controller", "--port", "0",
            "--data-dir", data.c_str(), "--local-hosts", "2",
            static_cast<char*>(nullptr));
    ::_exit(127);
  }
  struct Reaper {
    pid_t pid;
    ~Reaper() {
      ::kill(pid, SIGTERM);
      for (int i = 0; i < 300; ++i) {
        if (::waitpid(pid, nullptr, WNOHANG) == pid) return;
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
    }
  } reaper{controller};
  std::string url;
  for (int i = 0; i < 200 && url.empty(); ++i) {
    std::ifstream in(out_path);
    std::string w;
    while (in >> w) {
      if (w.rfind("http://", 0) == 0) url = w;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_FALSE(url.empty());
  // Without a controller: one line, exit code 2.
  ::unsetenv("MULTISLICE_CONTROLLER");
  CommandRun none = Multislice("queued-resources list", true);
  EXPECT_EQ(none.code, 2);
  EXPECT_EQ(none.out,
            "multislice queued-resources list: --controller: not given and "
            "MULTISLICE_CONTROLLER is not set\n");
  ::setenv("MULTISLICE_CONTROLLER", url.c_str(), 1);
  ::setenv("MULTISLICE_TOKEN_FILE", (data + "/token").c_str(), 1);
  // Both agents registered.
  for (int i = 0; i < 200; ++i) {
    if (Lines(Multislice("admin hosts").out).size() == 3) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_EQ(Lines(Multislice("admin hosts").out).size(), 3u);

  CommandRun create = Multislice(
      "queued-resources create qr1 --accelerator-type cpu-2 --node-count 2 "
      "--metadata 'startup-script=sleep 100'");
  EXPECT_EQ(create.code, 0);
  EXPECT_EQ(create.out, "Created queued resource [qr1]: ACTIVE\n");

  CommandRun list = Multislice("queued-resources list");
  ASSERT_EQ(list.code, 0);
  std::vector<std::string> lines = Lines(list.out);
  ASSERT_EQ(lines.size(), 2u) << list.out;
  EXPECT_EQ(Words(lines[0]),
            (std::vector<std::string>{"NAME", "ZONE", "NODE_COUNT",
                                      "ACCELERATOR_TYPE", "STATE"}));
  EXPECT_EQ(Words(lines[1]), (std::vector<std::string>{"qr1", "local-a", "2",
                                                       "cpu-2", "ACTIVE"}));
  // Nothing listed: nothing on stdout, as gcloud prints it.
  CommandRun none_failed =
      Multislice("queued-resources list --filter state=FAILED", true);
  EXPECT_EQ(none_failed.out, "Listed 0 items.\n");
  EXPECT_EQ(Lines(Multislice("queued-resources list --filter 'name:qr "
                             "state=ACTIVE'")
                      .out)
                .size(),
            2u);
  // gcloud's bare-word filter (the seed's --filter=${QR_ID}) and --format.
  EXPECT_EQ(Lines(Multislice("queued-resources list --filter=qr1 "
                             "--zone=local-a --project=local")
                      .out)
                .size(),
            2u);
  EXPECT_EQ(Multislice("queued-resources list --filter=nosuchqr").out, "");
  EXPECT_EQ(Multislice("queued-resources list --format "
                       "'value(name.basename(),state.state,nodes.nodeId)'")
                .out,
            "qr1\tACTIVE\tqr1-0;qr1-1\n");
  EXPECT_EQ(Multislice("queued-resources list --format 'csv(name.basename():"
                       "label=id,zone)'")
                .out,
            "id,zone\nqr1,local-a\n");
  CommandRun json_list = Multislice("queued-resources list --format json");
  nlohmann::json parsed = nlohmann::json::parse(json_list.out, nullptr, false);
  ASSERT_TRUE(parsed.is_array()) << json_list.out;
  EXPECT_EQ(parsed.size(), 1u);
  CommandRun bad_filter =
      Multislice("queued-resources list --filter colour=red", true);
  EXPECT_EQ(bad_filter.code, 2);

  // describe prints YAML, as gcloud does; --format json the API's object.
  CommandRun describe = Multislice("queued-resources describe qr1");
  ASSERT_EQ(describe.code, 0);
  EXPECT_NE(describe.out.find("\nstate:\n  state: ACTIVE\n"), std::string::npos)
      << describe.out;
  EXPECT_NE(describe.out.find("\nnodes:\n- health: HEALTHY\n"),
            std::string::npos)
      << describe.out;
  CommandRun describe_json =
      Multislice("queued-resources describe qr1 --format=json");
  EXPECT_EQ(nlohmann::json::parse(describe_json.out)["state"]["state"],
            "ACTIVE");
  EXPECT_EQ(Multislice("queued-resources describe qr1 --format "
                       "'value(state.state)'")
                .out,
            "ACTIVE\n");
  CommandRun bad_format =
      Multislice("queued-resources describe qr1 --format xml", true);
  EXPECT_EQ(bad_format.code, 2);
  EXPECT_EQ(Lines(bad_format.out).size(), 1u) << bad_format.out;
  EXPECT_EQ(bad_format.out.rfind("multislice queued-resources describe: "
                                 "--format: 'xml' is not a format",
                                 0),
            0u)
      << bad_format.out;

  // tpu-vm: the nodes qr1-0 and qr1-1, as Cloud TPU names them.
  CommandRun nodes = Multislice("tpu-vm list --zone=local-a");
  EXPECT_EQ(nodes.code, 0);
  ASSERT_EQ(Lines(nodes.out).size(), 3u) << nodes.out;
  EXPECT_EQ(Words(Lines(nodes.out)[2]),
            (std::vector<std::string>{"qr1-1", "local-a", "cpu-2", "READY",
                                      "HEALTHY", "qr1"}));
  EXPECT_EQ(Multislice("tpu-vm describe qr1-1 --format "
                       "'value(state,queuedResource.basename())'")
                .out,
            "READY\tqr1\n");
  EXPECT_EQ(Multislice("tpu-vm describe qr1-9", true).code, 1);
  CommandRun bad_node = Multislice("tpu-vm describe Node_1", true);
  EXPECT_EQ(bad_node.code, 2);
  EXPECT_EQ(bad_node.out,
            "multislice tpu-vm describe: NODE: 'Node_1' is not a valid name: "
            "use 1 to 63 lower-case letters, digits and hyphens, starting "
            "with a letter and not ending with a hyphen\n");
  CommandRun no_command = Multislice("tpu-vm ssh qr1-1 </dev/null", true);
  EXPECT_EQ(no_command.code, 2);
  EXPECT_EQ(no_command.out,
            "multislice tpu-vm ssh: --command: not given and standard input "
            "holds no command\n");
  std::ofstream(dir.path() + "/commands") << "echo $MEGASCALE_SLICE_ID\n";
  CommandRun piped =
      Multislice("tpu-vm ssh qr1-1 < " + dir.path() + "/commands");
  EXPECT_EQ(piped.out, "[node 1 worker 0] 1\n");
  EXPECT_EQ(Multislice("tpu-vm ssh qr1-1 --worker=3 --command=true", true).code,
            2);
  // scp: uploads only (the agent has no download), relative to the
  // worker's directory.
  std::filesystem::create_directories(dir.path() + "/code/sub");
  std::ofstream(dir.path() + "/code/a") << "first\n";
  std::ofstream(dir.path() + "/code/sub/b") << "second\n";
  CommandRun scp = Multislice("tpu-vm scp --recurse " + dir.path() +
                              "/code qr1-0:~/copy --worker=all");
  EXPECT_EQ(scp.code, 0);
  EXPECT_EQ(scp.out, "Copied 2 files (13 bytes) to qr1-0 worker 0\n");
  EXPECT_EQ(
      Multislice("tpu-vm ssh qr1-0 --command='cat copy/a copy/sub/b'").out,
      "[node 0 worker 0] first\n[node 0 worker 0] second\n");
  CommandRun no_recurse =
      Multislice("tpu-vm scp " + dir.path() + "/code qr1-0:x", true);
  EXPECT_EQ(no_recurse.code, 2);
  EXPECT_NE(no_recurse.out.find("is a directory: give --recurse"),
            std::string::npos)
      << no_recurse.out;
  CommandRun download = Multislice("tpu-vm scp qr1-0:copy/a here", true);
  EXPECT_EQ(download.code, 2);
  EXPECT_NE(download.out.find("copying from a TPU VM is not supported"),
            std::string::npos)
      << download.out;
  CommandRun absolute =
      Multislice("tpu-vm scp " + dir.path() + "/code/a qr1-0:/etc/x", true);
  EXPECT_EQ(absolute.code, 2);
  EXPECT_NE(absolute.out.find("'/etc/x' is absolute"), std::string::npos)
      << absolute.out;

  CommandRun reset = Multislice("queued-resources reset qr1");
  EXPECT_EQ(reset.code, 0);
  EXPECT_EQ(reset.out, "Reset queued resource [qr1]: ACTIVE (attempt 2)\n");

  CommandRun bad = Multislice(
      "queued-resources create bad --accelerator-type cpu-2 --node-count 300",
      true);
  EXPECT_EQ(bad.code, 2);
  EXPECT_EQ(bad.out,
            "multislice queued-resources create: --node-count: 300 is not "
            "from 2 to 256 (for one slice give --node-id, or neither flag)\n");
  CommandRun one = Multislice(
      "queued-resources create bad --accelerator-type cpu-2 --node-count=1",
      true);
  EXPECT_EQ(one.code, 2);
  EXPECT_NE(one.out.find("--node-count: 1 "), std::string::npos) << one.out;
  CommandRun word = Multislice(
      "queued-resources create bad --accelerator-type cpu-2 --node-count abc",
      true);
  EXPECT_EQ(word.code, 2);
  EXPECT_EQ(word.out.rfind("multislice queued-resources create: "
                           "--node-count: 'abc' is not an integer",
                           0),
            0u)
      << word.out;
  // Cloud TPU's name rule, checked before any call: one sentence, exit 2.
  const std::string rule =
      " is not a valid name: use 1 to 63 lower-case letters, digits and "
      "hyphens, starting with a letter and not ending with a hyphen\n";
  for (const std::string name : {"Bad_Name", "9lives", "ends-"}) {
    CommandRun named = Multislice("queued-resources create " + name +
                                      " --accelerator-type cpu-2 "
                                      "--node-count 2",
                                  true);
    EXPECT_EQ(named.code, 2);
    EXPECT_EQ(named.out,
              "multislice queued-resources create: QR: '" + name + "'" + rule);
  }
  CommandRun prefix = Multislice(
      "queued-resources create ok --accelerator-type cpu-2 --node-count 2 "
      "--node-prefix=My_Tpu",
      true);
  EXPECT_EQ(prefix.code, 2);
  EXPECT_EQ(
      prefix.out,
      "multislice queued-resources create: --node-prefix: 'My_Tpu'" + rule);
  // API errors name the CLI's flags, not the request's fields.
  CommandRun api_bad = Multislice(
      "queued-resources create api-bad --accelerator-type cpu-2 --node-id n "
      "--valid-until-time 2020-13-01",
      true);
  EXPECT_EQ(api_bad.code, 2);
  EXPECT_EQ(api_bad.out.rfind("multislice queued-resources create: "
                              "--valid-until-time: '2020-13-01' is not an "
                              "RFC 3339 time",
                              0),
            0u)
      << api_bad.out;

  CommandRun refused = Multislice("queued-resources delete qr1 -q", true);
  EXPECT_EQ(refused.code, 2);
  EXPECT_NE(refused.out.find("is ACTIVE: without --force only ACCEPTED"),
            std::string::npos)
      << refused.out;
  EXPECT_NE(refused.out.find("(pass --force to delete its nodes first)"),
            std::string::npos)
      << refused.out;
  EXPECT_EQ(refused.out.find("force=true"), std::string::npos) << refused.out;
  CommandRun missing = Multislice("admin fail-host host-99", true);
  EXPECT_EQ(missing.code, 1);

  // An expired request: FAILED (exit 1), listed, then cleaned up.
  CommandRun expired = Multislice(
      "queued-resources create late --accelerator-type v4-8 --node-id late "
      "--valid-until-duration 0s");
  EXPECT_EQ(expired.code, 1);
  EXPECT_EQ(expired.out, "Created queued resource [late]: FAILED\n");
  EXPECT_EQ(Lines(Multislice("queued-resources list --filter state=FAILED").out)
                .size(),
            2u);
  CommandRun cleanup = Multislice("queued-resources cleanup");
  EXPECT_EQ(cleanup.code, 0);
  EXPECT_EQ(cleanup.out,
            "Deleted 1 FAILED or SUSPENDED queued resource (0 chips of quota "
            "released)\n");

  CommandRun del =
      Multislice("queued-resources delete qr1 --force --quiet --zone=local-a");
  EXPECT_EQ(del.code, 0);
  EXPECT_EQ(del.out, "Deleted queued resource [qr1]\n");
  EXPECT_EQ(Multislice("queued-resources list").out, "");
}

}  // namespace
