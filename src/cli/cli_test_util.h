// Test support for the commands' end-to-end tests: run the real
// `multislice` binary (beside the test binary) as a child process in its own
// process group, with its output in files, and wait for it with a bound.
#pragma once

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "runtime/launcher.h"

namespace multislice::testing_util {

using Clock = std::chrono::steady_clock;

inline std::string Binary() {
  return (std::filesystem::path(runtime::SelfExecutable()).parent_path() /
          "multislice")
      .string();
}

inline std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// A child `multislice` process in its own process group, its stdout and
// stderr in files.
struct Child {
  pid_t pid = -1;
  std::string out, err;
};

inline Child Spawn(const std::vector<std::string>& args,
                   const std::vector<std::string>& env, const std::string& dir,
                   const std::string& name) {
  Child c;
  c.out = dir + "/" + name + ".out";
  c.err = dir + "/" + name + ".err";
  c.pid = ::fork();
  if (c.pid == 0) {
    ::setpgid(0, 0);
    FILE* out = std::freopen(c.out.c_str(), "w", stdout);
    FILE* err = std::freopen(c.err.c_str(), "w", stderr);
    if (!out || !err) ::_exit(127);
    for (const std::string& e : env) ::putenv(const_cast<char*>(e.c_str()));
    std::vector<char*> argv;
    std::string binary = Binary();
    argv.push_back(binary.data());
    for (const std::string& a : args)
      argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    ::execv(binary.c_str(), argv.data());
    ::_exit(127);
  }
  return c;
}

// Waits up to `seconds`; on timeout kills the group and returns -1.
inline int WaitExit(const Child& c, double seconds) {
  const auto deadline = Clock::now() + std::chrono::duration<double>(seconds);
  for (;;) {
    int status = 0;
    const pid_t r = ::waitpid(c.pid, &status, WNOHANG);
    if (r == c.pid) {
      return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    }
    if (Clock::now() > deadline) {
      ::kill(-c.pid, SIGKILL);
      ::waitpid(c.pid, &status, 0);
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

inline bool WaitForFile(const std::string& path, double seconds) {
  const auto deadline = Clock::now() + std::chrono::duration<double>(seconds);
  while (Clock::now() < deadline) {
    if (std::filesystem::exists(path)) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

// The last line of `out` that starts with '{' (a command's --json object,
// which may contain nested objects, after other lines).
inline std::string LastJsonLine(const std::string& out) {
  size_t end = out.size();
  while (end > 0) {
    const size_t start = out.rfind('\n', end - 1);
    const size_t begin = start == std::string::npos ? 0 : start + 1;
    if (begin < end && out[begin] == '{') return out.substr(begin, end - begin);
    if (start == std::string::npos) break;
    end = start;
  }
  return "{}";
}

// The worker processes the launcher `c` started (its children).
inline std::vector<pid_t> Workers(const Child& c) {
  std::vector<pid_t> pids;
  std::ifstream in("/proc/" + std::to_string(c.pid) + "/task/" +
                   std::to_string(c.pid) + "/children");
  pid_t p;
  while (in >> p) pids.push_back(p);
  return pids;
}

}  // namespace multislice::testing_util
