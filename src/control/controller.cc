// The queued-resource controller (see controller.h and docs/control.md): the
// wiring of its units. ControlState holds what they share; PublicApi and
// HostApi answer HTTP; the Reconciler drives each queued resource through
// its states and calls the CapacityProvider (the host agents) on work
// threads, never under the lock.
#include "control/controller.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <filesystem>
#include <thread>

#include "control/agent_capacity.h"
#include "control/connection_gate.h"
#include "control/console/console.h"
#include "control/control_state.h"
#include "control/host_api.h"
#include "control/http.h"
#include "control/metrics.h"
#include "control/node_access.h"
#include "control/node_api.h"
#include "control/public_api.h"
#include "control/reconciler.h"
#include "control/resource_api.h"

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

bool Matches(const std::string& id, const Host& h, const std::string& host) {
  return id == host || h.agent_address == host || h.hostname == host ||
         (!h.workdir.empty() && h.workdir == host);
}

// SO_REUSEADDR only: SO_REUSEPORT would let a stale socket share the port.
// TCP_DEFER_ACCEPT: the kernel hands over a connection only once its first
// bytes arrived (or after kDeferAcceptSeconds), so connections that send
// nothing never hold one of the server's threads.
constexpr int kDeferAcceptSeconds = 30;
void SetListenOptions(int sock) {
  int yes = 1;
  ::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  int defer = kDeferAcceptSeconds;
  ::setsockopt(sock, IPPROTO_TCP, TCP_DEFER_ACCEPT, &defer, sizeof(defer));
}

// Binds `server` to address:port (0: any free port); the port, or -1.
int Bind(httplib::Server& server, const std::string& address, int port) {
  if (port == 0) return server.bind_to_any_port(address);
  return server.bind_to_port(address, port) ? port : -1;
}

// The metrics listener: a scrape is one small GET, so a few threads, two
// connections per address and short timeouts: a slow or hostile scraper
// holds nothing the API or the agents use.
constexpr int kMetricsThreads = 4;
constexpr int kMetricsConnectionsPerAddress = 2;
constexpr int kMetricsTimeoutSeconds = 2;

// google.rpc.Status bodies for what the library answers itself (413, 404)
// and for an exception a handler let escape (500).
void SetErrorHandlers(httplib::Server& server) {
  server.set_error_handler([](const httplib::Request&, httplib::Response& res) {
    if (!res.body.empty()) return;
    if (res.status == 413) {
      WriteError(res, 413, "INVALID_ARGUMENT",
                 "request body larger than " + std::to_string(kMaxBodyBytes) +
                     " bytes");
    } else if (res.status == 404) {
      WriteError(res, 404, "NOT_FOUND", "no such API path");
    } else {
      WriteError(res, res.status, "", "HTTP " + std::to_string(res.status));
    }
  });
  server.set_exception_handler([](const httplib::Request&,
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
}

// What the agents' and the metrics listeners share: short timeouts, no
// Nagle delay, TCP_DEFER_ACCEPT, google.rpc.Status errors.
void ConfigureSideServer(httplib::Server& server) {
  server.set_payload_max_length(kMaxBodyBytes);
  server.set_tcp_nodelay(true);
  server.set_socket_options(SetListenOptions);
  server.set_keep_alive_timeout(2);
  server.set_read_timeout(2, 0);
  SetErrorHandlers(server);
}

}  // namespace

class Controller::Impl {
 public:
  explicit Impl(ControllerOptions options) : options_(std::move(options)) {}
  ~Impl() { Stop(); }

  Status Init();
  void Stop();
  int port() const { return port_; }
  int agent_port() const { return agent_port_; }
  int metrics_port() const { return metrics_port_; }
  std::vector<int> LastReportedWorkerGroups(const std::string& host);
  Status ReportHostLost(const std::string& host, const std::string& reason);

 private:
  void ConfigureServer();
  void ConfigureMetricsServer();
  Status Listen();

  ControllerOptions options_;
  std::unique_ptr<ControlState> state_;
  std::unique_ptr<AgentCapacity> capacity_;
  std::unique_ptr<PublicApi> public_api_;
  std::unique_ptr<HostApi> host_api_;
  std::unique_ptr<ResourceApi> resource_api_;
  std::unique_ptr<NodeAccessApi> node_access_;
  std::unique_ptr<NodeApi> node_api_;
  std::unique_ptr<Reconciler> reconciler_;
  std::unique_ptr<ControllerMetrics> metrics_;
  httplib::Server server_;
  httplib::Server agent_server_;    // the agents' channel only
  httplib::Server metrics_server_;  // GET /metrics only, without the token
  int port_ = 0;
  int agent_port_ = 0;
  int metrics_port_ = 0;
  int listen_fd_ = -1;
  std::vector<httplib::Server*> listening_;  // bound by Listen()
  std::vector<std::thread> server_threads_;  // one per listening_
  bool stopped_ = false;
};

Status Controller::Impl::Init() {
  std::error_code ec;
  std::filesystem::create_directories(options_.data_dir + "/stores", ec);
  if (ec) {
    return Internal("data dir " + options_.data_dir +
                    ": cannot create it: " + ec.message());
  }
  options_.data_dir = std::filesystem::absolute(options_.data_dir).string();
  // It holds the state, the tokens and every run's rendezvous: others may
  // pass through (to a local agent's workdir, or a run's store they own)
  // but not list it; every secret in it is 0600.
  for (const std::string& dir :
       {options_.data_dir, options_.data_dir + "/stores"}) {
    std::filesystem::permissions(dir,
                                 std::filesystem::perms::owner_all |
                                     std::filesystem::perms::group_exec |
                                     std::filesystem::perms::others_exec,
                                 ec);
  }
  ASSIGN_OR_RETURN(std::unique_ptr<Store> store,
                   Store::Open(options_.data_dir + "/state.db"));
  state_ = std::make_unique<ControlState>(options_, std::move(store));
  RETURN_IF_ERROR(state_->Load());
  capacity_ = std::make_unique<AgentCapacity>(options_);
  public_api_ = std::make_unique<PublicApi>(*state_);
  host_api_ = std::make_unique<HostApi>(*state_);
  resource_api_ = std::make_unique<ResourceApi>(*state_);
  node_access_ = std::make_unique<NodeAccessApi>(*state_);
  node_api_ = std::make_unique<NodeApi>(*state_, *public_api_);
  reconciler_ =
      std::make_unique<Reconciler>(*state_, *capacity_, options_.cluster.get());
  metrics_ = std::make_unique<ControllerMetrics>(*state_);
  ConfigureServer();
  if (!options_.metrics_bind_address.empty()) ConfigureMetricsServer();
  RETURN_IF_ERROR(Listen());
  for (httplib::Server* s : listening_) {
    server_threads_.emplace_back([s] { s->listen_after_bind(); });
  }
  // cpp-httplib's stop() does nothing before its listen loop runs: wait
  // for every one, so that a Stop() right after Start() cannot hang.
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::seconds(10);
  auto all_running = [this] {
    for (httplib::Server* s : listening_) {
      if (!s->is_running()) return false;
    }
    return true;
  };
  while (!all_running() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  reconciler_->Start();
  return OkStatus();
}

void Controller::Impl::ConfigureServer() {
  server_.new_task_queue = [this]() -> httplib::TaskQueue* {
    const size_t threads = static_cast<size_t>(options_.http_threads);
    if (options_.max_connections_per_address <= 0) {
      return new httplib::ThreadPool(threads);
    }
    return new ConnectionGate(threads, options_.max_connections_per_address,
                              &port_);
  };
  server_.set_payload_max_length(kMaxBodyBytes);
  // Small JSON answers: no Nagle delay behind the client's delayed ACK.
  server_.set_tcp_nodelay(true);
  // Remember the listening socket, to deepen its backlog after bind (the
  // library listens with a backlog of 5, which drops bursts of connects).
  server_.set_socket_options([this](int sock) {
    SetListenOptions(sock);
    listen_fd_ = sock;
  });
  server_.set_keep_alive_max_count(1000);
  // A connection that sends nothing holds a thread this long at most.
  server_.set_keep_alive_timeout(2);
  server_.set_read_timeout(5, 0);
  SetErrorHandlers(server_);
  metrics_->requests().Instrument(server_, "api");
  public_api_->Mount(server_, options_.token);
  resource_api_->Mount(server_, options_.token);
  node_access_->Mount(server_, options_.token);
  node_api_->Mount(server_, options_.token);
  host_api_->Mount(server_, options_.token);
  metrics_->Mount(server_, options_.token);
  agent_server_.new_task_queue = [n = options_.agent_http_threads] {
    return new httplib::ThreadPool(static_cast<size_t>(n));
  };
  ConfigureSideServer(agent_server_);
  metrics_->requests().Instrument(agent_server_, "agent");
  host_api_->MountAgentChannel(agent_server_, options_.token);
  // The console's static files need no token (they hold no data); every
  // API call they make carries it.
  MountConsole(server_);
}

void Controller::Impl::ConfigureMetricsServer() {
  metrics_server_.new_task_queue = [this]() -> httplib::TaskQueue* {
    return new ConnectionGate(kMetricsThreads, kMetricsConnectionsPerAddress,
                              &metrics_port_);
  };
  ConfigureSideServer(metrics_server_);
  metrics_server_.set_read_timeout(kMetricsTimeoutSeconds, 0);
  metrics_server_.set_write_timeout(kMetricsTimeoutSeconds, 0);
  metrics_->requests().Instrument(metrics_server_, "metrics");
  metrics_->Mount(metrics_server_, /*token=*/"");
}

Status Controller::Impl::Listen() {
  port_ = Bind(server_, options_.bind_address, options_.port);
  if (port_ <= 0) {
    return Unavailable("cannot listen on " + options_.bind_address + ":" +
                       std::to_string(options_.port));
  }
  if (listen_fd_ >= 0) ::listen(listen_fd_, 1024);
  listening_.push_back(&server_);
  agent_port_ = Bind(agent_server_, options_.bind_address, options_.agent_port);
  if (agent_port_ <= 0) {
    return Unavailable("cannot listen for agents on " + options_.bind_address +
                       ":" + std::to_string(options_.agent_port));
  }
  listening_.push_back(&agent_server_);
  host_api_->set_agent_port(agent_port_);
  if (options_.metrics_bind_address.empty()) return OkStatus();
  metrics_port_ = Bind(metrics_server_, options_.metrics_bind_address,
                       options_.metrics_port);
  if (metrics_port_ <= 0) {
    return Unavailable("cannot listen for metrics on " +
                       options_.metrics_bind_address + ":" +
                       std::to_string(options_.metrics_port));
  }
  listening_.push_back(&metrics_server_);
  return OkStatus();
}

void Controller::Impl::Stop() {
  if (stopped_) return;
  stopped_ = true;
  if (state_) {
    std::lock_guard<std::mutex> lock(state_->mu);
    state_->stopping = true;
    state_->cv.notify_all();
  }
  for (httplib::Server* s : listening_) s->stop();
  for (std::thread& t : server_threads_) t.join();
  if (reconciler_) reconciler_->Stop();
}

std::vector<int> Controller::Impl::LastReportedWorkerGroups(
    const std::string& host) {
  std::lock_guard<std::mutex> lock(state_->mu);
  std::vector<int> groups;
  for (const auto& [id, h] : state_->hosts) {
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

Status Controller::Impl::ReportHostLost(const std::string& host,
                                        const std::string& reason) {
  std::lock_guard<std::mutex> lock(state_->mu);
  for (const auto& [id, h] : state_->hosts) {
    if (Matches(id, h, host)) {
      state_->MarkLost(id, reason, /*confirmed=*/true);
      state_->Wake();
      return OkStatus();
    }
  }
  return NotFound("no host " + host);
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
int Controller::agent_port() const { return impl_->agent_port(); }
int Controller::metrics_port() const { return impl_->metrics_port(); }
Status Controller::ReportHostLost(const std::string& host,
                                  const std::string& reason) {
  return impl_->ReportHostLost(host, reason);
}
std::vector<int> Controller::LastReportedWorkerGroups(const std::string& host) {
  return impl_->LastReportedWorkerGroups(host);
}
void Controller::Stop() { impl_->Stop(); }

}  // namespace multislice::control
