#include "control/coordinator_stores.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <set>

namespace multislice::control {

Result<std::string> CoordinatorStores::For(
    const QueuedResourceRecord& r, const std::map<std::string, Host>& hosts) {
  // One machine: every agent registered the same loopback address. Agents
  // at different addresses (other machines, or other loopback addresses
  // standing in for them) share a redis-server instead.
  std::set<std::string> ips;
  for (const NodeRecord& n : r.nodes) {
    for (const std::string& h : n.hosts) {
      auto it = hosts.find(h);
      if (it != hosts.end()) ips.insert(it->second.ip());
    }
  }
  const bool local =
      ips.size() <= 1 && (ips.empty() || IsLoopback(*ips.begin()));
  if (local) {
    const std::string dir = options_.data_dir + "/stores/" + r.id;
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    return "file://" + dir;
  }
  return EnsureRedis();
}

void CoordinatorStores::Stop() {
  if (redis_pid_ > 0) {
    ::kill(redis_pid_, SIGTERM);
    ::waitpid(redis_pid_, nullptr, 0);
    redis_pid_ = -1;
  }
}

namespace {

// A free port: bind port 0, read it, close (a small race, accepted).
Result<int> FreeLoopbackPort() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&addr), len) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    if (fd >= 0) ::close(fd);
    return Internal("cannot find a free port for redis-server");
  }
  ::close(fd);
  return static_cast<int>(ntohs(addr.sin_port));
}

}  // namespace

Result<std::string> CoordinatorStores::EnsureRedis() {
  if (redis_pid_ > 0) {
    return "redis://" + options_.advertise_address + ":" +
           std::to_string(redis_port_);
  }
  ASSIGN_OR_RETURN(const int port, FreeLoopbackPort());
  const std::string port_text = std::to_string(port);
  const std::string log = options_.data_dir + "/redis.log";
  pid_t pid = ::fork();
  if (pid < 0) return Internal("cannot fork redis-server");
  if (pid == 0) {
    // The controller blocks SIGTERM/SIGINT for its signal thread; a child
    // must not inherit that, or the SIGTERM that stops it would never come.
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);
    int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0600);
    if (fd >= 0) {
      ::dup2(fd, STDOUT_FILENO);
      ::dup2(fd, STDERR_FILENO);
    }
    const char* argv[] = {"redis-server",
                          "--port",
                          port_text.c_str(),
                          "--bind",
                          options_.advertise_address.c_str(),
                          "--save",
                          "",
                          "--appendonly",
                          "no",
                          "--protected-mode",
                          "no",
                          nullptr};
    ::execvp("redis-server", const_cast<char* const*>(argv));
    ::_exit(127);
  }
  redis_pid_ = pid;
  redis_port_ = port;
  std::fprintf(stderr,
               "controller: started redis-server on %s:%s as the coordinator "
               "store\n",
               options_.advertise_address.c_str(), port_text.c_str());
  return "redis://" + options_.advertise_address + ":" + port_text;
}

}  // namespace multislice::control
