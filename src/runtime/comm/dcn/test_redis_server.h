// Test support: a real redis-server on a free loopback port, without
// persistence, started by a test and stopped and reaped when it ends. The
// project's scripts install redis-server (Debian package redis-server).
#pragma once

#include <arpa/inet.h>
#include <hiredis/hiredis.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "runtime/comm/dcn/store.h"

extern char** environ;

namespace multislice::dcn::testing {

// A TCP port on 127.0.0.1 that was free a moment ago (0 if none).
inline int FreeLoopbackPort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return 0;
  }
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);
  return ntohs(addr.sin_port);
}

// A redis-server on a free loopback port, without persistence, stopped and
// reaped when the test ends.
class RedisServer {
 public:
  RedisServer() : port_(FreeLoopbackPort()) {
    const std::string port = std::to_string(port_);
    std::vector<std::string> args = {
        "redis-server", "--port",    port,           "--bind", "127.0.0.1",
        "--save",       "",          "--appendonly", "no",     "--loglevel",
        "warning",      "--logfile", "/dev/null"};
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    const int rc = posix_spawn(&pid_, "/usr/bin/redis-server", nullptr, nullptr,
                               argv.data(), environ);
    if (rc != 0) {
      pid_ = -1;
      return;
    }
    // Ready when it answers PING (5 s at most).
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (std::chrono::steady_clock::now() < deadline) {
      const timeval tv = {0, 200000};
      redisContext* c = redisConnectWithTimeout("127.0.0.1", port_, tv);
      if (c != nullptr && c->err == 0) {
        auto* reply = static_cast<redisReply*>(redisCommand(c, "PING"));
        const bool ok = reply != nullptr && reply->type == REDIS_REPLY_STATUS;
        if (reply != nullptr) freeReplyObject(reply);
        redisFree(c);
        if (ok) {
          ready_ = true;
          return;
        }
      } else if (c != nullptr) {
        redisFree(c);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }

  ~RedisServer() {
    if (pid_ <= 0) return;
    kill(pid_, SIGTERM);
    for (int i = 0; i < 100; ++i) {
      if (waitpid(pid_, nullptr, WNOHANG) == pid_) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }

  bool ready() const { return ready_; }
  StoreAddress address() const {
    StoreAddress a;
    a.kind = StoreAddress::Kind::kRedis;
    a.host = "127.0.0.1";
    a.port = port_;
    return a;
  }

 private:
  int port_;
  pid_t pid_ = -1;
  bool ready_ = false;
};

}  // namespace multislice::dcn::testing
