// The client side of the host agents (see remote_exec.h).
#include "control/agent/remote_exec.h"

#include <signal.h>

#include <algorithm>
#include <cstdlib>
#include <mutex>
#include <thread>

namespace multislice::control {
namespace {

using std::chrono::milliseconds;
// Beyond the grace, what a stop may take: SIGKILL and the agent's wait.
constexpr milliseconds kStopSlack{15000};
using nlohmann::json;
using Clock = std::chrono::steady_clock;

// The error of a non-2xx answer, or ok.
Status AnswerStatus(const Result<HttpResponse>& response) {
  if (!response.ok()) return response.status();
  if (response->status / 100 != 2) return ErrorFromResponse(*response);
  return OkStatus();
}

// Percent-encodes a query parameter's value.
std::string EncodeQueryValue(const std::string& text) {
  static const char* kHex = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : text) {
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
        (c >= '0' && c <= '9') || c == '-' || c == '_' || c == '.' ||
        c == '~' || c == '/') {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
  return out;
}

std::atomic<bool> g_cancel{false};
void SetCancel(int) { g_cancel.store(true); }

}  // namespace

Result<std::vector<WorkerTarget>> ListQueuedResourceWorkers(
    const ApiClient& controller, const std::string& qr) {
  auto response =
      controller.Call("GET", "/internal/v1/queuedResources/" + qr + "/workers");
  RETURN_IF_ERROR(AnswerStatus(response));
  const json& body = response->body;
  if (!body.is_object() || !body.contains("workers") ||
      !body["workers"].is_array()) {
    return Internal("the controller's answer has no workers list");
  }
  std::vector<WorkerTarget> all;
  for (const json& w : body["workers"]) {
    if (!w.is_object() || !w.contains("nodeIndex") ||
        !w["nodeIndex"].is_number_integer() || !w.contains("worker") ||
        !w["worker"].is_number_integer() || !w.contains("agentAddress") ||
        !w["agentAddress"].is_string()) {
      return Internal(
          "the controller listed a worker without nodeIndex, "
          "worker or agentAddress");
    }
    WorkerTarget t;
    t.node_index = w["nodeIndex"].get<int>();
    t.worker = w["worker"].get<int>();
    t.agent_address = w["agentAddress"].get<std::string>();
    if (w.contains("agentToken") && w["agentToken"].is_string()) {
      t.agent_token = w["agentToken"].get<std::string>();
    }
    t.worker_name = w.contains("name") && w["name"].is_string()
                        ? w["name"].get<std::string>()
                        : qr + "." + std::to_string(t.node_index) + "." +
                              std::to_string(t.worker);
    all.push_back(std::move(t));
  }
  if (all.empty()) {
    return FailedPrecondition("queued resource " + qr +
                              " has no workers (is it ACTIVE?)");
  }
  return all;
}

Result<ControllerAccess> ResolveControllerAccess(
    const std::string& controller_flag, const std::string& token_file_flag) {
  ControllerAccess access;
  access.url = controller_flag;
  if (access.url.empty()) {
    const char* env = std::getenv("MULTISLICE_CONTROLLER");
    if (env != nullptr) access.url = env;
  }
  if (access.url.rfind("http://", 0) != 0) {
    return InvalidArgument(
        access.url.empty()
            ? "--controller: not given and MULTISLICE_CONTROLLER is not set"
            : "--controller: '" + access.url +
                  "' is not an address like http://127.0.0.1:8470");
  }
  std::string token_file = token_file_flag;
  if (token_file.empty()) {
    const char* env = std::getenv("MULTISLICE_TOKEN_FILE");
    if (env != nullptr) token_file = env;
  }
  if (token_file.empty()) {
    return InvalidArgument(
        "--token-file: not given and MULTISLICE_TOKEN_FILE is not set");
  }
  auto token = ReadToken(token_file);
  if (!token.ok()) {
    return InvalidArgument("--token-file: " + token.status().message());
  }
  access.token = *token;
  return access;
}

const std::atomic<bool>* CancelOnInterrupt() {
  struct sigaction action {};
  action.sa_handler = SetCancel;
  sigemptyset(&action.sa_mask);
  ::sigaction(SIGINT, &action, nullptr);
  ::sigaction(SIGTERM, &action, nullptr);
  return &g_cancel;
}

// ----- AgentClient -----

Result<AgentClient> AgentClient::Create(const std::string& address,
                                        const std::string& token,
                                        milliseconds timeout) {
  ASSIGN_OR_RETURN(ApiClient api,
                   ApiClient::Create("http://" + address, token, timeout));
  return AgentClient(address, token, timeout, std::move(api));
}

Result<ApiClient> AgentClient::StopClient(milliseconds grace) const {
  return ApiClient::Create("http://" + address_, token_,
                           timeout_ + grace + kStopSlack);
}

Result<std::string> AgentClient::StartExec(const std::string& worker,
                                           const ExecRequest& request) const {
  json body = {{"command", request.command}, {"worker", worker}};
  if (!request.directory.empty()) body["directory"] = request.directory;
  if (!request.tag.empty()) body["tag"] = request.tag;
  if (!request.env.empty()) body["env"] = request.env;
  auto response = api_.Call("POST", "/agent/v1/exec", &body);
  RETURN_IF_ERROR(AnswerStatus(response));
  if (!response->body.is_object() || !response->body.contains("execId") ||
      !response->body["execId"].is_string()) {
    return Internal("the agent's answer has no execId");
  }
  return response->body["execId"].get<std::string>();
}

Result<ExecOutput> AgentClient::ReadExec(const std::string& id,
                                         long long offset) const {
  auto response = api_.Call(
      "GET", "/agent/v1/exec/" + id + "?offset=" + std::to_string(offset));
  RETURN_IF_ERROR(AnswerStatus(response));
  const json& body = response->body;
  if (!body.is_object()) return Internal("the agent's answer is not JSON");
  ExecOutput out;
  if (body.contains("output") && body["output"].is_string()) {
    out.output = body["output"].get<std::string>();
  }
  // nextOffset counts bytes of the log; `output` may differ in length when
  // invalid UTF-8 was replaced on the way.
  out.next_offset =
      body.contains("nextOffset") && body["nextOffset"].is_number_integer()
          ? body["nextOffset"].get<long long>()
          : offset + static_cast<long long>(out.output.size());
  out.done = body.value("done", false);
  if (out.done) {
    out.exit_code = body.contains("exitCode") && body["exitCode"].is_number()
                        ? body["exitCode"].get<int>()
                        : 255;
  }
  return out;
}

Status AgentClient::StopExec(const std::string& id, milliseconds grace) const {
  ASSIGN_OR_RETURN(ApiClient client, StopClient(grace));
  json body = {{"graceSeconds", grace.count() / 1000.0}};
  return AnswerStatus(
      client.Call("POST", "/agent/v1/exec/" + id + ":stop", &body));
}

Result<int> AgentClient::StopTaggedExecs(const std::string& worker,
                                         const std::string& tag_prefix,
                                         milliseconds grace) const {
  ASSIGN_OR_RETURN(ApiClient client, StopClient(grace));
  json body = {{"tagPrefix", tag_prefix},
               {"graceSeconds", grace.count() / 1000.0}};
  auto response =
      client.Call("POST", "/agent/v1/workers/" + worker + "/execs:stop", &body);
  RETURN_IF_ERROR(AnswerStatus(response));
  const json& answer = response->body;
  if (!answer.is_object() || !answer.contains("stopped") ||
      !answer["stopped"].is_array()) {
    return Internal("the agent's answer has no stopped list");
  }
  return static_cast<int>(answer["stopped"].size());
}

Status AgentClient::PutFile(const std::string& worker, const std::string& path,
                            const std::string& bytes) const {
  httplib::Client client("http://" + address_);
  // Sending a large file takes longer than a JSON call: allow 1 s per MiB.
  const milliseconds send_time = timeout_ + milliseconds(bytes.size() >> 10);
  client.set_connection_timeout(timeout_);
  client.set_write_timeout(send_time);
  client.set_read_timeout(send_time);
  httplib::Headers headers = {{"Authorization", "Bearer " + token_}};
  auto result = client.Put(
      "/agent/v1/workers/" + worker + "/files?path=" + EncodeQueryValue(path),
      headers, bytes, "application/octet-stream");
  if (!result) {
    return Unavailable("cannot reach http://" + address_ + ": " +
                       httplib::to_string(result.error()));
  }
  if (result->status / 100 == 2) return OkStatus();
  HttpResponse response;
  response.status = result->status;
  response.body = json::parse(result->body, nullptr, false);
  if (response.body.is_discarded()) response.body = result->body;
  return ErrorFromResponse(response);
}

// ----- RemoteExec -----

Status RemoteExec::Start(const ExecRequest& request) {
  ASSIGN_OR_RETURN(
      AgentClient client,
      AgentClient::Create(target_.agent_address, AgentTokenFor(target_, token_),
                          timings_.http_timeout));
  ASSIGN_OR_RETURN(exec_id_, client.StartExec(target_.worker_name, request));
  client_ = std::move(client);
  offset_ = 0;
  last_answer_ = Clock::now();
  return OkStatus();
}

RemoteExec::Progress RemoteExec::Poll() {
  Progress progress;
  for (int chunks = 0; chunks < 16; ++chunks) {
    auto read = client_->ReadExec(exec_id_, offset_);
    if (!read.ok()) {
      if (Clock::now() - last_answer_ >= timings_.agent_lost_after) {
        progress.lost = read.status();
        progress.done = true;
        progress.exit_code = 255;
      }
      return progress;  // else: try again at the next call
    }
    last_answer_ = Clock::now();
    progress.output += read->output;
    offset_ = read->next_offset;
    if (read->done) {
      progress.done = true;
      progress.exit_code = read->exit_code;
      return progress;
    }
    // A full chunk may mean more is waiting; otherwise wait a round.
    if (read->output.size() < 64 * 1024) return progress;
  }
  return progress;
}

Status RemoteExec::Stop(milliseconds grace) {
  if (!client_) return OkStatus();
  return client_->StopExec(exec_id_, grace);
}

void ForEachConcurrently(size_t count, size_t max_threads,
                         const std::function<void(size_t)>& fn) {
  std::mutex mu;
  size_t next = 0;
  auto work = [&] {
    for (;;) {
      size_t i;
      {
        std::lock_guard<std::mutex> lock(mu);
        if (next >= count) return;
        i = next++;
      }
      fn(i);
    }
  };
  std::vector<std::thread> threads;
  const size_t n = std::min(count, std::max<size_t>(max_threads, 1));
  for (size_t t = 1; t < n; ++t) threads.emplace_back(work);
  work();
  for (auto& t : threads) t.join();
}

}  // namespace multislice::control
