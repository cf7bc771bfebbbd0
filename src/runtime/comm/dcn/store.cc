// The rendezvous store: address parsing, the bounded and prefixed view of
// Gloo's own FileStore / RedisStore, and the attempt record.
//
// Waits. Gloo's stores poll for keys, and their get() first waits with a
// hard-coded 30 s default (FileStore) or 60 s (RedisStore) whatever the
// caller's timeout; their wait() also compares whole elapsed seconds with a
// millisecond timeout. BoundedStore therefore polls the inner store's check()
// itself against a millisecond deadline and only calls the inner get() once
// the key is known to exist, so every wait ends within the configured timeout.
//
// Attempt record, file:// protocol. The record of run R is the file
// "DIR/run-<R escaped>.attempt" holding
//     multislice-attempt v1
//     <attempt>
// It is changed only under an exclusive flock(2) on "DIR/run-<R>.lock": read
// the record, compare, write "<record>.tmp", fsync it, rename it over the
// record and fsync the directory, so a crash at any point leaves either the
// old or the new record, never a torn one.
//
// Attempt record, redis:// protocol. The key "multislice/attempt/<R>" holds
// the decimal attempt number; one Lua script (atomic in Redis) stores
// max(current, attempt) and returns the stored value.
#include "runtime/comm/dcn/store.h"

#include <fcntl.h>
#include <gloo/common/error.h>
#include <gloo/common/logging.h>
#include <gloo/common/string.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/rendezvous/redis_store.h>
#include <hiredis/hiredis.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "runtime/comm/dcn/gloo_errors.h"

namespace multislice::dcn {
namespace {

constexpr std::string_view kFileScheme = "file://";
constexpr std::string_view kRedisScheme = "redis://";
constexpr int kDefaultRedisPort = 6379;
// Connecting to and each command sent to Redis.
constexpr int kRedisIoTimeoutSeconds = 5;
// Version line of the attempt record (file://).
constexpr std::string_view kAttemptRecordHeader = "multislice-attempt v1";

Status BadAddress(std::string_view address, std::string_view why) {
  return InvalidArgument("invalid rendezvous store address '" +
                         std::string(address) + "' (" + std::string(why) +
                         "): expected file://DIR or redis://HOST:PORT");
}

// Gloo's FileStore keeps check() protected; this exposes it for polling.
class PollableFileStore : public gloo::rendezvous::FileStore {
 public:
  explicit PollableFileStore(const std::string& path) : FileStore(path) {}
  using FileStore::check;
};

// AUTH [user] password on `redis`; empty when there is nothing to send or
// it was accepted, else the server's refusal.
std::string Authenticate(redisContext* redis, const StoreAddress& address) {
  if (address.password.empty()) return "";
  std::vector<const char*> argv = {"AUTH"};
  std::vector<size_t> lens = {4};
  if (!address.user.empty()) {
    argv.push_back(address.user.c_str());
    lens.push_back(address.user.size());
  }
  argv.push_back(address.password.c_str());
  lens.push_back(address.password.size());
  auto* reply = static_cast<redisReply*>(redisCommandArgv(
      redis, static_cast<int>(argv.size()), argv.data(), lens.data()));
  if (reply == nullptr) return redis->errstr;
  std::string error;
  if (reply->type == REDIS_REPLY_ERROR) error.assign(reply->str, reply->len);
  freeReplyObject(reply);
  return error;
}

// Gloo's RedisStore sends its commands without a timeout; a Redis server
// that stops answering would block a worker forever. Authenticates first
// when the address has credentials.
class TimedRedisStore : public gloo::rendezvous::RedisStore {
 public:
  TimedRedisStore(const StoreAddress& address, timeval io_timeout)
      : RedisStore(address.host, address.port) {
    redisSetTimeout(redis_, io_timeout);
    const std::string refused = Authenticate(redis_, address);
    if (!refused.empty()) {
      GLOO_THROW_IO_EXCEPTION("authentication refused: ", refused);
    }
  }
};

// Prefixes every key and bounds every wait (see the file comment). Inner is
// one of the two stores above. Thread-safe: the device threads of a worker
// share one store, while Gloo's stores are not (FileStore appends to a
// vector in set(), a hiredis context serves one caller at a time), so every
// call into Inner holds a mutex; waits poll without holding it.
template <typename Inner>
class BoundedStore : public gloo::rendezvous::Store {
 public:
  BoundedStore(std::unique_ptr<Inner> inner, std::string prefix,
               std::chrono::milliseconds timeout)
      : inner_(std::move(inner)),
        prefix_(std::move(prefix)),
        timeout_(timeout) {}

  void set(const std::string& key, const std::vector<char>& data) override {
    std::lock_guard<std::mutex> lock(mu_);
    inner_->set(Join(key), data);
  }

  std::vector<char> get(const std::string& key) override {
    wait({key}, timeout_);
    std::lock_guard<std::mutex> lock(mu_);
    return inner_->get(Join(key));
  }

  void wait(const std::vector<std::string>& keys) override {
    wait(keys, timeout_);
  }

  // A caller's timeout can only shorten the configured one; Gloo's "no
  // timeout" (zero) means the configured one.
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override {
    const std::chrono::milliseconds limit =
        timeout > std::chrono::milliseconds::zero()
            ? std::min(timeout, timeout_)
            : timeout_;
    std::vector<std::string> joined;
    joined.reserve(keys.size());
    for (const std::string& key : keys) joined.push_back(Join(key));

    const auto deadline = std::chrono::steady_clock::now() + limit;
    // Start fast (a peer is usually a moment behind), back off to Gloo's own
    // polling period.
    std::chrono::milliseconds pause(1);
    while (!Check(joined)) {
      const auto now = std::chrono::steady_clock::now();
      if (now >= deadline) {
        GLOO_THROW_IO_EXCEPTION("Wait timeout after ", limit.count(),
                                " ms for key(s): ", ::gloo::MakeString(joined));
      }
      std::this_thread::sleep_for(
          std::min<std::chrono::nanoseconds>(pause, deadline - now));
      pause = std::min(pause * 2, std::chrono::milliseconds(10));
    }
  }

 private:
  std::string Join(const std::string& key) const {
    if (prefix_.empty()) return key;
    if (prefix_.back() == '/') return prefix_ + key;
    return prefix_ + "/" + key;
  }

  bool Check(const std::vector<std::string>& joined) {
    std::lock_guard<std::mutex> lock(mu_);
    return inner_->check(joined);
  }

  std::mutex mu_;
  std::unique_ptr<Inner> inner_;
  const std::string prefix_;
  const std::chrono::milliseconds timeout_;
};

// "%XX" escapes decoded; nullopt on a malformed escape.
std::optional<std::string> PercentDecode(std::string_view text) {
  std::string out;
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] != '%') {
      out.push_back(text[i]);
      continue;
    }
    int value = 0;
    if (i + 2 >= text.size()) return {};
    auto [ptr, ec] =
        std::from_chars(text.data() + i + 1, text.data() + i + 3, value, 16);
    if (ec != std::errc() || ptr != text.data() + i + 3) return {};
    out.push_back(static_cast<char>(value));
    i += 2;
  }
  return out;
}

Result<int> ParsePort(std::string_view address, std::string_view text) {
  int port = 0;
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, port);
  if (text.empty() || ec != std::errc() || ptr != end || port < 1 ||
      port > 65535) {
    return BadAddress(address, "port '" + std::string(text) +
                                   "' is not a number in 1..65535");
  }
  return port;
}

Status MakeDirectory(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) {
    return Unavailable("cannot create the rendezvous store directory '" + dir +
                       "': " + ec.message());
  }
  return OkStatus();
}

std::string StaleMessage(const std::string& run_id, int attempt,
                         long long current) {
  return "attempt " + std::to_string(attempt) + " of run '" + run_id +
         "' is stale: attempt " + std::to_string(current) +
         " has already started";
}

// A run id may contain any byte; file names get [A-Za-z0-9._-] and %XX.
std::string EscapeForFileName(const std::string& run_id) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : run_id) {
    if (std::isalnum(c) || c == '-' || c == '_' || (c == '.' && !out.empty())) {
      out.push_back(static_cast<char>(c));
    } else {
      out.push_back('%');
      out.push_back(kHex[c >> 4]);
      out.push_back(kHex[c & 15]);
    }
  }
  return out;
}

std::string Errno(const std::string& what, const std::string& path) {
  return what + " '" + path + "': " + std::strerror(errno);
}

// Closes a file descriptor on scope exit (which also drops a flock).
class FdCloser {
 public:
  explicit FdCloser(int fd) : fd_(fd) {}
  ~FdCloser() {
    if (fd_ >= 0) ::close(fd_);
  }
  FdCloser(const FdCloser&) = delete;
  FdCloser& operator=(const FdCloser&) = delete;

 private:
  int fd_;
};

Status WriteAll(int fd, const std::string& data, const std::string& path) {
  size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = ::write(fd, data.data() + done, data.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return Internal(Errno("cannot write", path));
    }
    done += static_cast<size_t>(n);
  }
  return OkStatus();
}

// Reads the attempt record; -1 when there is none yet.
Result<long long> ReadAttemptRecord(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return -1LL;
    return Internal(Errno("cannot open the attempt record", path));
  }
  FdCloser closer(fd);
  std::string text;
  char buf[256];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n < 0) {
      if (errno == EINTR) continue;
      return Internal(Errno("cannot read the attempt record", path));
    }
    if (n == 0) break;
    text.append(buf, static_cast<size_t>(n));
    if (text.size() > 4096) break;
  }
  const std::string header = std::string(kAttemptRecordHeader) + "\n";
  long long value = -1;
  if (text.rfind(header, 0) == 0) {
    std::string_view rest(text);
    rest.remove_prefix(header.size());
    while (!rest.empty() && (rest.back() == '\n' || rest.back() == ' ')) {
      rest.remove_suffix(1);
    }
    auto [ptr, ec] =
        std::from_chars(rest.data(), rest.data() + rest.size(), value);
    if (ec == std::errc() && ptr == rest.data() + rest.size() && value >= 0) {
      return value;
    }
  }
  return Internal("the attempt record '" + path +
                  "' is not in the expected format (\"" +
                  std::string(kAttemptRecordHeader) + "\" then a number)");
}

Status ClaimAttemptInFile(const std::string& dir, const std::string& run_id,
                          int attempt) {
  RETURN_IF_ERROR(MakeDirectory(dir));
  const std::string base = dir + "/run-" + EscapeForFileName(run_id);
  const std::string lock_path = base + ".lock";
  const std::string record_path = base + ".attempt";
  const std::string temp_path = record_path + ".tmp";

  const int lock_fd =
      ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (lock_fd < 0) return Unavailable(Errno("cannot open the lock", lock_path));
  FdCloser lock_closer(lock_fd);
  while (::flock(lock_fd, LOCK_EX) != 0) {
    if (errno != EINTR) return Unavailable(Errno("cannot lock", lock_path));
  }

  ASSIGN_OR_RETURN(const long long current, ReadAttemptRecord(record_path));
  if (current > attempt) {
    return Aborted(StaleMessage(run_id, attempt, current));
  }
  if (current == attempt) return OkStatus();

  const int fd =
      ::open(temp_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return Internal(Errno("cannot create", temp_path));
  {
    FdCloser closer(fd);
    RETURN_IF_ERROR(WriteAll(fd,
                             std::string(kAttemptRecordHeader) + "\n" +
                                 std::to_string(attempt) + "\n",
                             temp_path));
    if (::fsync(fd) != 0) return Internal(Errno("cannot fsync", temp_path));
  }
  if (::rename(temp_path.c_str(), record_path.c_str()) != 0) {
    return Internal(Errno("cannot rename onto", record_path));
  }
  const int dir_fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd >= 0) {
    FdCloser closer(dir_fd);
    ::fsync(dir_fd);  // Best effort: some file systems refuse directories.
  }
  return OkStatus();
}

// Sets KEYS[1] to max(KEYS[1], ARGV[1]) and returns the stored value.
constexpr char kClaimScript[] =
    "local current = tonumber(redis.call('GET', KEYS[1]))\n"
    "local attempt = tonumber(ARGV[1])\n"
    "if current == nil or attempt > current then\n"
    "  redis.call('SET', KEYS[1], ARGV[1])\n"
    "  return attempt\n"
    "end\n"
    "return current\n";

using RedisConnection = std::unique_ptr<redisContext, void (*)(redisContext*)>;

// Connects to the Redis server with kRedisIoTimeoutSeconds on the connection
// and on every command.
Result<RedisConnection> ConnectRedis(const StoreAddress& address) {
  const timeval io_timeout = {kRedisIoTimeoutSeconds, 0};
  RedisConnection redis(
      redisConnectWithTimeout(address.host.c_str(), address.port, io_timeout),
      redisFree);
  if (redis == nullptr) {
    return Unavailable("cannot reach the rendezvous store " +
                       address.ToString() + ": out of memory");
  }
  if (redis->err != 0) {
    return Unavailable("cannot reach the rendezvous store " +
                       address.ToString() + ": " + redis->errstr);
  }
  redisSetTimeout(redis.get(), io_timeout);
  const std::string refused = Authenticate(redis.get(), address);
  if (!refused.empty()) {
    return Unavailable("the rendezvous store " + address.ToString() +
                       " refused the credentials: " + refused);
  }
  return redis;
}

Status CheckRedisReachable(const StoreAddress& address) {
  return ConnectRedis(address).status();
}

Status ClaimAttemptInRedis(const StoreAddress& address,
                           const std::string& run_id, int attempt) {
  const std::string where = address.ToString();
  ASSIGN_OR_RETURN(RedisConnection owner, ConnectRedis(address));
  redisContext* redis = owner.get();

  const std::string key = "multislice/attempt/" + run_id;
  const std::string value = std::to_string(attempt);
  const char* argv[] = {"EVAL", kClaimScript, "1", key.c_str(), value.c_str()};
  const size_t argvlen[] = {4, std::strlen(kClaimScript), 1, key.size(),
                            value.size()};
  auto* reply =
      static_cast<redisReply*>(redisCommandArgv(redis, 5, argv, argvlen));
  if (reply == nullptr) {
    return Unavailable("rendezvous store " + where +
                       " failed while recording the attempt: " + redis->errstr);
  }
  std::unique_ptr<redisReply, void (*)(void*)> reply_owner(reply,
                                                           freeReplyObject);
  if (reply->type == REDIS_REPLY_ERROR) {
    return Internal(
        "rendezvous store " + where +
        " refused the attempt record: " + std::string(reply->str, reply->len));
  }
  if (reply->type != REDIS_REPLY_INTEGER) {
    return Internal("rendezvous store " + where +
                    " answered the attempt record with an unexpected reply");
  }
  if (reply->integer > attempt) {
    return Aborted(StaleMessage(run_id, attempt, reply->integer));
  }
  return OkStatus();
}

}  // namespace

std::string StoreAddress::ToString() const {
  if (kind == Kind::kFile) return std::string(kFileScheme) + path;
  const bool ipv6 = host.find(':') != std::string::npos;
  const std::string who = user.empty() ? "" : user + "@";
  return std::string(kRedisScheme) + who + (ipv6 ? "[" + host + "]" : host) +
         ":" + std::to_string(port);
}

Result<StoreAddress> ParseStoreAddress(std::string_view address) {
  StoreAddress out;
  if (address.starts_with(kFileScheme)) {
    std::string_view dir = address.substr(kFileScheme.size());
    if (dir.empty()) return BadAddress(address, "the directory is empty");
    out.kind = StoreAddress::Kind::kFile;
    out.path = std::string(dir);
    return out;
  }
  if (address.starts_with(kRedisScheme)) {
    std::string_view rest = address.substr(kRedisScheme.size());
    out.kind = StoreAddress::Kind::kRedis;
    const size_t at = rest.rfind('@');
    if (at != std::string_view::npos) {
      std::string_view credentials = rest.substr(0, at);
      rest = rest.substr(at + 1);
      const size_t colon = credentials.find(':');
      if (colon == std::string_view::npos) {
        return BadAddress(address, "credentials are USER:PASSWORD@");
      }
      auto user = PercentDecode(credentials.substr(0, colon));
      auto password = PercentDecode(credentials.substr(colon + 1));
      if (!user || !password || password->empty()) {
        return BadAddress(address, "the credentials are not USER:PASSWORD");
      }
      out.user = *user;
      out.password = *password;
    }
    out.port = kDefaultRedisPort;
    std::string_view host, port;
    if (rest.starts_with('[')) {  // [IPv6]:PORT
      const size_t close = rest.find(']');
      if (close == std::string_view::npos) {
        return BadAddress(address, "unterminated '[' in the host");
      }
      host = rest.substr(1, close - 1);
      std::string_view after = rest.substr(close + 1);
      if (!after.empty()) {
        if (!after.starts_with(':')) {
          return BadAddress(address, "expected ':PORT' after the host");
        }
        port = after.substr(1);
        if (port.empty()) return BadAddress(address, "the port is empty");
      }
    } else {
      const size_t colon = rest.rfind(':');
      host = rest.substr(0, colon);
      if (colon != std::string_view::npos) {
        port = rest.substr(colon + 1);
        if (port.empty()) return BadAddress(address, "the port is empty");
      }
    }
    if (host.empty()) return BadAddress(address, "the host is empty");
    if (host.find_first_of("/?#@ ") != std::string_view::npos) {
      return BadAddress(address, "the host contains '/', '?', '#', '@' or ' '");
    }
    out.host = std::string(host);
    if (!port.empty()) {
      ASSIGN_OR_RETURN(out.port, ParsePort(address, port));
    }
    return out;
  }
  return BadAddress(address, "unknown scheme");
}

Result<std::shared_ptr<gloo::rendezvous::Store>> OpenStore(
    const StoreAddress& address, const std::string& prefix,
    std::chrono::milliseconds timeout) {
  if (timeout <= std::chrono::milliseconds::zero()) {
    return InvalidArgument("the rendezvous timeout must be positive, got " +
                           std::to_string(timeout.count()) + " ms");
  }
  try {
    if (address.kind == StoreAddress::Kind::kFile) {
      RETURN_IF_ERROR(MakeDirectory(address.path));
      return std::shared_ptr<gloo::rendezvous::Store>(
          std::make_shared<BoundedStore<PollableFileStore>>(
              std::make_unique<PollableFileStore>(address.path), prefix,
              timeout));
    }
    // Gloo's RedisStore leaks its connection when its constructor throws;
    // find out first whether the server answers.
    RETURN_IF_ERROR(CheckRedisReachable(address));
    const timeval io_timeout = {kRedisIoTimeoutSeconds, 0};
    return std::shared_ptr<gloo::rendezvous::Store>(
        std::make_shared<BoundedStore<TimedRedisStore>>(
            std::make_unique<TimedRedisStore>(address, io_timeout), prefix,
            timeout));
  } catch (const std::exception& e) {
    return Unavailable("cannot open the rendezvous store " +
                       address.ToString() + ": " + GlooErrorMessage(e));
  }
}

Status ClaimAttempt(const StoreAddress& address, const std::string& run_id,
                    int attempt) {
  if (attempt < 0) {
    return InvalidArgument("the restart attempt must be >= 0, got " +
                           std::to_string(attempt));
  }
  if (address.kind == StoreAddress::Kind::kFile) {
    return ClaimAttemptInFile(address.path, run_id, attempt);
  }
  return ClaimAttemptInRedis(address, run_id, attempt);
}

}  // namespace multislice::dcn
