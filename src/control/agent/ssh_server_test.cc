// A real sshd (Debian's openssh-server) under SshServer, reached with the
// real OpenSSH client on a loopback address of its own. Needs root (sshd
// switches users) and the packages; skipped with one line otherwise.
#include "control/agent/ssh_server.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <thread>

#include "common/temp_dir.h"

namespace multislice::control {
namespace {

namespace fs = std::filesystem;
using std::chrono::milliseconds;

struct Output {
  int code = -1;
  std::string text;
};

// Runs `command` in bash, stdout and stderr together.
Output Shell(const std::string& command) {
  Output out;
  FILE* pipe = ::popen(("(" + command + ") 2>&1").c_str(), "r");
  if (pipe == nullptr) return out;
  char buffer[4096];
  size_t n;
  while ((n = std::fread(buffer, 1, sizeof buffer, pipe)) > 0) {
    out.text.append(buffer, n);
  }
  const int status = ::pclose(pipe);
  out.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return out;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

class SshServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (::geteuid() != 0) GTEST_SKIP() << "sshd needs root to switch users";
    if (!fs::exists("/usr/sbin/sshd") || !fs::exists("/usr/bin/ssh")) {
      GTEST_SKIP() << "openssh-server or openssh-client is not installed "
                      "(scripts/install_deps.sh installs them)";
    }
    std::random_device rd;
    address_ = "127.77." + std::to_string(rd() % 250 + 1) + "." +
               std::to_string(rd() % 250 + 1);
    port_ = 20000 + static_cast<int>(rd() % 20000);
    launcher_ = NewProcessLauncher();
    for (const char* name : {"alice", "bob"}) {
      ASSERT_EQ(Shell("ssh-keygen -q -t ed25519 -N '' -C '' -f " + tmp_.path() +
                      "/" + name)
                    .code,
                0);
    }
    worker_dir_ = tmp_.path() + "/worker";
    fs::create_directories(worker_dir_);
  }

  Result<std::unique_ptr<SshServer>> StartServer() {
    SshServerOptions options;
    options.address = address_;
    options.port = port_;
    options.dir = tmp_.path() + "/ssh";
    options.launcher = launcher_.get();
    return SshServer::Start(options);
  }

  // "root:ssh-ed25519 BASE64 root" for the client key `name`.
  std::string KeyLine(const std::string& name) {
    std::string pub = ReadFile(tmp_.path() + "/" + name + ".pub");
    while (!pub.empty() && (pub.back() == '\n' || pub.back() == ' ')) {
      pub.pop_back();
    }
    return "root:" + pub + " root";
  }

  std::string Ssh(const std::string& key) {
    return "ssh -i " + tmp_.path() + "/" + key + " -p " +
           std::to_string(port_) +
           " -o BatchMode=yes -o StrictHostKeyChecking=no"
           " -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR"
           " -o ConnectTimeout=5 root@" +
           address_ + " ";
  }

  std::string Scp(const std::string& key) {
    return "scp -i " + tmp_.path() + "/" + key + " -P " +
           std::to_string(port_) +
           " -o BatchMode=yes -o StrictHostKeyChecking=no"
           " -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR ";
  }

  TempDir tmp_;
  std::string address_;
  int port_ = 0;
  std::string worker_dir_;
  std::unique_ptr<ProcessLauncher> launcher_;
};

TEST_F(SshServerTest, AKeyOpensItsUserInTheWorkersDirectoryAndEnvironment) {
  auto server = StartServer();
  ASSERT_TRUE(server.ok()) << server.status().message();
  // No owner yet: no key opens the host.
  EXPECT_EQ(Shell(Ssh("alice") + "true").code, 255);

  const auto notes = (*server)->SetKeys(
      "qr-a",
      "\n" + KeyLine("alice") + "\nnobody-here:" + KeyLine("bob").substr(5));
  ASSERT_EQ(notes.size(), 1u);
  EXPECT_NE(notes[0].find("nobody-here skipped: no such user"),
            std::string::npos);
  ASSERT_TRUE((*server)
                  ->SetSession(worker_dir_,
                               {"MEGASCALE_SLICE_ID=1", "QUOTED=it's a 'test'"},
                               -1)
                  .ok());
  const Output out = Shell(Ssh("alice") +
                           "'pwd; echo \"$HOME\"; echo \"$MEGASCALE_SLICE_ID\";"
                           " echo \"$QUOTED\"; id -un'");
  ASSERT_EQ(out.code, 0) << out.text;
  EXPECT_EQ(out.text,
            worker_dir_ + "\n" + worker_dir_ + "\n1\nit's a 'test'\nroot\n");
  // A key the metadata does not hold is refused.
  EXPECT_EQ(Shell(Ssh("bob") + "true").code, 255);
  // The remote command's exit status comes back.
  EXPECT_EQ(Shell(Ssh("alice") + "'exit 7'").code, 7);
}

TEST_F(SshServerTest, ScpCopiesBothWaysRelativeToTheWorkersDirectory) {
  auto server = StartServer();
  ASSERT_TRUE(server.ok()) << server.status().message();
  (*server)->SetKeys("qr-a", KeyLine("alice"));
  ASSERT_TRUE((*server)->SetSession(worker_dir_, {}, -1).ok());
  { std::ofstream(tmp_.path() + "/payload.txt") << "twelve bytes"; }
  fs::create_directories(worker_dir_ + "/copied");
  // scp of OpenSSH 9 speaks SFTP; -O is the old scp protocol.
  for (const char* mode : {"", "-O "}) {
    fs::remove(worker_dir_ + "/copied/payload.txt");
    Output out = Shell(Scp("alice") + std::string(mode) + tmp_.path() +
                       "/payload.txt root@" + address_ + ":~/copied/");
    ASSERT_EQ(out.code, 0) << mode << out.text;
    EXPECT_EQ(ReadFile(worker_dir_ + "/copied/payload.txt"), "twelve bytes");
    out = Shell(Scp("alice") + std::string(mode) + "root@" + address_ +
                ":copied/payload.txt " + tmp_.path() + "/back.txt");
    ASSERT_EQ(out.code, 0) << mode << out.text;
    EXPECT_EQ(ReadFile(tmp_.path() + "/back.txt"), "twelve bytes");
  }
}

TEST_F(SshServerTest, ANewOwnerEndsTheSessionsAndKeysOfTheLast) {
  auto server = StartServer();
  ASSERT_TRUE(server.ok()) << server.status().message();
  (*server)->SetKeys("qr-a", KeyLine("alice"));
  // A session that leaves a process behind in a session of its own.
  const std::string marker = tmp_.path() + "/left-behind";
  Output out = Shell(Ssh("alice") + "'setsid sleep 300 < /dev/null > " +
                     marker + " 2>&1 & echo $!'");
  ASSERT_EQ(out.code, 0) << out.text;
  const pid_t left = std::stoi(out.text);
  ASSERT_EQ(::kill(left, 0), 0);

  (*server)->SetKeys("qr-b", KeyLine("bob"));
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::seconds(5);
  bool gone = false;
  while (!gone && std::chrono::steady_clock::now() < deadline) {
    const std::string stat =
        ReadFile("/proc/" + std::to_string(left) + "/stat");
    gone = stat.empty() || stat.find(") Z") != std::string::npos;
    std::this_thread::sleep_for(milliseconds(20));
  }
  EXPECT_TRUE(gone) << "pid " << left << " outlived its owner's keys";
  EXPECT_EQ(Shell(Ssh("alice") + "true").code, 255);
  EXPECT_EQ(Shell(Ssh("bob") + "true").code, 0);
}

TEST_F(SshServerTest, HostKeysAreWhatSshSeesAndSurviveARestart) {
  std::string ed25519;
  {
    auto server = StartServer();
    ASSERT_TRUE(server.ok()) << server.status().message();
    ed25519 = (*server)->host_keys().at("ssh-ed25519");
    const Output scan = Shell("ssh-keyscan -t ed25519 -p " +
                              std::to_string(port_) + " " + address_);
    ASSERT_EQ(scan.code, 0) << scan.text;
    EXPECT_NE(scan.text.find("ssh-ed25519 " + ed25519), std::string::npos)
        << scan.text;
    // A second server on the same address and port: sshd's own words.
    SshServerOptions options;
    options.address = address_;
    options.port = port_;
    options.dir = tmp_.path() + "/ssh2";
    options.launcher = launcher_.get();
    auto second = SshServer::Start(options);
    ASSERT_FALSE(second.ok());
    EXPECT_NE(second.status().message().find("did not start"),
              std::string::npos)
        << second.status().message();
  }
  auto again = StartServer();
  ASSERT_TRUE(again.ok()) << again.status().message();
  EXPECT_EQ((*again)->host_keys().at("ssh-ed25519"), ed25519);
}

TEST(SshServerOptionsTest, BadOptionsAreOneSentence) {
  auto launcher = NewProcessLauncher();
  SshServerOptions options;
  options.launcher = launcher.get();
  options.address = "localhost";
  options.dir = "/tmp/x";
  EXPECT_EQ(SshServer::Start(options).status().message(),
            "ssh address: 'localhost' is not an IPv4 address");
  options.address = "127.0.0.1";
  options.dir = "/tmp/it's";
  EXPECT_NE(SshServer::Start(options).status().message().find(
                "ssh directory: '/tmp/it's' must be absolute"),
            std::string::npos);
  options.dir = "/tmp/x";
  options.port = 70000;
  EXPECT_EQ(SshServer::Start(options).status().message(),
            "ssh port: 70000 is not a port from 1 to 65535");
}

}  // namespace
}  // namespace multislice::control
