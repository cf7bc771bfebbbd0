// The host agent (see agent.h): the /agent/v1/ handlers over a WorkerTable
// (workers.h), and the registration + heartbeat loop.
//
// Locking: `mu` guards the registration state only; the tables have their
// own lock, and nothing here holds `mu` while calling the controller.
#include "control/agent/agent.h"

#include <fcntl.h>
#include <pwd.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <mutex>
#include <optional>
#include <regex>
#include <thread>
#include <vector>

#include "control/agent/ssh_server.h"
#include "control/http.h"

namespace multislice::control {

using nlohmann::json;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

namespace {

constexpr int kDefaultGraceSeconds = 5;
constexpr int kMaxGraceSeconds = 3600;
constexpr int kServerThreads = 32;

// `url` ("http://HOST:PORT") with another port.
std::string WithPort(const std::string &url, int port) {
  const size_t scheme = url.find("://");
  const size_t host = scheme == std::string::npos ? 0 : scheme + 3;
  size_t end = url.find('/', host);
  if (end == std::string::npos) end = url.size();
  size_t colon = url.rfind(':', end);
  if (colon == std::string::npos || colon < host || url[end - 1] == ']') {
    colon = end;  // no port given
  }
  return url.substr(0, colon) + ":" + std::to_string(port);
}

bool ValidEnvName(const std::string &name) {
  if (name.empty() || name.size() > 128) return false;
  for (size_t i = 0; i < name.size(); ++i) {
    char c = name[i];
    bool ok = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || c == '_' ||
              (i > 0 && c >= '0' && c <= '9');
    if (!ok) return false;
  }
  return true;
}

// Parses an optional {"NAME": "value"} object into "NAME=value" entries.
Status ParseEnv(const json &body, std::vector<std::string> *env) {
  if (!body.contains("env")) return OkStatus();
  const json &object = body["env"];
  if (!object.is_object()) {
    return InvalidArgument("env: expected an object of strings");
  }
  if (object.size() > kMaxEnvEntries) {
    return InvalidArgument("env: more than " + std::to_string(kMaxEnvEntries) +
                           " variables");
  }
  for (const auto &[name, value] : object.items()) {
    if (!ValidEnvName(name)) {
      return InvalidArgument("env: '" + name.substr(0, 130) +
                             "' is not a variable name ([A-Za-z_][A-Za-z0-9_]*,"
                             " at most 128 characters)");
    }
    if (!value.is_string()) {
      return InvalidArgument("env." + name + ": expected a string");
    }
    const std::string &text = value.get_ref<const std::string &>();
    if (text.size() > kMaxEnvValueBytes ||
        text.find('\0') != std::string::npos) {
      return InvalidArgument("env." + name + ": longer than " +
                             std::to_string(kMaxEnvValueBytes) +
                             " bytes or holds a NUL byte");
    }
    env->push_back(name + "=" + text);
  }
  return OkStatus();
}

// Parses an optional {"graceSeconds": n} body.
Result<milliseconds> ParseGrace(const std::string &text) {
  if (text.empty()) return milliseconds(kDefaultGraceSeconds * 1000);
  json body = json::parse(text, nullptr, false);
  if (body.is_discarded() || !body.is_object()) {
    return InvalidArgument("the body is not a JSON object");
  }
  if (!body.contains("graceSeconds")) {
    return milliseconds(kDefaultGraceSeconds * 1000);
  }
  const json &grace = body["graceSeconds"];
  if (!grace.is_number() || grace.get<double>() < 0 ||
      grace.get<double>() > kMaxGraceSeconds) {
    return InvalidArgument("graceSeconds: expected a number from 0 to " +
                           std::to_string(kMaxGraceSeconds));
  }
  return milliseconds(static_cast<long long>(grace.get<double>() * 1000));
}

void Log(const std::string &line) {
  std::fprintf(stderr, "multislice agent: %s\n", line.c_str());
}

// Writes `status` as the google.rpc.Status its code stands for.
void WriteStatus(httplib::Response &res, const Status &status) {
  switch (status.code()) {
    case StatusCode::kInvalidArgument:
      return WriteError(res, 400, "INVALID_ARGUMENT", status.message());
    case StatusCode::kNotFound:
      return WriteError(res, 404, "NOT_FOUND", status.message());
    case StatusCode::kFailedPrecondition:
      return WriteError(res, 409, "ALREADY_EXISTS", status.message());
    case StatusCode::kAborted:
      return WriteError(res, 409, "ABORTED", status.message());
    case StatusCode::kUnavailable:
      return WriteError(res, 503, "UNAVAILABLE", status.message());
    case StatusCode::kDeadlineExceeded:
      return WriteError(res, 500, "DEADLINE_EXCEEDED", status.message());
    default:
      return WriteError(res, 500, "INTERNAL", status.message());
  }
}

// body[field] as a non-empty string, or null with a 400 written to `res`.
const std::string *NonEmptyString(const json &body, const char *field,
                                  httplib::Response &res) {
  if (!body.contains(field) || !body[field].is_string() ||
      body[field].get_ref<const std::string &>().empty()) {
    WriteError(res, 400, "INVALID_ARGUMENT",
               std::string(field) + ": expected a non-empty string");
    return nullptr;
  }
  return &body[field].get_ref<const std::string &>();
}

// The request body as a JSON object, or an error written to `res`.
std::optional<json> ParseBody(const httplib::Request &req,
                              httplib::Response &res) {
  json body = json::parse(req.body, nullptr, false);
  if (body.is_discarded() || !body.is_object()) {
    WriteError(res, 400, "INVALID_ARGUMENT", "the body is not a JSON object");
    return std::nullopt;
  }
  return body;
}

// The one route whose body may exceed kMaxBodyBytes.
bool IsUploadPath(const std::string &path) {
  static const std::regex kUpload(R"(/agent/v1/workers/[^/:]+/files)");
  return std::regex_match(path, kUpload);
}

// Refuses an upload announced larger than kMaxUploadBytes from its
// Content-Length, before reading it (the connection is then closed).
bool UploadTooLarge(const httplib::Request &req, httplib::Response &res) {
  if (!IsUploadPath(req.path)) return false;
  const std::string length = req.get_header_value("Content-Length");
  if (length.empty()) return false;  // chunked: bounded while reading
  char *end = nullptr;
  errno = 0;
  const unsigned long long n = std::strtoull(length.c_str(), &end, 10);
  if (*end == '\0' && errno == 0 && n <= kMaxUploadBytes) return false;
  WriteError(
      res, 413, "INVALID_ARGUMENT",
      "the body is larger than " + std::to_string(kMaxUploadBytes) + " bytes");
  res.set_header("Connection", "close");
  return true;
}

// A file written through a temporary beside it, renamed into place by
// Commit(); removed if never committed.
class AtomicFile {
 public:
  ~AtomicFile() {
    if (fd_ >= 0) ::close(fd_);
    if (!tmp_.empty()) ::unlink(tmp_.c_str());
  }
  Status Open(const std::string &path) {
    path_ = path;
    std::error_code ec;
    std::filesystem::create_directories(
        std::filesystem::path(path).parent_path(), ec);
    if (ec) return Internal("cannot create the directory of " + path);
    // Unique, so that two uploads of one path do not share a temporary.
    static std::atomic<unsigned long long> counter{0};
    tmp_ = path + ".upload-" + std::to_string(++counter);
    fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd_ < 0) {
      tmp_.clear();
      return Internal("cannot write " + path);
    }
    return OkStatus();
  }
  bool Write(const char *data, size_t size) {
    while (size > 0) {
      ssize_t n = ::write(fd_, data, size);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return false;
      data += n;
      size -= static_cast<size_t>(n);
      written_ += static_cast<size_t>(n);
    }
    return true;
  }
  Status Commit() {
    const int fd = fd_;
    fd_ = -1;
    if (::close(fd) != 0 || ::rename(tmp_.c_str(), path_.c_str()) != 0) {
      return Internal("cannot write " + path_);
    }
    tmp_.clear();
    return OkStatus();
  }
  size_t written() const { return written_; }

 private:
  std::string path_, tmp_;
  int fd_ = -1;
  size_t written_ = 0;
};

}  // namespace

struct Agent::Impl {
  AgentOptions options;
  std::unique_ptr<ProcessLauncher> owned_launcher;
  std::unique_ptr<WorkerTable> table;
  // This host's sshd, or null (declared after the launcher it uses, so it
  // goes first). The owner and generation of the keys last applied.
  std::unique_ptr<SshServer> ssh;
  std::string ssh_owner;
  int64_t ssh_generation = -1;
  std::string session_worker;  // whose directory and environment ssh gets
  int worker_uid = -1;
  httplib::Server server;
  int port = 0;
  std::thread server_thread;
  std::thread control_thread;

  std::mutex mu;
  std::condition_variable cv;
  std::string host_id;
  // The credential the controller issued at registration (hostSecret): the
  // only one this agent's API accepts, and the one its heartbeats carry.
  // Empty until then (or with a controller that issues none): the token it
  // was started with.
  std::string host_secret;
  milliseconds heartbeat_interval{500};
  int heartbeat_port = 0;  // the controller's agent channel; 0: its API port
  bool registered = false;
  Status registration_failure;  // not ok once the first registration failed
  bool shutting_down = false;
  std::once_flag shutdown_once;

  std::string Address() const {
    const std::string &host = options.advertise_address.empty()
                                  ? options.bind
                                  : options.advertise_address;
    return host + ":" + std::to_string(port);
  }

  // ----- handlers -----

  void Health(const httplib::Request &, httplib::Response &res) {
    WriteJson(res, 200,
              {{"hostId", HostId()},
               {"zone", options.zone},
               {"acceleratorType", options.accelerator_type},
               {"iciDomain", options.ici_domain},
               {"workers", table->size()}});
  }

  void ListWorkers(const httplib::Request &, httplib::Response &res) {
    WriteJson(res, 200, {{"workers", table->Statuses()}});
  }

  void PutWorker(const httplib::Request &req, httplib::Response &res) {
    const std::string name = req.matches[1];
    if (!ValidWorkerName(name)) {
      WriteError(res, 400, "INVALID_ARGUMENT",
                 "worker name: expected 1 to 128 of [a-z0-9.-] starting with "
                 "a letter or digit");
      return;
    }
    std::optional<json> body = ParseBody(req, res);
    if (!body) return;
    if (!body->contains("script") || !(*body)["script"].is_string()) {
      WriteError(res, 400, "INVALID_ARGUMENT", "script: expected a string");
      return;
    }
    const std::string &script =
        (*body)["script"].get_ref<const std::string &>();
    if (script.size() > kMaxScriptBytes) {
      WriteError(
          res, 400, "INVALID_ARGUMENT",
          "script: longer than " + std::to_string(kMaxScriptBytes) + " bytes");
      return;
    }
    int attempt = 1;
    if (body->contains("attempt")) {
      const json &value = (*body)["attempt"];
      if (!value.is_number_integer() || value.get<long long>() < 0 ||
          value.get<long long>() > 1000000000) {
        WriteError(res, 400, "INVALID_ARGUMENT",
                   "attempt: expected an integer from 0 to 1000000000");
        return;
      }
      attempt = value.get<int>();
    }
    std::vector<std::string> env;
    if (Status s = ParseEnv(*body, &env); !s.ok()) return WriteStatus(res, s);
    // This host's memory for the trainer's in-memory replicas: one directory
    // per agent under /dev/shm, so that a replacement host (another agent)
    // starts without the failed host's state even on one machine.
    if (std::none_of(env.begin(), env.end(), [](const std::string &e) {
          return e.rfind("MULTISLICE_HOST_MEMORY_DIR=", 0) == 0;
        })) {
      env.push_back("MULTISLICE_HOST_MEMORY_DIR=/dev/shm/multislice-" +
                    std::to_string(::getuid()) + "/agent-" +
                    std::to_string(std::hash<std::string>{}(options.workdir)));
    }
    auto status = table->Start(name, attempt, script, env);
    if (!status.ok()) return WriteStatus(res, status.status());
    // ssh sessions start in this worker's directory and environment.
    if (ssh) {
      Status s =
          ssh->SetSession(status->value("directory", ""), env, worker_uid);
      if (!s.ok()) Log("ssh: " + s.message());
      std::lock_guard<std::mutex> lock(mu);
      session_worker = name;
    }
    WriteJson(res, 201, *status);
  }

  void StopWorker(const httplib::Request &req, httplib::Response &res) {
    auto grace = ParseGrace(req.body);
    if (!grace.ok()) return WriteStatus(res, grace.status());
    auto status = table->Stop(req.matches[1], *grace);
    if (!status.ok()) return WriteStatus(res, status.status());
    EndSession(req.matches[1]);
    WriteJson(res, 200, *status);
  }

  // A stopped worker's environment is no session's any more.
  void EndSession(const std::string &worker) {
    if (!ssh) return;
    {
      std::lock_guard<std::mutex> lock(mu);
      if (!worker.empty() && worker != session_worker) return;
      session_worker.clear();
    }
    ssh->SetSession("", {}, -1).ok();
  }

  void StartExec(const httplib::Request &req, httplib::Response &res) {
    std::optional<json> body = ParseBody(req, res);
    if (!body) return;
    const std::string *given = NonEmptyString(*body, "command", res);
    if (given == nullptr) return;
    const std::string &command = *given;
    if (command.size() > kMaxScriptBytes ||
        command.find('\0') != std::string::npos) {
      WriteError(res, 400, "INVALID_ARGUMENT",
                 "command: longer than " + std::to_string(kMaxScriptBytes) +
                     " bytes or holds a NUL byte");
      return;
    }
    ExecSpec spec;
    spec.command = command;
    if (body->contains("worker") && !(*body)["worker"].is_null()) {
      if (!(*body)["worker"].is_string() ||
          !ValidWorkerName((*body)["worker"].get<std::string>())) {
        WriteError(res, 400, "INVALID_ARGUMENT",
                   "worker: expected 1 to 128 of [a-z0-9.-] starting with a "
                   "letter or digit");
        return;
      }
      spec.worker = (*body)["worker"].get<std::string>();
    }
    for (auto [field, target] : {std::pair{"tag", &spec.tag},
                                 std::pair{"directory", &spec.directory}}) {
      if (!body->contains(field) || (*body)[field].is_null()) continue;
      if (!(*body)[field].is_string()) {
        WriteError(res, 400, "INVALID_ARGUMENT",
                   std::string(field) + ": expected a string");
        return;
      }
      *target = (*body)[field].get<std::string>();
    }
    if (Status s = ParseEnv(*body, &spec.env); !s.ok()) {
      return WriteStatus(res, s);
    }
    auto id = table->StartExec(spec);
    if (!id.ok()) return WriteStatus(res, id.status());
    WriteJson(res, 201, {{"execId", *id}});
  }

  void ReadExec(const httplib::Request &req, httplib::Response &res) {
    long long offset = 0;
    if (req.has_param("offset")) {
      const std::string text = req.get_param_value("offset");
      char *end = nullptr;
      errno = 0;
      offset = std::strtoll(text.c_str(), &end, 10);
      if (text.empty() || *end != '\0' || offset < 0 || errno != 0) {
        WriteError(res, 400, "INVALID_ARGUMENT",
                   "offset: '" + text.substr(0, 32) +
                       "' is not a non-negative integer");
        return;
      }
    }
    auto chunk = table->ReadExec(req.matches[1], offset);
    if (!chunk.ok()) return WriteStatus(res, chunk.status());
    json out = {{"output", chunk->output},
                {"nextOffset", chunk->next_offset},
                {"done", chunk->done},
                {"exitCode", nullptr}};
    if (chunk->done) out["exitCode"] = chunk->exit_code;
    // Output is bytes; invalid UTF-8 is replaced rather than failing.
    res.status = 200;
    res.set_content(out.dump(-1, ' ', false, json::error_handler_t::replace),
                    "application/json");
  }

  void StopExec(const httplib::Request &req, httplib::Response &res) {
    auto grace = ParseGrace(req.body);
    if (!grace.ok()) return WriteStatus(res, grace.status());
    const std::string id = req.matches[1];
    auto code = table->StopExec(id, *grace);
    if (!code.ok()) return WriteStatus(res, code.status());
    WriteJson(res, 200, {{"execId", id}, {"done", true}, {"exitCode", *code}});
  }

  // POST /agent/v1/workers/{name}/execs:stop {"tagPrefix", "graceSeconds"}
  void StopTaggedExecs(const httplib::Request &req, httplib::Response &res) {
    auto grace = ParseGrace(req.body);
    if (!grace.ok()) return WriteStatus(res, grace.status());
    std::optional<json> body = ParseBody(req, res);
    if (!body) return;
    const std::string *prefix = NonEmptyString(*body, "tagPrefix", res);
    if (prefix == nullptr) return;
    auto stopped = table->StopTaggedExecs(req.matches[1], *prefix, *grace);
    if (!stopped.ok()) return WriteStatus(res, stopped.status());
    json list = json::array();
    for (const StoppedExec &e : *stopped) {
      list.push_back(
          {{"execId", e.id}, {"tag", e.tag}, {"exitCode", e.exit_code}});
    }
    WriteJson(res, 200, {{"stopped", list}});
  }

  // PUT /agent/v1/workers/{name}/files?path=REL, the body being the file's
  // bytes: written to the worker's directory through a temporary file.
  void PutFile(const httplib::Request &req, httplib::Response &res,
               const httplib::ContentReader &reader) {
    const std::string rel =
        req.has_param("path") ? req.get_param_value("path") : "";
    if (!ValidRelativePath(rel)) {
      WriteError(res, 400, "INVALID_ARGUMENT",
                 "path: '" + rel.substr(0, 64) +
                     "' is not a relative path without empty, '.' or '..' "
                     "parts");
      return;
    }
    auto directory = table->WorkerDirectory(req.matches[1]);
    if (!directory.ok()) return WriteStatus(res, directory.status());
    AtomicFile file;
    if (Status s = file.Open(*directory + "/" + rel); !s.ok()) {
      return WriteStatus(res, s);
    }
    bool too_large = false, write_failed = false;
    const bool read = reader([&](const char *data, size_t size) {
      if (file.written() + size > kMaxUploadBytes) {
        too_large = true;
        return false;
      }
      if (!file.Write(data, size)) {
        write_failed = true;
        return false;
      }
      return true;
    });
    if (too_large) {
      WriteError(res, 413, "INVALID_ARGUMENT",
                 "the body is larger than " + std::to_string(kMaxUploadBytes) +
                     " bytes");
      return;
    }
    if (write_failed) return WriteStatus(res, Internal("cannot write " + rel));
    if (!read) {
      WriteError(res, 400, "INVALID_ARGUMENT", "the body could not be read");
      return;
    }
    const size_t size = file.written();
    if (Status s = file.Commit(); !s.ok()) return WriteStatus(res, s);
    WriteJson(res, 201, {{"path", rel}, {"size", size}});
  }

  std::string HostId() {
    std::lock_guard<std::mutex> lock(mu);
    return host_id;
  }

  // ----- controller channel -----

  // Fencing (docs/control.md): the workers' lease runs `leaseMs` from when
  // the answered call was sent, so it never outlasts the controller's view.
  void RenewLease(int64_t sent_ns, const json &answer) {
    long long lease_ms = -1;
    if (answer.is_object() && answer.contains("leaseMs") &&
        answer["leaseMs"].is_number_integer()) {
      lease_ms = answer["leaseMs"].get<long long>();
    }
    // A controller that grants no lease fences nothing.
    const int64_t deadline = lease_ms > 0 ? sent_ns + lease_ms * 1000000LL
                                          : std::numeric_limits<int64_t>::max();
    Status s = WriteLease(LeasePath(), deadline);
    if (!s.ok()) Log(s.message());
  }

  std::string LeasePath() const { return options.workdir + "/lease"; }

  // ----- ssh -----

  json SshApplied() {
    std::lock_guard<std::mutex> lock(mu);
    return {{"owner", ssh_owner}, {"generation", ssh_generation}};
  }

  // A heartbeat answer's "ssh": the keys of the node holding this host, for
  // its queued resource (owner); {"owner": ""} when none holds it.
  void ApplySshKeys(const json &answer) {
    if (!answer.is_object() || !answer.contains("ssh") ||
        !answer["ssh"].is_object()) {
      return;
    }
    const json &keys = answer["ssh"];
    const std::string owner = keys.value("owner", "");
    const int64_t generation =
        keys.contains("generation") && keys["generation"].is_number_integer()
            ? keys["generation"].get<int64_t>()
            : 0;
    const json text = keys.value("keys", json(""));
    {
      std::lock_guard<std::mutex> lock(mu);
      if (owner == ssh_owner && generation == ssh_generation) return;
    }
    if (owner.empty()) EndSession("");
    if (ssh) {
      for (const std::string &note :
           ssh->SetKeys(owner, text.is_string() ? text.get<std::string>()
                                                : std::string())) {
        Log("ssh-keys: " + note);
      }
    }
    std::lock_guard<std::mutex> lock(mu);
    ssh_owner = owner;
    ssh_generation = generation;
  }

  // What this agent's API accepts (see host_secret).
  std::string ApiCredential() {
    std::lock_guard<std::mutex> lock(mu);
    return host_secret.empty() ? options.token : host_secret;
  }

  // Stops every running worker: the controller has declared this host lost,
  // so they belong to an attempt that has moved on (their lease has lapsed
  // too: their guardians may have stopped them already).
  void StopEveryWorker() {
    EndSession("");
    for (const json &w : table->Statuses()) {
      if (w.value("state", "") != "RUNNING") continue;
      const std::string name = w.value("name", "");
      auto stopped = table->Stop(name, milliseconds(0));
      Log("stopped stale worker " + name + " (attempt " +
          std::to_string(w.value("attempt", 0)) + ")" +
          (stopped.ok() ? "" : ": " + stopped.status().message()));
    }
  }

  // One registration call; ok with the host id and interval set.
  Status RegisterOnce(const ApiClient &client) {
    json body = {{"hostname", options.hostname},
                 {"zone", options.zone},
                 {"acceleratorType", options.accelerator_type},
                 {"iciDomain", options.ici_domain},
                 {"agentAddress", Address()},
                 {"workdir", options.workdir}};
    if (ssh) {
      body["sshAddress"] = ssh->address();
      body["sshHostKeys"] = ssh->host_keys();
    }
    const int64_t sent_ns = BootTimeNs();
    ASSIGN_OR_RETURN(HttpResponse response,
                     client.Call("POST", "/internal/v1/hosts:register", &body));
    if (response.status / 100 != 2) return ErrorFromResponse(response);
    RenewLease(sent_ns, response.body);
    if (!response.body.is_object() || !response.body.contains("hostId") ||
        !response.body["hostId"].is_string() ||
        response.body["hostId"].get<std::string>().empty()) {
      return Internal("the controller's registration answer has no hostId");
    }
    std::lock_guard<std::mutex> lock(mu);
    host_id = response.body["hostId"].get<std::string>();
    if (response.body.contains("hostSecret") &&
        response.body["hostSecret"].is_string() &&
        response.body["hostSecret"].get<std::string>().size() >= 32) {
      host_secret = response.body["hostSecret"].get<std::string>();
    }
    long long interval = 500;
    if (response.body.contains("heartbeatIntervalMs") &&
        response.body["heartbeatIntervalMs"].is_number_integer()) {
      interval = response.body["heartbeatIntervalMs"].get<long long>();
    }
    heartbeat_interval = milliseconds(std::clamp(interval, 20LL, 60000LL));
    heartbeat_port = 0;
    if (response.body.contains("heartbeatPort") &&
        response.body["heartbeatPort"].is_number_integer()) {
      const long long port = response.body["heartbeatPort"].get<long long>();
      if (port > 0 && port < 65536) heartbeat_port = static_cast<int>(port);
    }
    return OkStatus();
  }

  // Waits `d` or until shutdown; false when shutting down.
  bool Sleep(milliseconds d) {
    std::unique_lock<std::mutex> lock(mu);
    return !cv.wait_for(lock, d, [this] { return shutting_down; });
  }

  // Registers, retrying with backoff; `deadline` bounds the first one only.
  bool Register(const ApiClient &client, bool first) {
    const auto deadline = Clock::now() + options.register_timeout;
    milliseconds backoff(50);
    Status last;
    for (int tries = 0;; ++tries) {
      last = RegisterOnce(client);
      if (last.ok()) {
        std::lock_guard<std::mutex> lock(mu);
        Log("registered as " + host_id + " with " + options.controller_url +
            ", serving " + Address());
        registered = true;
        cv.notify_all();
        return true;
      }
      // A refusal (bad token, bad body) will not change by retrying.
      if (last.code() == StatusCode::kInvalidArgument && first) break;
      milliseconds pause = backoff;
      if (first) {
        const auto left =
            std::chrono::duration_cast<milliseconds>(deadline - Clock::now());
        if (left <= milliseconds(0)) break;
        pause = std::min(pause, left);
      }
      if (tries == 0 && !first) Log("registering again: " + last.message());
      if (!Sleep(pause)) return false;
      backoff = std::min(backoff * 2, milliseconds(2000));
    }
    std::lock_guard<std::mutex> lock(mu);
    char seconds[32];
    std::snprintf(
        seconds, sizeof seconds, "%.1f",
        std::chrono::duration<double>(options.register_timeout).count());
    registration_failure =
        last.code() == StatusCode::kInvalidArgument
            ? FailedPrecondition("the controller " + options.controller_url +
                                 " refused the registration: " + last.message())
            : DeadlineExceeded("cannot register with the controller " +
                               options.controller_url + " within " + seconds +
                               " s: " + last.message());
    cv.notify_all();
    return false;
  }

  void ControlLoop() {
    auto client = ApiClient::Create(options.controller_url, options.token,
                                    options.http_timeout);
    if (!client.ok()) {
      std::lock_guard<std::mutex> lock(mu);
      registration_failure = client.status();
      cv.notify_all();
      return;
    }
    if (!Register(*client, /*first=*/true)) return;
    bool failing = false;
    std::optional<ApiClient> channel;  // heartbeats: the agents' port
    int channel_port = 0;
    std::string channel_secret;
    for (;;) {
      milliseconds interval;
      std::string id, secret;
      int port;
      {
        std::lock_guard<std::mutex> lock(mu);
        interval = heartbeat_interval;
        id = host_id;
        port = heartbeat_port;
        secret = host_secret.empty() ? options.token : host_secret;
      }
      if (port != channel_port || secret != channel_secret || !channel) {
        channel_port = port;
        channel_secret = secret;
        channel.reset();
        auto c =
            ApiClient::Create(port > 0 ? WithPort(options.controller_url, port)
                                       : options.controller_url,
                              secret, options.http_timeout);
        if (c.ok()) channel.emplace(std::move(*c));
      }
      if (!Sleep(interval)) return;
      json body = {{"workers", table->Statuses()}, {"ssh", SshApplied()}};
      const int64_t sent_ns = BootTimeNs();
      auto response =
          (channel ? *channel : *client)
              .Call("POST", "/internal/v1/hosts/" + id + ":heartbeat", &body);
      if (response.ok() && response->status == 401) {
        Log("the controller refused this host's credential; registering again");
        StopEveryWorker();
        if (!Register(*client, /*first=*/false)) return;
        continue;
      }
      if (response.ok() && response->status == 404) {
        Log("the controller does not know " + id +
            "; stopping this host's workers, then registering again");
        StopEveryWorker();
        if (!Register(*client, /*first=*/false)) return;
        continue;
      }
      if (response.ok() && response->status / 100 == 2) {
        RenewLease(sent_ns, response->body);
        ApplySshKeys(response->body);
      }
      Status s = !response.ok()                ? response.status()
                 : response->status / 100 != 2 ? ErrorFromResponse(*response)
                                               : OkStatus();
      if (!s.ok() && !failing) Log("heartbeat failed: " + s.message());
      if (s.ok() && failing) Log("heartbeats answered again");
      failing = !s.ok();
    }
  }

  // Starts this host's sshd when asked to; without it the agent still
  // serves, and its log says why.
  void StartSsh(ProcessLauncher *launcher) {
    if (options.ssh_port <= 0) return;
    SshServerOptions o;
    o.address = !options.ssh_address.empty()         ? options.ssh_address
                : !options.advertise_address.empty() ? options.advertise_address
                                                     : options.bind;
    o.port = options.ssh_port;
    o.dir = options.workdir + "/ssh";
    if (!options.worker_user.empty()) {
      const passwd *pw = worker_uid >= 0 ? ::getpwuid(worker_uid) : nullptr;
      if (pw == nullptr) {
        Log("ssh: no sshd: the worker user " + options.worker_user +
            " has no name to log in as");
        return;
      }
      o.only_user = pw->pw_name;
    }
    o.launcher = launcher;
    if (::geteuid() != 0 && o.port < 1024) {
      Log("ssh: no sshd on " + o.address + ":" + std::to_string(o.port) +
          ": the agent is not root (port 22 and logging users in need it)");
      return;
    }
    auto server = SshServer::Start(o);
    if (!server.ok()) {
      Log("ssh: no sshd: " + server.status().message());
      return;
    }
    ssh = std::move(*server);
    Log("ssh: sshd listening on " + ssh->address());
  }

  // ----- lifecycle -----

  void Shutdown() {
    std::call_once(shutdown_once, [this] {
      {
        std::lock_guard<std::mutex> lock(mu);
        shutting_down = true;
      }
      cv.notify_all();
      if (control_thread.joinable()) control_thread.join();
      if (ssh) ssh->Stop();
      table->Shutdown();
      server.stop();
      if (server_thread.joinable()) server_thread.join();
    });
  }
};

Result<std::unique_ptr<Agent>> Agent::Start(AgentOptions options) {
  if (options.controller_url.rfind("http://", 0) != 0) {
    return InvalidArgument("--controller: '" + options.controller_url +
                           "' is not an http://HOST:PORT address");
  }
  if (options.token.empty()) return InvalidArgument("the token is empty");
  if (options.workdir.empty()) return InvalidArgument("--workdir: empty");
  if (options.port < 0 || options.port > 65535) {
    return InvalidArgument("--port: " + std::to_string(options.port) +
                           " is not a port from 0 to 65535");
  }
  if (options.hostname.empty()) {
    char name[256] = {};
    ::gethostname(name, sizeof name - 1);
    options.hostname = name[0] ? name : "localhost";
  }
  std::error_code ec;
  std::filesystem::create_directories(options.workdir + "/workers", ec);
  if (ec) {
    return FailedPrecondition("--workdir: cannot create " + options.workdir +
                              ": " + ec.message());
  }
  options.workdir = std::filesystem::absolute(options.workdir).string();

  auto impl = std::make_unique<Impl>();
  Impl *self = impl.get();
  impl->options = std::move(options);
  ProcessLauncher *launcher = impl->options.launcher;
  if (launcher == nullptr) {
    impl->owned_launcher = NewProcessLauncher();
    launcher = impl->owned_launcher.get();
  }
  impl->table = std::make_unique<WorkerTable>(impl->options.workdir, launcher,
                                              impl->options.stop_grace);
  // No lease yet: workers start only once registration has granted one.
  ::unlink(impl->LeasePath().c_str());
  impl->table->set_lease_path(impl->LeasePath());
  if (!impl->options.worker_user.empty()) {
    ASSIGN_OR_RETURN(UserIds user,
                     ResolveUser("--worker-user", impl->options.worker_user));
    impl->table->set_worker_user(user.uid, user.gid);
    impl->worker_uid = user.uid;
    // Workers under another user may not read this process's memory.
    ::prctl(PR_SET_DUMPABLE, 0);
  }

  httplib::Server &server = impl->server;
  server.new_task_queue = [] {
    return new httplib::ThreadPool(kServerThreads);
  };
  // Uploads may be larger; every other call is held to kMaxBodyBytes by
  // Bounded() once its body is read.
  server.set_payload_max_length(kMaxUploadBytes);
  server.set_read_timeout(10, 0);
  server.set_write_timeout(10, 0);
  server.set_pre_routing_handler(
      [self](const httplib::Request &req, httplib::Response &res) {
        return RequireBearer(req, res, self->ApiCredential()) &&
                       !UploadTooLarge(req, res)
                   ? httplib::Server::HandlerResponse::Unhandled
                   : httplib::Server::HandlerResponse::Handled;
      });
  server.set_error_handler([](const httplib::Request &req,
                              httplib::Response &res) {
    if (!res.body.empty()) return;
    if (res.status == 404) {
      WriteError(res, 404, "NOT_FOUND", "no such call: " + req.path);
    } else if (res.status == 413) {
      WriteError(res, 413, "INVALID_ARGUMENT",
                 "the body is larger than " +
                     std::to_string(IsUploadPath(req.path) ? kMaxUploadBytes
                                                           : kMaxBodyBytes) +
                     " bytes");
    } else {
      WriteError(res, res.status, "INVALID_ARGUMENT", "bad request");
    }
  });
  using Req = httplib::Request;
  using Res = httplib::Response;
  // A JSON call's handler, refusing a body beyond kMaxBodyBytes.
  auto bounded = [self](void (Impl::*handler)(const Req &, Res &)) {
    return [self, handler](const Req &q, Res &r) {
      if (q.body.size() > kMaxBodyBytes) {
        WriteError(r, 413, "INVALID_ARGUMENT",
                   "the body is larger than " + std::to_string(kMaxBodyBytes) +
                       " bytes");
        return;
      }
      (self->*handler)(q, r);
    };
  };
  server.Get("/agent/v1/health", bounded(&Impl::Health));
  server.Get("/agent/v1/workers", bounded(&Impl::ListWorkers));
  server.Put(R"(/agent/v1/workers/([^/:]+))", bounded(&Impl::PutWorker));
  server.Post(R"(/agent/v1/workers/([^/:]+):stop)", bounded(&Impl::StopWorker));
  server.Post(R"(/agent/v1/workers/([^/:]+)/execs:stop)",
              bounded(&Impl::StopTaggedExecs));
  server.Put(R"(/agent/v1/workers/([^/:]+)/files)",
             [self](const Req &q, Res &r, const httplib::ContentReader &c) {
               self->PutFile(q, r, c);
             });
  server.Post("/agent/v1/exec", bounded(&Impl::StartExec));
  server.Get(R"(/agent/v1/exec/([^/:]+))", bounded(&Impl::ReadExec));
  server.Post(R"(/agent/v1/exec/([^/:]+):stop)", bounded(&Impl::StopExec));

  const std::string &bind = impl->options.bind;
  if (impl->options.port == 0) {
    impl->port = server.bind_to_any_port(bind.c_str());
  } else if (server.bind_to_port(bind.c_str(), impl->options.port)) {
    impl->port = impl->options.port;
  } else {
    impl->port = -1;
  }
  if (impl->port <= 0) {
    return Unavailable("cannot listen on " + bind + ":" +
                       std::to_string(impl->options.port));
  }
  impl->StartSsh(launcher);
  impl->server_thread =
      std::thread([self] { self->server.listen_after_bind(); });
  impl->control_thread = std::thread([self] { self->ControlLoop(); });
  return std::unique_ptr<Agent>(new Agent(std::move(impl)));
}

Agent::Agent(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Agent::~Agent() { Shutdown(); }

int Agent::port() const { return impl_->port; }
std::string Agent::address() const { return impl_->Address(); }

Status Agent::WaitRegistered() {
  std::unique_lock<std::mutex> lock(impl_->mu);
  const auto limit = impl_->options.register_timeout +
                     impl_->options.http_timeout + milliseconds(1000);
  bool decided = impl_->cv.wait_for(lock, limit, [this] {
    return impl_->registered || !impl_->registration_failure.ok() ||
           impl_->shutting_down;
  });
  if (impl_->registered) return OkStatus();
  if (!impl_->registration_failure.ok()) return impl_->registration_failure;
  if (!decided) return DeadlineExceeded("registration did not finish");
  return Unavailable("the agent is shutting down");
}

std::string Agent::host_id() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->host_id;
}

bool Agent::Failed() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return !impl_->registration_failure.ok();
}

nlohmann::json Agent::WorkerStatuses() { return impl_->table->Statuses(); }

void Agent::Shutdown() { impl_->Shutdown(); }

}  // namespace multislice::control
