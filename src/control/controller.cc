// The queued-resource controller (see controller.h and docs/control.md).
//
// One mutex guards the in-memory state (records, operations, hosts); every
// change is written to the Store inside that lock before the lock is
// released, so what the API answers has always been persisted. Calls to
// agents never run under the lock: the reconcile loop copies what a queued
// resource's current stage needs, a work thread makes the calls, and the
// results are applied only if the record's version has not moved meanwhile
// (otherwise the stage simply runs again: every step is idempotent).
#include "control/controller.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <filesystem>
#include <future>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <thread>

#include "control/console/console.h"
#include "control/http.h"
#include "control/scheduler.h"
#include "control/store.h"
#include "runtime/mesh/topology.h"

namespace multislice::control {

using nlohmann::json;

std::string WorkerName(const std::string& id, int node_index, int worker) {
  std::string safe;
  for (char c : id) {
    const char lower =
        static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    safe.push_back((std::isalnum(static_cast<unsigned char>(lower)) ||
                    lower == '.' || lower == '-')
                       ? lower
                       : '-');
  }
  return safe + "." + std::to_string(node_index) + "." + std::to_string(worker);
}

namespace {

int64_t WallMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}
int64_t SteadyMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

struct Host {
  std::string id;
  std::string hostname;
  std::string zone;
  std::string accelerator_type;
  std::string agent_address;  // HOST:PORT of its /agent/v1/ API
  std::string workdir;
  bool lost = false;
  std::string lost_reason;
  int64_t last_heartbeat = 0;  // steady ms; not persisted
  int64_t lost_at = 0;         // steady ms of the last loss; not persisted
  json workers = json::array();

  json ToStorage() const {
    return {{"id", id},
            {"hostname", hostname},
            {"zone", zone},
            {"acceleratorType", accelerator_type},
            {"agentAddress", agent_address},
            {"workdir", workdir},
            {"lost", lost},
            {"lostReason", lost_reason}};
  }
  static Host FromStorage(const json& j) {
    Host h;
    h.id = j.value("id", "");
    h.hostname = j.value("hostname", "");
    h.zone = j.value("zone", "");
    h.accelerator_type = j.value("acceleratorType", "");
    h.agent_address = j.value("agentAddress", "");
    h.workdir = j.value("workdir", "");
    h.lost = j.value("lost", false);
    h.lost_reason = j.value("lostReason", "");
    return h;
  }
  std::string ip() const {
    size_t colon = agent_address.rfind(':');
    return colon == std::string::npos ? agent_address
                                      : agent_address.substr(0, colon);
  }
};

bool IsLoopback(const std::string& ip) {
  return ip == "localhost" || ip.rfind("127.", 0) == 0 || ip == "::1";
}

// What a work thread needs to call one host's agent.
struct HostCall {
  std::string host_id;
  std::string agent_address;
};

struct StartTarget {
  int node = 0;
  int worker = 0;
  HostCall host;
  std::string name;
  json env;
};

struct WorkResult {
  bool complete = false;             // the stage's calls all succeeded
  std::set<int> started_nodes;       // start: nodes whose workers all run
  std::set<std::string> lost_hosts;  // agents that could not be reached
  std::string hard_error;            // an agent refused: the QR fails
  // start: the status each agent answered for a started worker (its pid),
  // known before the next heartbeat carries it.
  std::vector<std::pair<std::string, json>> started_workers;
};

}  // namespace

class Controller::Impl {
 public:
  explicit Impl(ControllerOptions options) : options_(std::move(options)) {}
  ~Impl() { Stop(); }

  Status Init();
  void Stop();
  int port() const { return port_; }
  std::vector<int> LastReportedWorkerGroups(const std::string& host) {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<int> groups;
    for (const auto& [id, h] : hosts_) {
      if (!Matches(id, h, host)) continue;
      for (const json& w : h.workers) {
        if (w.is_object() && w.value("state", "") == "RUNNING" &&
            w.contains("pid") && w["pid"].is_number_integer()) {
          groups.push_back(w["pid"].get<int>());
        }
      }
    }
    return groups;
  }
  static bool Matches(const std::string& id, const Host& h,
                      const std::string& host) {
    return id == host || h.agent_address == host || h.hostname == host ||
           (!h.workdir.empty() && h.workdir == host);
  }
  Status ReportHostLost(const std::string& host, const std::string& reason) {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [id, h] : hosts_) {
      if (Matches(id, h, host)) {
        MarkLost(id, reason);
        wake_ = true;
        cv_.notify_all();
        return OkStatus();
      }
    }
    return NotFound("no host " + host);
  }

 private:
  // --- HTTP ---
  void Route();
  using Handler =
      std::function<void(const httplib::Request&, httplib::Response&)>;
  Handler Authed(Handler h) {
    return [this, h](const httplib::Request& req, httplib::Response& res) {
      if (!RequireBearer(req, res, options_.token)) return;
      h(req, res);
    };
  }
  void HandleCreate(const httplib::Request& req, httplib::Response& res);
  void HandleGet(const httplib::Request& req, httplib::Response& res);
  void HandleList(const httplib::Request& req, httplib::Response& res);
  void HandleDelete(const httplib::Request& req, httplib::Response& res);
  void HandleReset(const httplib::Request& req, httplib::Response& res);
  // The end of a user's change to an existing queued resource (delete,
  // reset): persists `r` with its new operation, makes them current, wakes
  // the reconcile loop and answers the operation. Holds mu_.
  void CommitUserChange(QueuedResourceRecord& r, const OperationRecord& op,
                        const std::string& log_line, httplib::Response& res);
  void HandleOperation(const httplib::Request& req, httplib::Response& res);
  void HandleRegister(const httplib::Request& req, httplib::Response& res);
  void HandleHeartbeat(const httplib::Request& req, httplib::Response& res);
  void HandleWorkers(const httplib::Request& req, httplib::Response& res);
  void HandleFailHost(const httplib::Request& req, httplib::Response& res);
  void HandleHosts(const httplib::Request& req, httplib::Response& res);
  void HandleCapacity(const httplib::Request& req, httplib::Response& res);
  void HandleQrOperations(const httplib::Request& req, httplib::Response& res);
  void HandleLogs(const httplib::Request& req, httplib::Response& res);

  // --- state (all under mu_) ---
  // Also appends r's state to its history when it changed.
  Status Persist(QueuedResourceRecord& r,
                 std::vector<OperationRecord> ops = {});
  Status PersistHost(const Host& h);
  OperationRecord NewOperation(const QueuedResourceRecord& r,
                               const std::string& api, const std::string& verb);
  void FinishOps(QueuedResourceRecord& r, const json& response,
                 std::vector<OperationRecord>* changed);
  void Changed(QueuedResourceRecord& r) { ++versions_[r.name]; }
  void MarkLost(const std::string& host_id, const std::string& reason);
  std::map<std::string, std::string> HostOwners() const;
  QueuedResourceRecord* FindById(const std::string& id);
  void Log(const std::string& line) {
    std::fprintf(stderr, "controller: %s\n", line.c_str());
  }

  // --- reconcile ---
  void Loop();
  void Tick();
  void Schedule(int64_t now);
  void LaunchWork(QueuedResourceRecord& r);
  WorkResult RunStart(const std::string& token,
                      const std::vector<StartTarget>& targets, int attempt,
                      const std::string& script, int nodes);
  WorkResult RunStop(const std::string& token,
                     const std::vector<HostCall>& hosts,
                     const std::string& worker_prefix);
  void ApplyWork(const std::string& name, uint64_t version,
                 const std::string& stage, int attempt,
                 const WorkResult& result);
  Result<std::string> Coordinator(const QueuedResourceRecord& r);
  Result<std::string> EnsureRedis();

  ControllerOptions options_;
  std::unique_ptr<Store> store_;
  httplib::Server server_;
  int port_ = 0;
  int listen_fd_ = -1;
  std::thread server_thread_;
  std::thread loop_thread_;

  std::mutex mu_;
  std::condition_variable cv_;
  bool wake_ = false;
  bool stopping_ = false;
  std::map<std::string, QueuedResourceRecord> records_;  // by name
  std::map<std::string, uint64_t> versions_;
  std::map<std::string, OperationRecord> ops_;
  std::map<std::string, Host> hosts_;
  int64_t next_seq_ = 1;
  int next_host_ = 1;
  std::set<std::string> busy_;  // records with a work thread running
  struct Work {
    std::thread thread;
    std::shared_ptr<std::atomic<bool>> done;
  };
  std::vector<Work> work_;
  pid_t redis_pid_ = -1;
  int redis_port_ = 0;
  std::mt19937_64 rng_{std::random_device{}()};
};

// ---------------------------------------------------------------- startup

Status Controller::Impl::Init() {
  std::error_code ec;
  std::filesystem::create_directories(options_.data_dir + "/stores", ec);
  if (ec) {
    return Internal("data dir " + options_.data_dir +
                    ": cannot create it: " + ec.message());
  }
  options_.data_dir = std::filesystem::absolute(options_.data_dir).string();
  ASSIGN_OR_RETURN(store_, Store::Open(options_.data_dir + "/state.db"));
  ASSIGN_OR_RETURN(StoreSnapshot snapshot, store_->Load());
  const int64_t now = SteadyMs();
  for (QueuedResourceRecord& r : snapshot.queued_resources) {
    next_seq_ = std::max(next_seq_, r.seq + 1);
    records_[r.name] = std::move(r);
  }
  for (OperationRecord& op : snapshot.operations) ops_[op.name] = op;
  for (const json& j : snapshot.hosts) {
    Host h = Host::FromStorage(j);
    h.last_heartbeat = now;  // a grace period of one timeout after restart
    int n = std::atoi(h.id.c_str() + (h.id.rfind("host-", 0) == 0 ? 5 : 0));
    next_host_ = std::max(next_host_, n + 1);
    hosts_[h.id] = h;
  }
  if (!records_.empty()) {
    Log("restored " + std::to_string(records_.size()) + " queued resources, " +
        std::to_string(ops_.size()) + " operations, " +
        std::to_string(hosts_.size()) + " hosts");
  }
  Route();
  if (options_.port == 0) {
    port_ = server_.bind_to_any_port(options_.bind_address);
  } else {
    port_ = server_.bind_to_port(options_.bind_address, options_.port)
                ? options_.port
                : -1;
  }
  if (port_ <= 0) {
    return Unavailable("cannot listen on " + options_.bind_address + ":" +
                       std::to_string(options_.port));
  }
  if (listen_fd_ >= 0) ::listen(listen_fd_, 1024);
  server_thread_ = std::thread([this] { server_.listen_after_bind(); });
  loop_thread_ = std::thread([this] { Loop(); });
  return OkStatus();
}

void Controller::Impl::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return;
    stopping_ = true;
  }
  cv_.notify_all();
  server_.stop();
  if (server_thread_.joinable()) server_thread_.join();
  if (loop_thread_.joinable()) loop_thread_.join();
  for (Work& w : work_) {
    if (w.thread.joinable()) w.thread.join();
  }
  work_.clear();
  if (redis_pid_ > 0) {
    ::kill(redis_pid_, SIGTERM);
    ::waitpid(redis_pid_, nullptr, 0);
    redis_pid_ = -1;
  }
}

// ---------------------------------------------------------------- routes

void Controller::Impl::Route() {
  server_.new_task_queue = [n = options_.http_threads] {
    return new httplib::ThreadPool(static_cast<size_t>(n));
  };
  server_.set_payload_max_length(kMaxBodyBytes);
  // Small JSON answers: no Nagle delay behind the client's delayed ACK.
  server_.set_tcp_nodelay(true);
  // Remember the listening socket, to deepen its backlog after bind (the
  // library listens with a backlog of 5, which drops bursts of connects).
  // SO_REUSEADDR only: SO_REUSEPORT would let a stale socket share the port.
  server_.set_socket_options([this](int sock) {
    int yes = 1;
    ::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
    listen_fd_ = sock;
  });
  server_.set_keep_alive_max_count(1000);
  server_.set_read_timeout(10, 0);
  server_.set_error_handler(
      [](const httplib::Request&, httplib::Response& res) {
        if (!res.body.empty()) return;
        if (res.status == 413) {
          WriteError(res, 413, "INVALID_ARGUMENT",
                     "request body larger than " +
                         std::to_string(kMaxBodyBytes) + " bytes");
        } else if (res.status == 404) {
          WriteError(res, 404, "NOT_FOUND", "no such API path");
        } else {
          WriteError(res, res.status, "", "HTTP " + std::to_string(res.status));
        }
      });
  server_.set_exception_handler([](const httplib::Request&,
                                   httplib::Response& res,
                                   std::exception_ptr ep) {
    std::string what = "internal error";
    try {
      std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    WriteError(res, 500, "INTERNAL", what);
  });
  const std::string base =
      R"(/(v2alpha1|v2)/projects/([^/]+)/locations/([^/]+))";
  const std::string qrs = base + "/queuedResources";
  const std::string qr = qrs + R"(/([^/:]+))";
  using R = const httplib::Request&;
  using W = httplib::Response&;
  server_.Post(qrs, Authed([this](R q, W s) { HandleCreate(q, s); }));
  server_.Get(qrs, Authed([this](R q, W s) { HandleList(q, s); }));
  server_.Get(qr, Authed([this](R q, W s) { HandleGet(q, s); }));
  server_.Delete(qr, Authed([this](R q, W s) { HandleDelete(q, s); }));
  server_.Post(qr + ":reset", Authed([this](R q, W s) { HandleReset(q, s); }));
  server_.Get(base + R"(/operations/([^/]+))",
              Authed([this](R q, W s) { HandleOperation(q, s); }));
  server_.Post("/internal/v1/hosts:register",
               Authed([this](R q, W s) { HandleRegister(q, s); }));
  server_.Post(R"(/internal/v1/hosts/([^/:]+):heartbeat)",
               Authed([this](R q, W s) { HandleHeartbeat(q, s); }));
  server_.Post(R"(/internal/v1/hosts/([^/:]+):fail)",
               Authed([this](R q, W s) { HandleFailHost(q, s); }));
  server_.Get("/internal/v1/hosts",
              Authed([this](R q, W s) { HandleHosts(q, s); }));
  server_.Get(R"(/internal/v1/queuedResources/([^/]+)/workers)",
              Authed([this](R q, W s) { HandleWorkers(q, s); }));
  server_.Get("/internal/v1/capacity",
              Authed([this](R q, W s) { HandleCapacity(q, s); }));
  server_.Get(R"(/internal/v1/queuedResources/([^/]+)/operations)",
              Authed([this](R q, W s) { HandleQrOperations(q, s); }));
  server_.Get(R"(/internal/v1/queuedResources/([^/]+)/logs)",
              Authed([this](R q, W s) { HandleLogs(q, s); }));
  // The console's static files need no token (they hold no data); every
  // API call they make carries it.
  MountConsole(server_);
}

std::string QrName(const std::string& project, const std::string& zone,
                   const std::string& id) {
  return "projects/" + project + "/locations/" + zone + "/queuedResources/" +
         id;
}

// ---------------------------------------------------------------- API

void Controller::Impl::HandleCreate(const httplib::Request& req,
                                    httplib::Response& res) {
  const std::string api = req.matches[1], project = req.matches[2],
                    zone = req.matches[3];
  if (zone == "-") {
    WriteError(res, 400, "INVALID_ARGUMENT",
               "parent: a queued resource is created in one zone, not '-'");
    return;
  }
  const std::string id = req.get_param_value("queued_resource_id");
  if (id.empty()) {
    WriteError(res, 400, "INVALID_ARGUMENT", "queued_resource_id: is required");
    return;
  }
  if (!ValidResourceId(id) || id.size() > 63) {
    WriteError(res, 400, "INVALID_ARGUMENT",
               "queued_resource_id: '" + id.substr(0, 80) +
                   "' does not match ^[A-Za-z0-9_.~+%-]+$ (at most 63 "
                   "characters)");
    return;
  }
  Result<json> body = ParseJsonText(req.body);
  if (!body.ok()) {
    WriteError(res, 400, "INVALID_ARGUMENT", body.status().message());
    return;
  }
  Result<QueuedResourceSpec> spec = ParseQueuedResource(*body, id, WallMs());
  if (!spec.ok()) {
    WriteError(res, 400, "INVALID_ARGUMENT", spec.status().message());
    return;
  }
  Result<mesh::AcceleratorType> type =
      mesh::ParseAcceleratorType(spec->accelerator_type);
  QueuedResourceRecord r;
  r.name = QrName(project, zone, id);
  r.project = project;
  r.zone = zone;
  r.id = id;
  r.create_ms = WallMs();
  r.spec = std::move(*spec);
  r.hosts_per_slice = type->hosts_per_slice();
  r.chips_per_slice = type->num_chips;
  r.state = QrState::kAccepted;
  for (const std::string& node_id : r.spec.node_ids) {
    NodeRecord n;
    n.node_id = node_id;
    r.nodes.push_back(n);
  }
  std::unique_lock<std::mutex> lock(mu_);
  if (records_.count(r.name)) {
    WriteError(res, 409, "ALREADY_EXISTS",
               "queued resource " + r.name + " already exists");
    return;
  }
  r.seq = next_seq_++;
  OperationRecord op = NewOperation(r, api, "create");
  r.waiting_ops.push_back(op.name);
  Status s = Persist(r, {op});
  if (!s.ok()) {
    WriteError(res, 500, "INTERNAL", s.message());
    return;
  }
  records_[r.name] = r;
  ops_[op.name] = op;
  Log(r.id + ": ACCEPTED (" + std::to_string(r.nodes.size()) + " x " +
      r.spec.accelerator_type + ", " + TierName(r.spec.tier) + ")");
  wake_ = true;
  cv_.notify_all();
  WriteJson(res, 200, op.ToApi());
}

void Controller::Impl::HandleGet(const httplib::Request& req,
                                 httplib::Response& res) {
  const std::string name =
      QrName(req.matches[2], req.matches[3], req.matches[4]);
  std::lock_guard<std::mutex> lock(mu_);
  auto it = records_.find(name);
  if (it == records_.end()) {
    WriteError(res, 404, "NOT_FOUND", "queued resource " + name + " not found");
    return;
  }
  WriteJson(res, 200, it->second.ToApi());
}

void Controller::Impl::HandleList(const httplib::Request& req,
                                  httplib::Response& res) {
  const std::string project = req.matches[2], zone = req.matches[3];
  int page_size = 100;
  if (req.has_param("pageSize")) {
    const std::string text = req.get_param_value("pageSize");
    char* end = nullptr;
    long v = std::strtol(text.c_str(), &end, 10);
    if (text.empty() || *end != '\0' || v < 0 || v > 1000) {
      WriteError(res, 400, "INVALID_ARGUMENT",
                 "pageSize: '" + text.substr(0, 40) +
                     "' is not an integer from 0 to 1000");
      return;
    }
    if (v > 0) page_size = static_cast<int>(v);
  }
  int64_t after = 0;
  if (req.has_param("pageToken") && !req.get_param_value("pageToken").empty()) {
    const std::string text = req.get_param_value("pageToken");
    char* end = nullptr;
    long long v = std::strtoll(text.c_str(), &end, 10);
    if (*end != '\0' || v < 0) {
      WriteError(res, 400, "INVALID_ARGUMENT",
                 "pageToken: '" + text.substr(0, 40) +
                     "' is not a token from a previous list");
      return;
    }
    after = v;
  }
  std::vector<const QueuedResourceRecord*> matching;
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [name, r] : records_) {
    if (r.project == project && (zone == "-" || r.zone == zone) &&
        r.seq > after) {
      matching.push_back(&r);
    }
  }
  std::sort(matching.begin(), matching.end(),
            [](const auto* a, const auto* b) { return a->seq < b->seq; });
  json out = {{"queuedResources", json::array()}};
  for (size_t i = 0; i < matching.size() && static_cast<int>(i) < page_size;
       ++i) {
    out["queuedResources"].push_back(matching[i]->ToApi());
  }
  if (static_cast<int>(matching.size()) > page_size) {
    out["nextPageToken"] = std::to_string(matching[page_size - 1]->seq);
  }
  WriteJson(res, 200, out);
}

void Controller::Impl::HandleDelete(const httplib::Request& req,
                                    httplib::Response& res) {
  const std::string api = req.matches[1];
  const std::string name =
      QrName(req.matches[2], req.matches[3], req.matches[4]);
  const std::string force_text = req.get_param_value("force");
  const bool force = force_text == "true" || force_text == "1";
  std::lock_guard<std::mutex> lock(mu_);
  auto it = records_.find(name);
  if (it == records_.end()) {
    WriteError(res, 404, "NOT_FOUND", "queued resource " + name + " not found");
    return;
  }
  QueuedResourceRecord r = it->second;
  const bool deletable =
      r.state == QrState::kAccepted || r.state == QrState::kFailed ||
      r.state == QrState::kSuspended || r.state == QrState::kDeleting;
  if (!force && !deletable) {
    WriteError(res, 400, "FAILED_PRECONDITION",
               "queued resource " + name + " is " + StateName(r.state) +
                   ": without force only ACCEPTED, FAILED or SUSPENDED queued "
                   "resources are deleted (pass force=true to delete its "
                   "nodes first)");
    return;
  }
  OperationRecord op = NewOperation(r, api, "delete");
  r.waiting_ops.push_back(op.name);
  r.delete_requested = true;
  r.state = QrState::kDeleting;
  r.state_initiator = "USER";
  r.stage = "stop";
  for (NodeRecord& n : r.nodes) n.state = "DELETING";
  CommitUserChange(r, op, r.id + ": DELETING", res);
}

void Controller::Impl::HandleReset(const httplib::Request& req,
                                   httplib::Response& res) {
  const std::string api = req.matches[1];
  const std::string name =
      QrName(req.matches[2], req.matches[3], req.matches[4]);
  std::lock_guard<std::mutex> lock(mu_);
  auto it = records_.find(name);
  if (it == records_.end()) {
    WriteError(res, 404, "NOT_FOUND", "queued resource " + name + " not found");
    return;
  }
  QueuedResourceRecord r = it->second;
  if (r.state != QrState::kActive) {
    WriteError(res, 400, "FAILED_PRECONDITION",
               "queued resource " + name + " is " + StateName(r.state) +
                   ": only an ACTIVE queued resource can be reset");
    return;
  }
  OperationRecord op = NewOperation(r, api, "reset");
  r.waiting_ops.push_back(op.name);
  r.state = QrState::kProvisioning;
  r.state_initiator = "USER";
  r.stage = "stop";
  for (NodeRecord& n : r.nodes) {
    n.state = "RESTARTING";
    n.started = false;
  }
  CommitUserChange(r, op, r.id + ": reset requested", res);
}

void Controller::Impl::CommitUserChange(QueuedResourceRecord& r,
                                        const OperationRecord& op,
                                        const std::string& log_line,
                                        httplib::Response& res) {
  Status s = Persist(r, {op});
  if (!s.ok()) {
    WriteError(res, 500, "INTERNAL", s.message());
    return;
  }
  records_[r.name] = r;
  Changed(records_[r.name]);
  ops_[op.name] = op;
  Log(log_line);
  wake_ = true;
  cv_.notify_all();
  WriteJson(res, 200, op.ToApi());
}

void Controller::Impl::HandleOperation(const httplib::Request& req,
                                       httplib::Response& res) {
  const std::string name = "projects/" + std::string(req.matches[2]) +
                           "/locations/" + std::string(req.matches[3]) +
                           "/operations/" + std::string(req.matches[4]);
  std::lock_guard<std::mutex> lock(mu_);
  auto it = ops_.find(name);
  if (it == ops_.end()) {
    WriteError(res, 404, "NOT_FOUND", "operation " + name + " not found");
    return;
  }
  WriteJson(res, 200, it->second.ToApi());
}

// ---------------------------------------------------------------- agents

void Controller::Impl::HandleRegister(const httplib::Request& req,
                                      httplib::Response& res) {
  Result<json> body = ParseJsonText(req.body);
  if (!body.ok() || !body->is_object()) {
    WriteError(
        res, 400, "INVALID_ARGUMENT",
        body.ok() ? "body: expected an object" : body.status().message());
    return;
  }
  Host h;
  for (auto [key, target] :
       std::initializer_list<std::pair<const char*, std::string*>>{
           {"hostname", &h.hostname},
           {"zone", &h.zone},
           {"acceleratorType", &h.accelerator_type},
           {"agentAddress", &h.agent_address},
           {"workdir", &h.workdir}}) {
    if (!body->contains(key) || !(*body)[key].is_string() ||
        (*body)[key].get<std::string>().size() > kMaxStringBytes) {
      WriteError(res, 400, "INVALID_ARGUMENT",
                 std::string(key) + ": expected a string");
      return;
    }
    *target = (*body)[key].get<std::string>();
  }
  const size_t colon = h.agent_address.rfind(':');
  if (colon == std::string::npos || colon == 0 ||
      std::atoi(h.agent_address.c_str() + colon + 1) <= 0) {
    WriteError(res, 400, "INVALID_ARGUMENT",
               "agentAddress: '" + h.agent_address + "' is not HOST:PORT");
    return;
  }
  Result<mesh::AcceleratorType> type =
      mesh::ParseAcceleratorType(h.accelerator_type);
  if (!type.ok()) {
    WriteError(res, 400, "INVALID_ARGUMENT",
               "acceleratorType: " + type.status().message());
    return;
  }
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [id, known] : hosts_) {
    if (known.agent_address == h.agent_address) {
      h.id = id;
      h.lost_at = known.lost_at;
    }
  }
  if (h.id.empty()) h.id = "host-" + std::to_string(next_host_++);
  h.last_heartbeat = SteadyMs();
  Status s = PersistHost(h);
  if (!s.ok()) {
    WriteError(res, 500, "INTERNAL", s.message());
    return;
  }
  hosts_[h.id] = h;
  Log(h.id + ": registered " + h.accelerator_type + " at " + h.agent_address);
  wake_ = true;
  cv_.notify_all();
  WriteJson(res, 200,
            {{"hostId", h.id},
             {"heartbeatIntervalMs", options_.heartbeat_interval.count()}});
}

void Controller::Impl::HandleHeartbeat(const httplib::Request& req,
                                       httplib::Response& res) {
  const std::string id = req.matches[1];
  json body = json::parse(req.body, nullptr, false);
  std::lock_guard<std::mutex> lock(mu_);
  auto it = hosts_.find(id);
  if (it == hosts_.end() || it->second.lost) {
    WriteError(res, 404, "NOT_FOUND",
               "host " + id + " is not registered (register again)");
    return;
  }
  it->second.last_heartbeat = SteadyMs();
  if (body.is_object() && body.contains("workers") &&
      body["workers"].is_array()) {
    it->second.workers = body["workers"];
  }
  WriteJson(res, 200, json::object());
}

void Controller::Impl::HandleFailHost(const httplib::Request& req,
                                      httplib::Response& res) {
  const std::string id = req.matches[1];
  std::lock_guard<std::mutex> lock(mu_);
  auto it = hosts_.find(id);
  if (it == hosts_.end()) {
    // Accept the agent address or hostname too.
    for (auto h = hosts_.begin(); h != hosts_.end(); ++h) {
      if (h->second.agent_address == id || h->second.hostname == id) it = h;
    }
  }
  if (it == hosts_.end()) {
    WriteError(res, 404, "NOT_FOUND", "host " + id + " not found");
    return;
  }
  const std::string owner = HostOwners().count(it->first)
                                ? HostOwners().at(it->first)
                                : std::string();
  MarkLost(it->first, "failed by admin fail-host");
  wake_ = true;
  cv_.notify_all();
  WriteJson(res, 200,
            {{"hostId", it->first}, {"lost", true}, {"queuedResource", owner}});
}

void Controller::Impl::HandleHosts(const httplib::Request&,
                                   httplib::Response& res) {
  std::lock_guard<std::mutex> lock(mu_);
  std::map<std::string, std::string> owners = HostOwners();
  json out = {{"hosts", json::array()}};
  for (const auto& [id, h] : hosts_) {
    json j = h.ToStorage();
    j["queuedResource"] = owners.count(id) ? owners[id] : "";
    j["workers"] = h.workers;
    out["hosts"].push_back(j);
  }
  WriteJson(res, 200, out);
}

void Controller::Impl::HandleCapacity(const httplib::Request&,
                                      httplib::Response& res) {
  std::lock_guard<std::mutex> lock(mu_);
  std::map<std::string, std::string> owners = HostOwners();
  const int64_t steady = SteadyMs();
  json hosts = json::array();
  for (const auto& [id, h] : hosts_) {
    const bool used = owners.count(id) > 0;
    hosts.push_back({{"id", id},
                     {"hostname", h.hostname},
                     {"zone", h.zone},
                     {"acceleratorType", h.accelerator_type},
                     {"agentAddress", h.agent_address},
                     {"state", h.lost ? "LOST" : (used ? "USED" : "FREE")},
                     {"lostReason", h.lost_reason},
                     {"queuedResource", used ? owners[id] : ""},
                     {"heartbeatAgeMs", steady - h.last_heartbeat}});
  }
  int64_t held[kNumTiers] = {0, 0, 0, 0};
  int64_t idle[kNumTiers] = {0, 0, 0, 0};  // FAILED or SUSPENDED
  int idle_count[kNumTiers] = {0, 0, 0, 0};
  for (const auto& [name, r] : records_) {
    if (!r.holds_quota) continue;
    const int t = static_cast<int>(r.spec.tier);
    held[t] += r.total_chips();
    if (r.state == QrState::kFailed || r.state == QrState::kSuspended) {
      idle[t] += r.total_chips();
      ++idle_count[t];
    }
  }
  json tiers = json::array();
  for (int t = 0; t < kNumTiers; ++t) {
    tiers.push_back({{"tier", TierName(static_cast<Tier>(t))},
                     {"usedChips", held[t]},
                     {"quotaChips", options_.quota_chips[t]},
                     {"heldByFailedOrSuspendedChips", idle[t]},
                     {"failedOrSuspended", idle_count[t]}});
  }
  WriteJson(res, 200, {{"hosts", hosts}, {"tiers", tiers}});
}

void Controller::Impl::HandleQrOperations(const httplib::Request& req,
                                          httplib::Response& res) {
  const std::string id = req.matches[1];
  std::lock_guard<std::mutex> lock(mu_);
  QueuedResourceRecord* r = FindById(id);
  if (!r) {
    WriteError(res, 404, "NOT_FOUND", "queued resource " + id + " not found");
    return;
  }
  std::vector<const OperationRecord*> matching;
  for (const auto& [name, op] : ops_) {
    if (op.target == r->name) matching.push_back(&op);
  }
  std::sort(matching.begin(), matching.end(), [](const auto* a, const auto* b) {
    return a->create_ms < b->create_ms;
  });
  json out = json::array();
  for (const OperationRecord* op : matching) out.push_back(op->ToApi());
  WriteJson(res, 200, {{"operations", out}});
}

void Controller::Impl::HandleWorkers(const httplib::Request& req,
                                     httplib::Response& res) {
  const std::string id = req.matches[1];
  std::lock_guard<std::mutex> lock(mu_);
  QueuedResourceRecord* r = FindById(id);
  if (!r) {
    WriteError(res, 404, "NOT_FOUND", "queued resource " + id + " not found");
    return;
  }
  json workers = json::array();
  for (size_t i = 0; i < r->nodes.size(); ++i) {
    const NodeRecord& n = r->nodes[i];
    for (size_t w = 0; w < n.hosts.size(); ++w) {
      const Host& h = hosts_[n.hosts[w]];
      const std::string name =
          WorkerName(r->id, static_cast<int>(i), static_cast<int>(w));
      workers.push_back({{"node", n.node_id},
                         {"nodeIndex", i},
                         {"worker", w},
                         {"name", name},
                         {"hostId", h.id},
                         {"agentAddress", h.agent_address},
                         {"directory", h.workdir + "/workers/" + name}});
    }
  }
  WriteJson(res, 200, {{"workers", workers}, {"attempt", r->attempt}});
}

// ---------------------------------------------------------------- state

Status Controller::Impl::Persist(QueuedResourceRecord& r,
                                 std::vector<OperationRecord> ops) {
  // Every transition is persisted here, so this is where the history sees
  // every state change.
  r.RecordStateChange(WallMs());
  StoreChange change;
  change.put_queued_resources.push_back(r);
  change.put_operations = std::move(ops);
  return store_->Apply(change);
}

Status Controller::Impl::PersistHost(const Host& h) {
  StoreChange change;
  change.put_hosts.push_back(h.ToStorage());
  return store_->Apply(change);
}

OperationRecord Controller::Impl::NewOperation(const QueuedResourceRecord& r,
                                               const std::string& api,
                                               const std::string& verb) {
  char suffix[32];
  std::snprintf(suffix, sizeof(suffix), "%016llx",
                static_cast<unsigned long long>(rng_()));
  OperationRecord op;
  op.name = "projects/" + r.project + "/locations/" + r.zone +
            "/operations/operation-" + suffix;
  op.target = r.name;
  op.verb = verb;
  op.api_version = api;
  op.create_ms = WallMs();
  return op;
}

void Controller::Impl::FinishOps(QueuedResourceRecord& r, const json& response,
                                 std::vector<OperationRecord>* changed) {
  for (const std::string& name : r.waiting_ops) {
    auto it = ops_.find(name);
    if (it == ops_.end() || it->second.done) continue;
    OperationRecord op = it->second;
    op.done = true;
    op.end_ms = WallMs();
    if (op.verb == "delete") {
      op.response = {{"@type", "type.googleapis.com/google.protobuf.Empty"}};
    } else {
      op.response = response;
      op.response["@type"] =
          "type.googleapis.com/google.cloud.tpu.v2alpha1.QueuedResource";
    }
    changed->push_back(op);
  }
  r.waiting_ops.clear();
}

std::map<std::string, std::string> Controller::Impl::HostOwners() const {
  std::map<std::string, std::string> owners;
  for (const auto& [name, r] : records_) {
    for (const NodeRecord& n : r.nodes) {
      for (const std::string& h : n.hosts) owners[h] = name;
    }
    for (const std::string& h : r.retired_hosts) owners[h] = name;
  }
  return owners;
}

QueuedResourceRecord* Controller::Impl::FindById(const std::string& id) {
  for (auto& [name, r] : records_) {
    if (r.id == id || r.name == id) return &r;
  }
  return nullptr;
}

void Controller::Impl::MarkLost(const std::string& host_id,
                                const std::string& reason) {
  auto hit = hosts_.find(host_id);
  if (hit == hosts_.end()) return;
  Host& host = hit->second;
  if (!host.lost) {
    host.lost = true;
    host.lost_at = SteadyMs();
    host.lost_reason = reason;
    PersistHost(host).ok();
    Log(host_id + ": lost (" + reason + ")");
  }
  for (auto& [name, r] : records_) {
    int lost_node = -1;
    for (size_t i = 0; i < r.nodes.size(); ++i) {
      const auto& hs = r.nodes[i].hosts;
      if (std::find(hs.begin(), hs.end(), host_id) != hs.end()) {
        lost_node = static_cast<int>(i);
      }
    }
    if (lost_node < 0) continue;
    // The whole slice is replaced; its hosts stay with this queued resource
    // (retired) until its workers on them are stopped.
    NodeRecord& n = r.nodes[lost_node];
    for (const std::string& h : n.hosts) r.retired_hosts.push_back(h);
    n.hosts.clear();
    n.started = false;
    n.health = "TIMEOUT";
    const bool repairing = r.state == QrState::kActive ||
                           r.state == QrState::kProvisioning ||
                           r.state == QrState::kWaitingForResources;
    if (repairing) {
      n.state = "REPAIRING";
      for (NodeRecord& other : r.nodes) {
        other.started = false;
        if (&other != &n && other.state != "REPAIRING") {
          other.state = "RESTARTING";
        }
      }
      r.state = QrState::kProvisioning;
      r.state_initiator = "SERVICE";
      Log(r.id + ": node " + n.node_id + " REPAIRING (" + host_id + " lost)");
    }
    r.stage = "stop";
    Changed(r);
    Status s = Persist(r);
    if (!s.ok()) Log("cannot persist " + r.id + ": " + s.message());
  }
}

// ---------------------------------------------------------------- loop

void Controller::Impl::Loop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stopping_) {
    Tick();
    cv_.wait_for(lock, options_.reconcile_interval,
                 [this] { return wake_ || stopping_; });
    wake_ = false;
  }
}

void Controller::Impl::Tick() {
  // Reap finished work threads.
  for (auto it = work_.begin(); it != work_.end();) {
    if (it->done->load()) {
      it->thread.join();
      it = work_.erase(it);
    } else {
      ++it;
    }
  }
  const int64_t steady = SteadyMs();
  for (auto& [id, h] : hosts_) {
    if (!h.lost &&
        steady - h.last_heartbeat > options_.heartbeat_timeout.count()) {
      MarkLost(id, "no heartbeat for " +
                       std::to_string(steady - h.last_heartbeat) + " ms");
    }
  }
  const int64_t now = WallMs();
  for (auto& [name, r] : records_) {
    const bool waiting = (r.state == QrState::kAccepted ||
                          r.state == QrState::kWaitingForResources) &&
                         !r.holds_quota && !r.delete_requested;
    if (!waiting) continue;
    std::vector<OperationRecord> ops;
    if (r.spec.valid_until_ms > 0 && now >= r.spec.valid_until_ms) {
      r.state = QrState::kFailed;
      r.state_initiator = "SERVICE";
      r.failed_error = "the valid_until deadline " +
                       FormatTimestamp(r.spec.valid_until_ms) +
                       " passed before resources were available";
      FinishOps(r, r.ToApi(), &ops);
    } else if (r.state == QrState::kAccepted && now >= r.spec.valid_after_ms) {
      r.state = QrState::kWaitingForResources;
      FinishOps(r, r.ToApi(), &ops);
    } else {
      continue;
    }
    Changed(r);
    Status s = Persist(r, ops);
    if (!s.ok()) Log("cannot persist " + r.id + ": " + s.message());
    for (const OperationRecord& op : ops) ops_[op.name] = op;
    Log(r.id + ": " + StateName(r.state));
  }
  Schedule(now);
  // By name: LaunchWork may complete (and erase) a record at once.
  std::vector<std::string> names;
  for (const auto& [name, r] : records_) {
    if (!r.stage.empty() && !busy_.count(name)) names.push_back(name);
  }
  for (const std::string& name : names) {
    auto it = records_.find(name);
    if (it != records_.end()) LaunchWork(it->second);
  }
}

void Controller::Impl::Schedule(int64_t) {
  SchedulerInput in;
  std::map<std::string, std::string> owners = HostOwners();
  // Hosts lost in the last minute (and back since) come last: a repair
  // should not land on the host that just failed.
  const int64_t steady = SteadyMs();
  for (int pass = 0; pass < 2; ++pass) {
    for (const auto& [id, h] : hosts_) {
      const bool recent = h.lost_at > 0 && steady - h.lost_at < 60000;
      if (!h.lost && !owners.count(id) && recent == (pass == 1)) {
        in.free_hosts.push_back({id, h.accelerator_type, h.zone});
      }
    }
  }
  for (int t = 0; t < kNumTiers; ++t) {
    in.quota_chips[t] = options_.quota_chips[t];
  }
  for (const auto& [name, r] : records_) {
    if (r.delete_requested) continue;
    SchedRequest req{r.name,
                     r.seq,
                     r.spec.tier,
                     r.spec.accelerator_type,
                     r.hosts_per_slice,
                     r.chips_per_slice,
                     0,
                     false,
                     r.zone};
    if (r.state == QrState::kWaitingForResources && !r.holds_quota) {
      req.slices = static_cast<int>(r.nodes.size());
      in.requests.push_back(req);
    } else if (r.holds_quota && (r.state == QrState::kProvisioning ||
                                 r.state == QrState::kWaitingForResources)) {
      int missing = 0;
      for (const NodeRecord& n : r.nodes) missing += n.hosts.empty();
      if (missing > 0) {
        req.slices = missing;
        req.is_repair = true;
        in.requests.push_back(req);
      }
    }
    if (r.holds_quota) {
      SchedHolder h;
      h.name = r.name;
      h.seq = r.seq;
      h.tier = r.spec.tier;
      h.accelerator_type = r.spec.accelerator_type;
      h.zone = r.zone;
      h.chips = r.total_chips();
      h.holds_quota = true;
      h.preemptible =
          r.state == QrState::kActive && r.stage.empty() &&
          (r.spec.tier == Tier::kSpot || r.spec.tier == Tier::kBestEffort);
      h.suspending = r.state == QrState::kSuspending;
      for (const NodeRecord& n : r.nodes) {
        h.hosts.insert(h.hosts.end(), n.hosts.begin(), n.hosts.end());
      }
      in.holders.push_back(h);
    }
  }
  SchedulerDecision d = control::Schedule(in);
  std::set<std::string> granted;
  for (const Grant& g : d.grants) {
    QueuedResourceRecord& r = records_[g.name];
    granted.insert(g.name);
    size_t next = 0;
    for (NodeRecord& n : r.nodes) {
      if (n.hosts.empty() && next < g.slice_hosts.size()) {
        n.hosts = g.slice_hosts[next++];
        n.health = "HEALTHY";
      }
    }
    if (!r.holds_quota) {
      r.holds_quota = true;
      r.attempt = 1;
      r.stage = "start";
      Log(r.id + ": PROVISIONING attempt 1");
    } else {
      Log(r.id + ": replacement hosts granted");
    }
    r.state = QrState::kProvisioning;
    Changed(r);
    Status s = Persist(r);
    if (!s.ok()) Log("cannot persist " + r.id + ": " + s.message());
  }
  // Repairs without a grant wait for resources.
  for (const SchedRequest& req : in.requests) {
    if (!req.is_repair || granted.count(req.name)) continue;
    QueuedResourceRecord& r = records_[req.name];
    if (r.state != QrState::kWaitingForResources) {
      r.state = QrState::kWaitingForResources;
      Changed(r);
      Persist(r).ok();
      Log(r.id + ": WAITING_FOR_RESOURCES for a replacement slice");
    }
  }
  for (const std::string& name : d.preempted) {
    QueuedResourceRecord& r = records_[name];
    r.state = QrState::kSuspending;
    r.state_initiator = "SERVICE";
    r.stage = "stop";
    Changed(r);
    Persist(r).ok();
    Log(r.id + ": SUSPENDING (preempted for a reserved request)");
  }
}

Result<std::string> Controller::Impl::EnsureRedis() {
  if (redis_pid_ > 0) {
    return "redis://" + options_.advertise_address + ":" +
           std::to_string(redis_port_);
  }
  // A free port: bind port 0, read it, close (a small race, accepted).
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
  const int port = ntohs(addr.sin_port);
  ::close(fd);
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
    int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
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
  Log("started redis-server on " + options_.advertise_address + ":" +
      port_text + " as the coordinator store");
  return "redis://" + options_.advertise_address + ":" + port_text;
}

Result<std::string> Controller::Impl::Coordinator(
    const QueuedResourceRecord& r) {
  // One machine: every agent registered the same loopback address. Agents
  // at different addresses (other machines, or other loopback addresses
  // standing in for them) share a redis-server instead.
  std::set<std::string> ips;
  for (const NodeRecord& n : r.nodes) {
    for (const std::string& h : n.hosts) ips.insert(hosts_[h].ip());
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

void Controller::Impl::LaunchWork(QueuedResourceRecord& r) {
  const std::string name = r.name;
  const uint64_t version = versions_[name];
  const std::string stage = r.stage;
  const int attempt = r.attempt;
  auto done = std::make_shared<std::atomic<bool>>(false);
  std::function<WorkResult()> work;
  if (stage == "stop") {
    std::set<std::string> ids(r.retired_hosts.begin(), r.retired_hosts.end());
    for (const NodeRecord& n : r.nodes)
      ids.insert(n.hosts.begin(), n.hosts.end());
    std::vector<HostCall> calls;
    for (const std::string& id : ids) {
      calls.push_back({id, hosts_[id].agent_address});
    }
    const std::string prefix = WorkerName(r.id, 0, 0);
    const std::string worker_prefix = prefix.substr(0, prefix.size() - 3);
    if (calls.empty()) {  // nothing runs anywhere: complete now
      WorkResult result;
      result.complete = true;
      ApplyWork(name, version, stage, attempt, result);
      return;
    }
    work = [this, calls, worker_prefix] {
      return RunStop(options_.token, calls, worker_prefix);
    };
  } else if (stage == "start") {
    for (const NodeRecord& n : r.nodes) {
      if (n.hosts.empty()) return;  // waits for a replacement slice
    }
    Result<std::string> coordinator = Coordinator(r);
    if (!coordinator.ok()) {
      Log(r.id + ": " + coordinator.status().message());
      return;
    }
    std::vector<StartTarget> targets;
    for (size_t i = 0; i < r.nodes.size(); ++i) {
      const NodeRecord& n = r.nodes[i];
      if (n.started) continue;
      std::string hostnames;
      for (const std::string& h : n.hosts) {
        hostnames += (hostnames.empty() ? "" : ",") + hosts_[h].ip();
      }
      for (size_t w = 0; w < n.hosts.size(); ++w) {
        StartTarget t;
        t.node = static_cast<int>(i);
        t.worker = static_cast<int>(w);
        t.host = {n.hosts[w], hosts_[n.hosts[w]].agent_address};
        t.name = WorkerName(r.id, t.node, t.worker);
        t.env = {{"MEGASCALE_COORDINATOR_ADDRESS", *coordinator},
                 {"MEGASCALE_NUM_SLICES", std::to_string(r.nodes.size())},
                 {"MEGASCALE_SLICE_ID", std::to_string(i)},
                 {"MEGASCALE_PORT", "8080"},
                 {"TPU_WORKER_ID", std::to_string(w)},
                 {"TPU_WORKER_HOSTNAMES", hostnames},
                 {"MULTISLICE_ACCELERATOR_TYPE", r.spec.accelerator_type},
                 {"MULTISLICE_RUN_ID", r.id},
                 {"MULTISLICE_ATTEMPT", std::to_string(r.attempt)}};
        targets.push_back(std::move(t));
      }
    }
    const std::string script = r.spec.startup_script;
    const int nodes = static_cast<int>(r.nodes.size());
    work = [this, targets, attempt, script, nodes] {
      return RunStart(options_.token, targets, attempt, script, nodes);
    };
  } else {
    return;
  }
  busy_.insert(name);
  work_.push_back(
      {std::thread([this, work, name, version, stage, attempt, done] {
         WorkResult result = work();
         {
           std::lock_guard<std::mutex> lock(mu_);
           busy_.erase(name);
           if (!stopping_) ApplyWork(name, version, stage, attempt, result);
           wake_ = true;
         }
         cv_.notify_all();
         done->store(true);
       }),
       done});
}

namespace {

Result<ApiClient> AgentClient(const std::string& address,
                              const std::string& token,
                              std::chrono::milliseconds timeout) {
  return ApiClient::Create("http://" + address, token, timeout);
}

// Runs fn over items with at most 16 calls in flight.
template <typename T, typename F>
void ForEachParallel(const std::vector<T>& items, F fn) {
  const size_t kWidth = 16;
  for (size_t start = 0; start < items.size(); start += kWidth) {
    std::vector<std::future<void>> futures;
    for (size_t i = start; i < std::min(items.size(), start + kWidth); ++i) {
      futures.push_back(
          std::async(std::launch::async, [&, i] { fn(items[i], i); }));
    }
    for (auto& f : futures) f.get();
  }
}

}  // namespace

void Controller::Impl::HandleLogs(const httplib::Request& req,
                                  httplib::Response& res) {
  const std::string id = req.matches[1];
  int64_t bytes = 4096;
  if (req.has_param("bytes")) {
    const std::string text = req.get_param_value("bytes");
    char* end = nullptr;
    long long v = std::strtoll(text.c_str(), &end, 10);
    if (text.empty() || *end != '\0' || v < 1 || v > 65536) {
      WriteError(res, 400, "INVALID_ARGUMENT",
                 "bytes: '" + text.substr(0, 40) +
                     "' is not an integer from 1 to 65536");
      return;
    }
    bytes = v;
  }
  struct Target {
    json entry;
    std::string agent_address;
  };
  std::vector<Target> targets;
  {
    std::lock_guard<std::mutex> lock(mu_);
    QueuedResourceRecord* r = FindById(id);
    if (!r) {
      WriteError(res, 404, "NOT_FOUND", "queued resource " + id + " not found");
      return;
    }
    for (size_t i = 0; i < r->nodes.size(); ++i) {
      const NodeRecord& n = r->nodes[i];
      for (size_t w = 0; w < n.hosts.size(); ++w) {
        auto hit = hosts_.find(n.hosts[w]);
        if (hit == hosts_.end()) continue;
        Target t;
        t.entry = {{"node", n.node_id},
                   {"nodeIndex", i},
                   {"worker", w},
                   {"name", WorkerName(r->id, static_cast<int>(i),
                                       static_cast<int>(w))},
                   {"hostId", hit->first}};
        t.agent_address = hit->second.agent_address;
        targets.push_back(std::move(t));
      }
    }
  }
  // Outside the lock: each agent runs `tail` in the worker's directory
  // (its exec call, like `queued-resources ssh`), read back until done.
  std::vector<json> out(targets.size());
  const std::string command = "tail -c " + std::to_string(bytes) +
                              " startup-script.log 2>/dev/null || true";
  const std::string token = options_.token;
  ForEachParallel(targets, [&](const Target& t, size_t i) {
    json entry = t.entry;
    entry["log"] = "";
    Result<ApiClient> client =
        AgentClient(t.agent_address, token, std::chrono::milliseconds(3000));
    if (!client.ok()) {
      entry["error"] = client.status().message();
      out[i] = entry;
      return;
    }
    json body = {{"command", command}, {"worker", entry["name"]}};
    Result<HttpResponse> started =
        client->Call("POST", "/agent/v1/exec", &body);
    if (!started.ok() || started->status / 100 != 2 ||
        !started->body.is_object() || !started->body.contains("execId")) {
      entry["error"] = started.ok() ? ErrorFromResponse(*started).message()
                                    : started.status().message();
      out[i] = entry;
      return;
    }
    const std::string exec_id = started->body["execId"].get<std::string>();
    std::string log;
    int64_t offset = 0;
    const int64_t deadline = SteadyMs() + 3000;
    bool done = false;
    while (!done && SteadyMs() < deadline) {
      Result<HttpResponse> r =
          client->Call("GET", "/agent/v1/exec/" + exec_id +
                                  "?offset=" + std::to_string(offset));
      if (!r.ok() || r->status != 200 || !r->body.is_object()) {
        entry["error"] =
            r.ok() ? ErrorFromResponse(*r).message() : r.status().message();
        break;
      }
      log += r->body.value("output", "");
      offset = r->body.value("nextOffset", offset);
      done = r->body.value("done", false);
      if (!done) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    if (!done && !entry.contains("error")) {
      entry["error"] = "the agent did not finish reading the log in 3 s";
    }
    entry["log"] = log;
    out[i] = entry;
  });
  WriteJson(res, 200, {{"workers", out}, {"bytes", bytes}});
}

WorkResult Controller::Impl::RunStart(const std::string& token,
                                      const std::vector<StartTarget>& targets,
                                      int attempt, const std::string& script,
                                      int nodes) {
  WorkResult result;
  std::mutex result_mu;
  std::vector<char> ok(targets.size(), 0);
  const auto timeout = options_.agent_call_timeout;
  ForEachParallel(targets, [&](const StartTarget& t, size_t index) {
    Result<ApiClient> client =
        AgentClient(t.host.agent_address, token, timeout);
    if (!client.ok()) return;
    json body = {{"attempt", attempt}, {"script", script}, {"env", t.env}};
    Result<HttpResponse> put =
        client->Call("PUT", "/agent/v1/workers/" + t.name, &body);
    std::lock_guard<std::mutex> lock(result_mu);
    if (!put.ok()) {
      result.lost_hosts.insert(t.host.host_id);
      return;
    }
    if (put->status == 201 || put->status == 200) {
      ok[index] = 1;
      result.started_workers.emplace_back(t.host.host_id, put->body);
      return;
    }
    if (put->status == 409) {
      // Already running: ours (a restarted controller) or a stale attempt.
      Result<HttpResponse> list = client->Call("GET", "/agent/v1/workers");
      if (!list.ok() || list->status != 200) return;
      for (const json& w : list->body.value("workers", json::array())) {
        if (w.value("name", "") != t.name) continue;
        if (w.value("state", "") == "RUNNING" &&
            w.value("attempt", -1) == attempt) {
          ok[index] = 1;
        } else if (w.value("state", "") == "RUNNING") {
          json stop = {{"graceSeconds", options_.stop_grace_seconds}};
          client->Call("POST", "/agent/v1/workers/" + t.name + ":stop", &stop)
              .status()
              .ok();
        }
      }
      return;
    }
    result.hard_error = "agent " + t.host.host_id + " refused worker " +
                        t.name + ": " + ErrorFromResponse(*put).message();
  });
  std::vector<int> pending(nodes, 0);
  std::set<int> touched;
  for (size_t i = 0; i < targets.size(); ++i) {
    touched.insert(targets[i].node);
    if (!ok[i]) ++pending[targets[i].node];
  }
  for (int node : touched) {
    if (pending[node] == 0) result.started_nodes.insert(node);
  }
  result.complete = result.lost_hosts.empty() && result.hard_error.empty() &&
                    static_cast<size_t>(std::count(ok.begin(), ok.end(), 1)) ==
                        targets.size();
  return result;
}

WorkResult Controller::Impl::RunStop(const std::string& token,
                                     const std::vector<HostCall>& hosts,
                                     const std::string& worker_prefix) {
  WorkResult result;
  std::mutex result_mu;
  std::atomic<bool> all_stopped{true};
  const auto timeout =
      options_.agent_call_timeout +
      std::chrono::milliseconds(1000LL * options_.stop_grace_seconds);
  ForEachParallel(hosts, [&](const HostCall& h, size_t) {
    Result<ApiClient> client = AgentClient(h.agent_address, token, timeout);
    if (!client.ok()) return;
    Result<HttpResponse> list = client->Call("GET", "/agent/v1/workers");
    if (!list.ok()) {
      // The agent is gone, and its process groups with it.
      std::lock_guard<std::mutex> lock(result_mu);
      result.lost_hosts.insert(h.host_id);
      return;
    }
    if (list->status != 200) {
      all_stopped = false;
      return;
    }
    for (const json& w : list->body.value("workers", json::array())) {
      const std::string name = w.value("name", "");
      if (name.rfind(worker_prefix, 0) != 0) continue;
      // Only "{prefix}{node}.{worker}": not another QR whose id extends ours.
      const std::string rest = name.substr(worker_prefix.size());
      if (rest.find_first_not_of("0123456789.") != std::string::npos ||
          std::count(rest.begin(), rest.end(), '.') != 1) {
        continue;
      }
      if (w.value("state", "") != "RUNNING") continue;
      json stop = {{"graceSeconds", options_.stop_grace_seconds}};
      Result<HttpResponse> r =
          client->Call("POST", "/agent/v1/workers/" + name + ":stop", &stop);
      if (!r.ok()) {
        std::lock_guard<std::mutex> lock(result_mu);
        result.lost_hosts.insert(h.host_id);
      } else if (r->status != 200 && r->status != 404) {
        all_stopped = false;
      }
    }
  });
  result.complete = all_stopped.load();
  return result;
}

void Controller::Impl::ApplyWork(const std::string& name, uint64_t version,
                                 const std::string& stage, int attempt,
                                 const WorkResult& result) {
  for (const std::string& h : result.lost_hosts) {
    if (stage == "stop") {
      // Unreachable while stopping: its workers died with the agent. Only
      // mark it lost (for repair) if it is not already.
      if (!hosts_[h].lost) MarkLost(h, "agent unreachable");
    } else {
      MarkLost(h, "agent unreachable");
    }
  }
  for (const auto& [host_id, status] : result.started_workers) {
    auto h = hosts_.find(host_id);
    if (h == hosts_.end() || !status.is_object()) continue;
    json& workers = h->second.workers;
    if (!workers.is_array()) workers = json::array();
    bool replaced = false;
    for (json& w : workers) {
      if (w.is_object() && w.value("name", "") == status.value("name", "")) {
        w = status;
        replaced = true;
      }
    }
    if (!replaced) workers.push_back(status);
  }
  auto it = records_.find(name);
  if (it == records_.end()) return;
  QueuedResourceRecord& r = it->second;
  std::vector<OperationRecord> ops;
  if (stage == "start") {
    if (r.stage != "start" || r.attempt != attempt) return;
    if (!result.hard_error.empty()) {
      r.state = QrState::kFailed;
      r.state_initiator = "SERVICE";
      r.failed_error = result.hard_error;
      r.stage = "stop";  // stop what started, then release the hosts
      FinishOps(r, r.ToApi(), &ops);
      Log(r.id + ": FAILED: " + result.hard_error);
    } else {
      for (int node : result.started_nodes) {
        if (r.nodes[node].hosts.empty()) continue;  // lost meanwhile
        r.nodes[node].started = true;
        r.nodes[node].state = "READY";
        r.nodes[node].health = "HEALTHY";
      }
      bool all = true;
      for (const NodeRecord& n : r.nodes) all &= n.started;
      if (!all) {
        if (result.started_nodes.empty()) return;
      } else {
        r.state = QrState::kActive;
        r.stage.clear();
        FinishOps(r, r.ToApi(), &ops);
        Log(r.id + ": ACTIVE (attempt " + std::to_string(r.attempt) + ")");
      }
    }
  } else if (stage == "stop") {
    if (r.stage != "stop" || versions_[name] != version || !result.complete) {
      return;
    }
    // Retired hosts that were failed on purpose but still run an agent are
    // free again once their workers stopped.
    r.retired_hosts.clear();
    if (r.delete_requested) {
      FinishOps(r, json::object(), &ops);
      StoreChange change;
      change.delete_queued_resources.push_back(name);
      change.put_operations = ops;
      Status s = store_->Apply(change);
      if (!s.ok()) {
        Log("cannot delete " + r.id + ": " + s.message());
        return;
      }
      for (const OperationRecord& op : ops) ops_[op.name] = op;
      Log(r.id + ": deleted");
      records_.erase(it);
      versions_.erase(name);
      return;
    }
    if (r.state == QrState::kSuspending || r.state == QrState::kFailed) {
      for (NodeRecord& n : r.nodes) {
        n.hosts.clear();
        n.started = false;
        n.state = r.state == QrState::kSuspending ? "PREEMPTED" : n.state;
      }
      if (r.state == QrState::kSuspending) {
        r.state = QrState::kSuspended;
        Log(r.id + ": SUSPENDED");
      }
      r.stage.clear();
    } else {
      // Repair or reset: every old worker has exited; start the next
      // attempt (once every node has hosts).
      r.attempt += 1;
      r.stage = "start";
      for (NodeRecord& n : r.nodes) n.started = false;
      Log(r.id + ": workers stopped; starting attempt " +
          std::to_string(r.attempt));
    }
  } else {
    return;
  }
  Changed(r);
  Status s = Persist(r, ops);
  if (!s.ok()) Log("cannot persist " + r.id + ": " + s.message());
  for (const OperationRecord& op : ops) ops_[op.name] = op;
}

// ---------------------------------------------------------------- facade

Controller::Controller(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Controller::~Controller() {
  if (impl_) impl_->Stop();
}

Result<std::unique_ptr<Controller>> Controller::Start(
    ControllerOptions options) {
  if (options.token.empty()) return InvalidArgument("controller: empty token");
  auto impl = std::make_unique<Impl>(std::move(options));
  RETURN_IF_ERROR(impl->Init());
  return std::unique_ptr<Controller>(new Controller(std::move(impl)));
}

int Controller::port() const { return impl_->port(); }
Status Controller::ReportHostLost(const std::string& host,
                                  const std::string& reason) {
  return impl_->ReportHostLost(host, reason);
}
std::vector<int> Controller::LastReportedWorkerGroups(const std::string& host) {
  return impl_->LastReportedWorkerGroups(host);
}
void Controller::Stop() { impl_->Stop(); }

}  // namespace multislice::control
