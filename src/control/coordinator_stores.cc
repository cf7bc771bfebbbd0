#include "control/coordinator_stores.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <hiredis/hiredis.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <memory>
#include <set>
#include <thread>

#include "control/http.h"

namespace multislice::control {

namespace {

constexpr char kAdminUser[] = "ms-controller";

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

// Writes `text` to `path` with mode 0600 (replacing it).
Status WritePrivateFile(const std::string& path, const std::string& text) {
  ::unlink(path.c_str());
  const int fd =
      ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) return Internal("cannot create " + path + ": " + strerror(errno));
  const ssize_t n = ::write(fd, text.data(), text.size());
  const bool ok = n == static_cast<ssize_t>(text.size()) && ::fsync(fd) == 0;
  ::close(fd);
  if (!ok) return Internal("cannot write " + path + ": " + strerror(errno));
  return OkStatus();
}

using Reply = std::unique_ptr<redisReply, void (*)(void*)>;

}  // namespace

std::string RunIdentity(const QueuedResourceRecord& r) { return "qr-" + r.uid; }

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
  const std::string run = RunIdentity(r);
  const bool local =
      ips.size() <= 1 && (ips.empty() || IsLoopback(*ips.begin()));
  if (local) {
    const std::string dir = options_.data_dir + "/stores/" + run;
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    if (ec) return Internal("cannot create " + dir + ": " + ec.message());
    std::filesystem::permissions(dir,
                                 options_.file_store_group_access
                                     ? std::filesystem::perms::owner_all |
                                           std::filesystem::perms::group_all
                                     : std::filesystem::perms::owner_all,
                                 ec);
    if (options_.file_store_uid >= 0 &&
        ::chown(dir.c_str(), options_.file_store_uid,
                options_.file_store_gid) != 0) {
      return Internal("cannot give " + dir +
                      " to the worker user: " + strerror(errno));
    }
    return "file://" + dir;
  }
  ASSIGN_OR_RETURN(std::string server, EnsureRedis());
  auto& password = passwords_[run];
  if (password.empty()) {
    ASSIGN_OR_RETURN(password, RandomHex(32));
    // Its own keys only ("<run>/<attempt>/..." and its attempt record), and
    // only the commands a worker's rendezvous sends.
    Status s = RedisCommand({"ACL", "SETUSER", "ms-" + run, "reset", "on",
                             ">" + password, "~" + run + "/*",
                             "~multislice/attempt/" + run, "+get", "+set",
                             "+setnx", "+exists", "+eval", "+ping"});
    if (!s.ok()) {
      passwords_.erase(run);
      return s;
    }
  }
  return "redis://ms-" + run + ":" + password + "@" + server;
}

void CoordinatorStores::Release(const QueuedResourceRecord& r) {
  const std::string run = RunIdentity(r);
  std::error_code ec;
  std::filesystem::remove_all(options_.data_dir + "/stores/" + run, ec);
  if (redis_pid_ <= 0) return;
  RedisCommand({"ACL", "DELUSER", "ms-" + run}).ok();
  passwords_.erase(run);
  std::string cursor = "0";
  do {
    std::vector<std::string> keys;
    if (!RedisCommand({"SCAN", cursor, "MATCH", run + "/*", "COUNT", "1000"},
                      &keys)
             .ok() ||
        keys.empty()) {
      break;
    }
    cursor = keys[0];
    keys[0] = "DEL";
    if (keys.size() > 1) RedisCommand(keys).ok();
  } while (cursor != "0");
  RedisCommand({"DEL", "multislice/attempt/" + run}).ok();
}

void CoordinatorStores::RemoveFileStoresExcept(
    const std::set<std::string>& live) {
  std::error_code ec;
  for (const auto& entry :
       std::filesystem::directory_iterator(options_.data_dir + "/stores", ec)) {
    const std::string name = entry.path().filename().string();
    if (!live.count(name)) std::filesystem::remove_all(entry.path(), ec);
  }
}

Status CoordinatorStores::RedisCommand(const std::vector<std::string>& argv,
                                       std::vector<std::string>* replies) {
  const timeval timeout = {1, 0};
  std::unique_ptr<redisContext, void (*)(redisContext*)> c(
      redisConnectWithTimeout(options_.advertise_address.c_str(), redis_port_,
                              timeout),
      redisFree);
  if (!c || c->err != 0) {
    return Unavailable("cannot reach the coordinator redis-server: " +
                       std::string(c ? c->errstr : "out of memory"));
  }
  redisSetTimeout(c.get(), timeout);
  auto run = [&](const std::vector<std::string>& args) -> Result<Reply> {
    std::vector<const char*> ptrs;
    std::vector<size_t> lens;
    for (const std::string& a : args) {
      ptrs.push_back(a.data());
      lens.push_back(a.size());
    }
    Reply reply(
        static_cast<redisReply*>(redisCommandArgv(
            c.get(), static_cast<int>(args.size()), ptrs.data(), lens.data())),
        freeReplyObject);
    if (!reply) return Unavailable(std::string("redis: ") + c->errstr);
    if (reply->type == REDIS_REPLY_ERROR) {
      return Internal("redis refused " + args[0] + " " +
                      (args.size() > 1 ? args[1] : "") + ": " +
                      std::string(reply->str, reply->len));
    }
    return reply;
  };
  ASSIGN_OR_RETURN(Reply auth, run({"AUTH", kAdminUser, admin_password_}));
  ASSIGN_OR_RETURN(Reply reply, run(argv));
  if (replies != nullptr && reply->type == REDIS_REPLY_ARRAY &&
      reply->elements == 2) {  // SCAN: cursor, then the keys
    replies->push_back(
        std::string(reply->element[0]->str, reply->element[0]->len));
    const redisReply* keys = reply->element[1];
    for (size_t i = 0; i < keys->elements; ++i) {
      replies->push_back(
          std::string(keys->element[i]->str, keys->element[i]->len));
    }
  }
  return OkStatus();
}

void CoordinatorStores::Stop() {
  if (redis_pid_ > 0) {
    ::kill(redis_pid_, SIGTERM);
    ::waitpid(redis_pid_, nullptr, 0);
    redis_pid_ = -1;
  }
}

Result<std::string> CoordinatorStores::EnsureRedis() {
  if (redis_pid_ <= 0) RETURN_IF_ERROR(StartRedis());
  return options_.advertise_address + ":" + std::to_string(redis_port_);
}

Status CoordinatorStores::StartRedis() {
  ASSIGN_OR_RETURN(const int port, FreeLoopbackPort());
  ASSIGN_OR_RETURN(admin_password_, RandomHex(32));
  // The configuration holds the admin password: a 0600 file, never argv.
  const std::string config = options_.data_dir + "/redis.conf";
  RETURN_IF_ERROR(WritePrivateFile(
      config, "port " + std::to_string(port) + "\nbind " +
                  options_.advertise_address +
                  "\nsave \"\"\nappendonly no\nprotected-mode yes\n"
                  "user default off\nuser " +
                  kAdminUser + " on >" + admin_password_ + " ~* &* +@all\n"));
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
    const char* argv[] = {"redis-server", config.c_str(), nullptr};
    ::execvp("redis-server", const_cast<char* const*>(argv));
    ::_exit(127);
  }
  redis_pid_ = pid;
  redis_port_ = port;
  // Ready when the admin can authenticate (5 s at most).
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::seconds(5);
  Status ready = RedisCommand({"PING"});
  while (!ready.ok() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    ready = RedisCommand({"PING"});
  }
  if (!ready.ok()) {
    Stop();
    return Unavailable("redis-server did not start (see " + log +
                       "): " + ready.message());
  }
  std::fprintf(stderr,
               "controller: started redis-server on %s:%d as the coordinator "
               "store (default user off, one ACL user per queued resource)\n",
               options_.advertise_address.c_str(), port);
  return OkStatus();
}

}  // namespace multislice::control
