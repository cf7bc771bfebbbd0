// The API fuzz driver: wire, checks, corpus and the libFuzzer mapping (see
// api_fuzz.h).
#include "control/api_fuzz.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <nlohmann/json.hpp>
#include <thread>

#include "control/control_testing.h"

namespace multislice::control::fuzz {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

// ------------------------------------------------------------------ wire

int ConnectLoopback(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    ::close(fd);
    return -1;
  }
  int yes = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &yes, sizeof(yes));
  return fd;
}

int MsLeft(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
      deadline - Clock::now());
  return left.count() < 0 ? 0 : static_cast<int>(left.count());
}

// Whether `events` came on `fd` before `deadline`.
bool Await(int fd, short events, Clock::time_point deadline) {
  pollfd p{fd, events, 0};
  while (true) {
    const int n = ::poll(&p, 1, MsLeft(deadline));
    if (n > 0) return true;
    if (n == 0 || errno != EINTR) return false;
  }
}

// Writes all of `bytes`; false, with the reason in *why, when the peer
// closed or the deadline passed.
bool WriteAll(int fd, std::string_view bytes, Clock::time_point deadline,
              std::string* why) {
  size_t sent = 0;
  while (sent < bytes.size()) {
    if (!Await(fd, POLLOUT, deadline)) {
      *why = "timeout after sending " + std::to_string(sent) + " bytes";
      return false;
    }
    const ssize_t n = ::send(fd, bytes.data() + sent, bytes.size() - sent,
                             MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      sent += static_cast<size_t>(n);
    } else if (errno != EAGAIN && errno != EINTR) {
      *why = std::string("send: ") + std::strerror(errno);
      return false;
    }
  }
  return true;
}

// The value of header `name` (lower case) in a header block; "" if none.
std::string HeaderValue(std::string_view block, std::string_view name) {
  size_t at = block.find("\r\n");
  while (at != std::string_view::npos && at + 2 < block.size()) {
    const size_t start = at + 2;
    const size_t end = block.find("\r\n", start);
    const std::string_view line = block.substr(start, end - start);
    const size_t colon = line.find(':');
    if (colon != std::string_view::npos && colon == name.size()) {
      std::string key(line.substr(0, colon));
      for (char& c : key) c = static_cast<char>(std::tolower(c));
      if (key == name) {
        std::string_view value = line.substr(colon + 1);
        while (!value.empty() && value.front() == ' ') value.remove_prefix(1);
        return std::string(value);
      }
    }
    at = end;
  }
  return "";
}

// Parses the status line and headers at the front of `data` (ending at
// `end`, the "\r\n\r\n"): the status, and the whole answer's length in
// bytes (npos when it runs to EOF).
size_t ParseHead(const std::string& data, size_t end, FuzzAnswer& answer) {
  answer.headers = data.substr(0, end);
  int status = 0;
  if (std::sscanf(answer.headers.c_str(), "HTTP/1.%*d %d", &status) != 1) {
    status = -1;
  }
  answer.status = status;
  const std::string length = HeaderValue(answer.headers, "content-length");
  if (length.empty()) return std::string::npos;
  return end + 4 + std::strtoull(length.c_str(), nullptr, 10);
}

// Reads one answer (skipping 1xx interim ones) until its last byte, EOF or
// the deadline. When nothing has come by `end_at`, half-closes the
// connection (see SendBytes).
void ReadAnswer(int fd, Clock::time_point deadline, Clock::time_point end_at,
                FuzzAnswer& answer) {
  std::string data;
  size_t head_end = std::string::npos, total = std::string::npos;
  bool ended = false;
  char buf[16384];
  while (true) {
    if (head_end == std::string::npos &&
        (head_end = data.find("\r\n\r\n")) != std::string::npos) {
      total = ParseHead(data, head_end, answer);
      if (answer.status >= 100 && answer.status < 200) {
        data.erase(0, head_end + 4);
        head_end = total = std::string::npos;
        continue;
      }
    }
    if (total != std::string::npos && data.size() >= total) break;
    const bool may_end = !ended && data.empty() && end_at < deadline;
    if (!Await(fd, POLLIN, may_end ? end_at : deadline)) {
      if (may_end) {
        ::shutdown(fd, SHUT_WR);
        ended = true;
        continue;
      }
      answer.failure = "timeout: no complete answer after " +
                       std::to_string(data.size()) + " bytes";
      return;
    }
    const ssize_t n = ::recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
    if (n > 0) {
      data.append(buf, static_cast<size_t>(n));
    } else if (n == 0) {
      break;
    } else if (errno != EAGAIN && errno != EINTR) {
      answer.failure = std::string("recv: ") + std::strerror(errno);
      if (head_end == std::string::npos) return;
      break;
    }
  }
  if (head_end == std::string::npos) {
    answer.failure = "connection closed before an answer (" +
                     std::to_string(data.size()) + " bytes read)";
    return;
  }
  answer.answered = true;
  answer.body = data.substr(head_end + 4);
}

double MsSince(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start)
      .count();
}

}  // namespace

FuzzRequest MakeRequest(std::string label, std::string method,
                        std::string target, std::string body,
                        bool authenticated) {
  FuzzRequest r;
  r.label = std::move(label);
  r.method = std::move(method);
  r.target = std::move(target);
  r.body = std::move(body);
  r.authenticated = authenticated;
  return r;
}

FuzzAnswer SendSlowly(int port, std::string_view bytes, int pieces,
                      std::chrono::milliseconds gap) {
  FuzzAnswer answer;
  const auto start = Clock::now();
  const int fd = ConnectLoopback(port);
  if (fd < 0) {
    answer.failure = std::string("connect: ") + std::strerror(errno);
    return answer;
  }
  const size_t step = bytes.size() / static_cast<size_t>(std::max(pieces, 1));
  std::string why;
  bool written = true;
  for (size_t at = 0; written && at < bytes.size();) {
    const size_t n =
        at + step >= bytes.size() || step == 0 ? bytes.size() - at : step;
    written = WriteAll(fd, bytes.substr(at, n), start + kAnswerTimeout, &why);
    at += n;
    if (at < bytes.size()) std::this_thread::sleep_for(gap);
  }
  const auto now = Clock::now();
  ReadAnswer(fd, now + kAnswerTimeout, now + kAnswerTimeout, answer);
  if (!written && !answer.answered) answer.failure = why;
  ::close(fd);
  answer.ms = MsSince(start);
  return answer;
}

FuzzAnswer SendBytes(int port, std::string_view bytes,
                     std::chrono::milliseconds timeout,
                     std::chrono::milliseconds end_after) {
  FuzzAnswer answer;
  const auto start = Clock::now();
  const int fd = ConnectLoopback(port);
  if (fd < 0) {
    answer.failure = std::string("connect: ") + std::strerror(errno);
    return answer;
  }
  std::string why;
  const bool written = WriteAll(fd, bytes, start + timeout, &why);
  const auto now = Clock::now();
  ReadAnswer(fd, start + timeout,
             end_after.count() < 0 ? start + timeout : now + end_after, answer);
  // A server that answered before reading everything (413, 414) may reset
  // the rest of the write; the answer is what counts.
  if (!written && !answer.answered) answer.failure = why;
  ::close(fd);
  answer.ms = MsSince(start);
  return answer;
}

void SendAndAbandon(int port, std::string_view bytes) {
  const int fd = ConnectLoopback(port);
  if (fd < 0) return;
  std::string why;
  WriteAll(fd, bytes, Clock::now() + kAnswerTimeout, &why);
  ::close(fd);
}

std::string Serialize(const FuzzRequest& request, const std::string& token) {
  bool has_length = false, has_type = false;
  for (const auto& [name, value] : request.headers) {
    std::string lower = name;
    for (char& c : lower) c = static_cast<char>(std::tolower(c));
    has_length |= lower == "content-length" || lower == "transfer-encoding";
    has_type |= lower == "content-type";
  }
  const std::string& m = request.method;
  const bool with_body = !request.body.empty() || m == "POST" || m == "PUT" ||
                         m == "PATCH" || m == "DELETE";
  std::string out = m + " " + request.target + " HTTP/1.1\r\n";
  out += "Host: 127.0.0.1\r\n";
  if (request.authenticated) {
    out += "Authorization: Bearer " +
           (request.token.empty() ? token : request.token) + "\r\n";
  }
  if (with_body && !has_length) {
    out += "Content-Length: " + std::to_string(request.body.size()) + "\r\n";
  }
  if (with_body && !has_type) out += "Content-Type: application/json\r\n";
  out += "Connection: close\r\n";
  for (const auto& [name, value] : request.headers) {
    out += name + ": " + value + "\r\n";
  }
  return out + "\r\n" + request.body;
}

FuzzAnswer Send(int port, const std::string& token, const FuzzRequest& request,
                std::chrono::milliseconds timeout) {
  return SendBytes(port, Serialize(request, token), timeout);
}

// ---------------------------------------------------------------- checks

std::string Printable(std::string_view bytes, size_t max_bytes) {
  std::string out;
  for (size_t i = 0; i < bytes.size() && i < max_bytes; ++i) {
    const unsigned char c = static_cast<unsigned char>(bytes[i]);
    if (c >= 0x20 && c < 0x7F && c != '\\') {
      out += static_cast<char>(c);
    } else {
      char hex[8];
      std::snprintf(hex, sizeof(hex), "\\x%02X", c);
      out += hex;
    }
  }
  if (bytes.size() > max_bytes) {
    out += "... (" + std::to_string(bytes.size()) + " bytes)";
  }
  return out;
}

namespace {

std::string CheckErrorBody(const FuzzAnswer& a) {
  const std::string status = "status " + std::to_string(a.status);
  // Strict parse: a body that is not UTF-8 fails here.
  const json j = json::parse(a.body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    return status + " with a body that is not JSON (or not UTF-8): '" +
           Printable(a.body, 120) + "'";
  }
  if (!j.is_object() || !j.contains("error") || !j["error"].is_object()) {
    return status +
           " whose body is not a google.rpc.Status: " + Printable(a.body, 120);
  }
  const json& e = j["error"];
  if (!e.contains("code") || !e["code"].is_number_integer() ||
      e["code"].get<int64_t>() != a.status) {
    return status + " whose error.code is not " + std::to_string(a.status) +
           ": " + Printable(a.body, 120);
  }
  if (!e.contains("message") || !e["message"].is_string()) {
    return status + " whose error.message is not a string";
  }
  return "";
}

}  // namespace

std::string CheckApiAnswer(const FuzzRequest& request,
                           const FuzzAnswer& answer) {
  if (!answer.answered) return "no answer: " + answer.failure;
  if (answer.status >= 500) {
    return "status " + std::to_string(answer.status) + ": " +
           Printable(answer.body, 200);
  }
  if (answer.status < 100) return "malformed status line";
  if (request.method == "HEAD") return "";
  if (request.target.rfind("/console", 0) == 0) return "";
  if (answer.status < 300) {
    if (answer.body.empty()) return "";
    const json j = json::parse(answer.body, nullptr, false);
    return j.is_discarded() ? "a 2xx body that is not JSON" : "";
  }
  return CheckErrorBody(answer);
}

std::string ErrorMessage(const FuzzAnswer& answer) {
  const json j = json::parse(answer.body, nullptr, false);
  if (!j.is_object() || !j.contains("error") || !j["error"].is_object()) {
    return "";
  }
  const json& e = j["error"];
  return e.contains("message") && e["message"].is_string()
             ? e["message"].get<std::string>()
             : "";
}

// ---------------------------------------------------------------- bodies

namespace {

json FullNode() {
  return {{"accelerator_type", "cpu-2"},
          {"runtime_version", "v2-alpha"},
          {"network_config",
           {{"network", "default"},
            {"subnetwork", "default"},
            {"enable_external_ips", true},
            {"can_ip_forward", false},
            {"queue_count", 1}}},
          {"tags", {"t1"}},
          {"metadata", {{"startup-script", "sleep 1000"}, {"k", "v"}}},
          {"description", "d"},
          {"labels", {{"l", "v"}}},
          {"service_account", {{"email", "a@b.c"}, {"scope", {"s"}}}},
          {"scheduling_config",
           {{"preemptible", false}, {"reserved", false}, {"spot", false}}},
          {"data_disks", {{{"source_disk", "d"}, {"mode", "READ_WRITE"}}}},
          {"shielded_instance_config", {{"enable_secure_boot", false}}},
          {"accelerator_config", {{"type", "V4"}, {"topology", "2x2x1"}}}};
}

const char kPlaceholder[] = "@@FUZZ-RAW@@";

// `body` with the value at `at` replaced by the raw JSON text `raw`.
std::string WithRaw(json body, const json::json_pointer& at,
                    const std::string& raw) {
  body[at] = kPlaceholder;
  std::string text = body.dump();
  const std::string quoted = std::string("\"") + kPlaceholder + "\"";
  return text.replace(text.find(quoted), quoted.size(), raw);
}

// `body` with a member `raw_key` (JSON text of a key) set to 1 in the
// object at `at`.
std::string WithRawKey(json body, const json::json_pointer& at,
                       const std::string& raw_key) {
  body[at][kPlaceholder] = 1;
  std::string text = body.dump();
  const std::string quoted = std::string("\"") + kPlaceholder + "\"";
  return text.replace(text.find(quoted), quoted.size(), raw_key);
}

void CollectPointers(const json& j, const json::json_pointer& at,
                     std::vector<json::json_pointer>& out) {
  if (j.is_object()) {
    for (const auto& [key, value] : j.items()) {
      out.push_back(at / key);
      CollectPointers(value, at / key, out);
    }
  } else if (j.is_array()) {
    for (size_t i = 0; i < j.size(); ++i) {
      out.push_back(at / i);
      CollectPointers(j[i], at / i, out);
    }
  }
}

std::string Quoted(const std::string& s) { return "\"" + s + "\""; }

// Every JSON type and the odd values of each, as raw JSON text.
const std::vector<std::pair<std::string, std::string>>& ValueKinds() {
  static const auto* kinds =
      new std::vector<std::pair<std::string, std::string>>{
          {"string", "\"x\""},
          {"empty string", "\"\""},
          {"id-like string", "\"fz-ok\""},
          {"integer", "7"},
          {"zero", "0"},
          {"negative", "-1"},
          {"negative zero", "-0"},
          {"fraction", "1.5"},
          {"exponent", "1e3"},
          {"huge 1e999999", "1e999999"},
          {"negative huge", "-1e999999"},
          {"tiny 1e-999999", "1e-999999"},
          {"2^64", "18446744073709551616"},
          {"below int64", "-9223372036854775809"},
          {"true", "true"},
          {"false", "false"},
          {"null", "null"},
          {"empty array", "[]"},
          {"array", "[\"a\",1,null]"},
          {"empty object", "{}"},
          {"object", "{\"k\":\"v\"}"},
          {"nested 65 arrays", DeepArrays(65)},
          {"nested 65 objects", DeepObjects(65)},
          {"invalid UTF-8 C3 28", "\"\xC3\x28\""},
          {"invalid UTF-8 FF", "\"\xFF\""},
          {"UTF-8 surrogate bytes", "\"\xED\xA0\x80\""},
          {"overlong UTF-8", "\"\xC0\xAF\""},
          {"truncated UTF-8", "\"\xE2\x82\""},
          {"escaped lone surrogate", "\"\\uD800\""},
          {"escaped NUL", "\"\\u0000\""},
          {"control characters", "\"\\u0001\\n\\t\\u007f\""},
          {"bidi override", "\"\xE2\x80\xAE\""},
          {"string of 64", Quoted(std::string(64, 'a'))},
          {"string of 1100", Quoted(std::string(1100, 'a'))},
          {"duration-like", "\"3600s\""},
          {"impossible date", "\"2024-02-30T00:00:00Z\""},
      };
  return *kinds;
}

}  // namespace

std::string DeepArrays(int depth, bool closed) {
  return std::string(static_cast<size_t>(depth), '[') +
         (closed ? std::string(static_cast<size_t>(depth), ']') : "");
}

std::string DeepObjects(int depth, bool closed) {
  std::string out;
  out.reserve(static_cast<size_t>(depth) * 7 + 2);
  for (int i = 0; i < depth; ++i) out += "{\"a\":";
  out += "1";
  if (closed) out += std::string(static_cast<size_t>(depth), '}');
  return out;
}

std::string FullBody() {
  json node_spec = {
      {"parent", "projects/proj/locations/us-test1-a"},
      {"multi_node_params", {{"node_count", 2}, {"node_id_prefix", "full"}}},
      {"node", FullNode()}};
  json body = {{"tpu", {{"node_spec", {node_spec}}}},
               {"guaranteed", {{"reserved", false}, {"min_duration", "3600s"}}},
               {"queueing_policy",
                {{"valid_until_duration", "3600s"},
                 {"valid_after_time", "2024-01-01T00:00:00Z"}}},
               {"reservation_name", "r"},
               {"name", "ignored"},
               {"state", {{"state", "ACTIVE"}}},
               {"create_time", "2024-01-01T00:00:00Z"}};
  return body.dump();
}

std::string SimpleBody(const std::string& startup_script) {
  json body = testing::CpuBody(1, "");
  body["tpu"]["node_spec"][0]["node"]["metadata"]["startup-script"] =
      startup_script;
  return body.dump();
}

std::vector<std::string> ValidBodies() {
  std::vector<std::string> out = {testing::kSeedBody, FullBody()};
  for (int nodes : {1, 2}) {
    for (const char* tier : {"", "reserved", "spot", "best-effort"}) {
      out.push_back(testing::CpuBody(nodes, tier).dump());
    }
  }
  json timed = testing::CpuBody(1, "spot");
  timed["queueing_policy"] = {{"valid_until_time", "2999-01-01T00:00:00Z"},
                              {"valid_after_duration", "0.5s"}};
  out.push_back(timed.dump());
  json camel = {{"tpu",
                 {{"nodeSpec",
                   {{{"nodeId", "camel"},
                     {"node",
                      {{"acceleratorType", "cpu-2"},
                       {"runtimeVersion", "v2-alpha"}}}}}}}},
                {"bestEffort", json::object()}};
  out.push_back(camel.dump());
  return out;
}

// ---------------------------------------------------------------- corpus

Corpus::Corpus(CorpusOptions options, uint32_t seed)
    : options_(std::move(options)), rng_(seed) {}

std::string Corpus::NextId() {
  return options_.id_prefix + "-" + std::to_string(next_id_++);
}

std::string Corpus::ApiBase(bool v2) const {
  return std::string(v2 ? "/v2" : "/v2alpha1") + "/projects/" +
         options_.project + "/locations/" + options_.zone;
}

FuzzRequest Corpus::Create(const std::string& label, std::string body,
                           bool v2) {
  FuzzRequest r;
  r.label = label;
  r.method = "POST";
  r.target = ApiBase(v2) + "/queuedResources?queued_resource_id=" + NextId();
  r.body = std::move(body);
  return r;
}

void Corpus::AddFieldTypeCases(const std::string& body_text,
                               std::vector<FuzzRequest>& out) {
  const json body = json::parse(body_text);
  std::vector<json::json_pointer> pointers;
  CollectPointers(body, json::json_pointer(), pointers);
  for (const json::json_pointer& at : pointers) {
    for (const auto& [kind, raw] : ValueKinds()) {
      out.push_back(Create("body field " + at.to_string() + " = " + kind,
                           WithRaw(body, at, raw), out.size() % 2 == 1));
    }
  }
}

void Corpus::AddKeyCases(std::vector<FuzzRequest>& out) {
  const json body = json::parse(FullBody());
  std::vector<json::json_pointer> objects = {json::json_pointer()};
  std::vector<json::json_pointer> all;
  CollectPointers(body, json::json_pointer(), all);
  for (const auto& at : all) {
    if (body[at].is_object()) objects.push_back(at);
  }
  const std::vector<std::pair<std::string, std::string>> keys = {
      {"unknown key", "\"bogus\""},
      {"empty key", "\"\""},
      {"invalid UTF-8 key FF", "\"\xFF\""},
      {"invalid UTF-8 key C3 28", "\"\xC3\x28\""},
      {"key with escaped NUL", "\"\\u0000\""},
      {"key of 2000", Quoted(std::string(2000, 'k'))},
      {"camelCase twin of a key", "\"nodeSpec\""},
      {"__proto__ key", "\"__proto__\""},
  };
  for (const auto& at : objects) {
    for (const auto& [kind, key] : keys) {
      out.push_back(Create("body object " + at.to_string() + " + " + kind,
                           WithRawKey(body, at, key)));
    }
  }
  // Both spellings of one field, and a field given twice.
  json twin = json::parse(SimpleBody());
  twin["tpu"]["nodeSpec"] = twin["tpu"]["node_spec"];
  out.push_back(Create("body with node_spec and nodeSpec", twin.dump()));
  const std::string simple = SimpleBody();
  out.push_back(
      Create("body with tpu twice", "{\"tpu\":1," + simple.substr(1)));
  out.push_back(Create("body with tpu twice, the valid one last",
                       "{\"tpu\":{\"bogus\":1}," + simple.substr(1)));
}

void Corpus::AddDeepCases(std::vector<FuzzRequest>& out) {
  const json simple = json::parse(SimpleBody());
  const json::json_pointer node("/tpu/node_spec/0/node");
  const std::vector<std::pair<std::string, json::json_pointer>> places = {
      {"unknown field", json::json_pointer("/bogus")},
      {"unknown node field", node / "bogus"},
      {"tags", node / "tags"},
      {"labels", node / "labels"},
      {"metadata", node / "metadata"},
      {"node", node},
      {"tpu.node_spec", json::json_pointer("/tpu/node_spec")},
      {"tpu", json::json_pointer("/tpu")},
  };
  for (const auto& [where, at] : places) {
    const json& body = simple;
    for (int depth : {64, 65, 16000}) {
      out.push_back(Create(where + ": arrays nested " + std::to_string(depth),
                           WithRaw(body, at, DeepArrays(depth))));
      out.push_back(Create(where + ": objects nested " + std::to_string(depth),
                           WithRaw(body, at, DeepObjects(depth))));
    }
    out.push_back(Create(where + ": 16000 unclosed arrays",
                         WithRaw(body, at, DeepArrays(16000, false))));
  }
  out.push_back(Create("whole body: arrays nested 16000", DeepArrays(16000)));
  out.push_back(Create("whole body: objects nested 16000", DeepObjects(16000)));
  out.push_back(
      Create("whole body: 500000 unclosed arrays", DeepArrays(500000, false)));
  out.push_back(Create("whole body: 100000 unclosed objects",
                       DeepObjects(100000, false)));
  out.push_back(Create(
      "brackets inside a string are not nesting",
      WithRaw(simple, node / "description", Quoted(std::string(1000, '[')))));
}

namespace {

// Bodies that are not a JSON object, or not JSON, or not only JSON.
std::vector<std::pair<std::string, std::string>> BrokenTexts() {
  const std::string simple = SimpleBody();
  const std::string bom = "\xEF\xBB\xBF";
  return {
      {"empty body", ""},
      {"whitespace", "  \r\n\t "},
      {"null", "null"},
      {"number", "0"},
      {"huge number", "1e999999"},
      {"string", "\"s\""},
      {"array", "[]"},
      {"object", "{}"},
      {"open brace", "{"},
      {"close brace", "}"},
      {"missing value", "{\"tpu\":"},
      {"text", "hello"},
      {"xml", "<xml/>"},
      {"single quotes", "{'tpu': 1}"},
      {"trailing comma", "{\"tpu\": {},}"},
      {"comment", "/* c */ {}"},
      {"NaN", "{\"tpu\": NaN}"},
      {"Infinity", "{\"tpu\": Infinity}"},
      {"NUL byte", std::string("\0", 1)},
      {"NUL after the body", simple + std::string("\0", 1)},
      {"two bodies", simple + simple},
      {"garbage after the body", simple + "garbage"},
      {"BOM", bom + simple},
      {"two BOMs", bom + bom + simple},
      {"BOM inside", "{" + bom + simple.substr(1)},
      {"UTF-16 BOM", "\xFF\xFE" + simple},
      {"raw FF outside strings", "{\xFF" + simple.substr(1)},
      {"raw FF at the end", simple + "\xFF"},
      {"raw control character in a string", "{\"tpu\":\"\x01\"}"},
      {"lone backslash at the end", "{\"tpu\":\"\\"},
      {"1 MiB + 1 of spaces", std::string((1 << 20) + 1, ' ')},
      {"1 MiB of valid JSON",
       simple + std::string((1 << 20) - 1 - simple.size(), ' ')},
  };
}

}  // namespace

void Corpus::AddTextCases(std::vector<FuzzRequest>& out) {
  for (const auto& [kind, text] : BrokenTexts()) {
    out.push_back(Create("body text: " + kind, text));
  }
  for (const std::string& valid :
       {std::string(testing::kSeedBody), FullBody()}) {
    for (int i = 0; i < 24; ++i) {
      const size_t cut = rng_() % valid.size();
      out.push_back(Create("body cut at byte " + std::to_string(cut),
                           valid.substr(0, cut)));
    }
  }
  const std::string simple = SimpleBody();
  for (const char* type :
       {"text/plain", "application/x-www-form-urlencoded",
        "multipart/form-data; boundary=x", "multipart/form-data", "",
        "application/json; charset=latin1"}) {
    FuzzRequest r = Create(std::string("content type '") + type + "'", simple);
    r.headers.push_back({"Content-Type", type});
    out.push_back(r);
  }
}

std::vector<FuzzRequest> Corpus::BodyCases() {
  std::vector<FuzzRequest> out;
  for (const std::string& body : ValidBodies()) {
    out.push_back(Create("valid body", body));
  }
  AddFieldTypeCases(FullBody(), out);
  AddFieldTypeCases(SimpleBody(), out);
  AddKeyCases(out);
  AddDeepCases(out);
  AddTextCases(out);
  return out;
}

namespace {

// Path segments that no slot of any route accepts.
std::vector<std::pair<std::string, std::string>> SegmentOddities() {
  return {
      {"%FF", "%FF"},
      {"%00", "%00"},
      {"..", ".."},
      {".", "."},
      {"-x", "-x"},
      {"%", "%"},
      {"%2F", "%2F"},
      {"a%2Fb", "a%2Fb"},
      {"%2E%2E", "%2E%2E"},
      {"79 'a' + 'é' (encoded)", std::string(79, 'a') + "%C3%A9"},
      {"79 'a' + 'é' (raw)", std::string(79, 'a') + "\xC3\xA9"},
      {"64 characters", std::string(64, 'a')},
      {"1000 characters", std::string(1000, 'a')},
      {"8000 characters", std::string(8000, 'a')},
      {"9000 characters", std::string(9000, 'a')},
      {"uppercase", "UPPER"},
      {"empty", ""},
      {"%20", "a%20b"},
      {"+", "a+b"},
      {"%uD800", "%uD800"},
      {"%u0000", "%u0000"},
      {"%ZZ", "%ZZ"},
      {"%F", "%F"},
      {"raw FF", "\xFF"},
      {"raw DEL", "\x7F"},
      {"%0D%0A", "a%0D%0Ab"},
      {"%3A", "a%3Ab"},
      {"colon", "a:b"},
      {"trailing hyphen", "a-"},
      {"underscore", "a_b"},
      {"digit first", "9x"},
      {"bidi override", "a%E2%80%AEb"},
      {"C1 control", "a%C2%85b"},
      {"tilde", "~"},
  };
}

struct Route {
  std::string method;
  std::string path;  // with {v} {p} {z} {id} {op} {host} {new}
  std::string body;
};

std::vector<Route> Routes() {
  const std::string qrs = "/{v}/projects/{p}/locations/{z}/queuedResources";
  const std::string nodes = "/{v}/projects/{p}/locations/{z}/nodes";
  return {
      {"POST", qrs + "?queued_resource_id={new}", SimpleBody()},
      {"GET", qrs, ""},
      {"GET", qrs + "/{id}", ""},
      {"DELETE", qrs + "/{id}", ""},
      {"POST", qrs + "/{id}:reset", ""},
      {"GET", "/{v}/projects/{p}/locations/{z}/operations/{op}", ""},
      {"GET", "/internal/v1/queuedResources/{id}/workers", ""},
      {"GET", "/internal/v1/queuedResources/{id}/operations", ""},
      {"GET", "/internal/v1/queuedResources/{id}/logs", ""},
      {"POST", "/internal/v1/hosts/{host}:heartbeat", "{\"workers\":[]}"},
      {"POST", "/internal/v1/hosts/{host}:fail", ""},
      {"GET", "/internal/v1/hosts", ""},
      {"GET", "/internal/v1/capacity", ""},
      // What gcloud's ssh, scp and tpu-vm call (node_access.h, node_api.h).
      {"PATCH", nodes + "/{id}-0?updateMask=metadata",
       "{\"metadata\":{\"ssh-keys\":\"root:ssh-ed25519 AAAAC3Nz root\"}}"},
      {"POST", nodes + "/{id}-0:getGuestAttributes", "{\"workerIds\":[\"\"]}"},
      {"POST", nodes + "?nodeId={new}",
       "{\"acceleratorType\":\"cpu-1\",\"runtimeVersion\":\"v\"}"},
      {"DELETE", nodes + "/{id}-0", ""},
      {"POST", nodes + "/{id}-0:simulateMaintenanceEvent", "{}"},
      {"POST", nodes + "/{id}-0:stop", "{}"},
      {"POST", "/{v}/projects/{p}/locations/{z}:generateServiceIdentity", "{}"},
      {"GET", "/compute/v1/projects/{p}", ""},
  };
}

// Paths no route takes (the 404 must be a google.rpc.Status too).
std::vector<std::string> UnknownPaths() {
  const std::string qrs =
      "/v2alpha1/projects/proj/locations/us-test1-a/queuedResources";
  return {"/",
          "*",
          "/v2alpha1",
          "/v2alpha1/",
          "/v2alpha1/projects",
          "/v3",
          "/v3/projects/proj/locations/us-test1-a/queuedResources",
          "/V2ALPHA1/projects/proj/locations/us-test1-a/queuedResources",
          "/" + qrs,
          qrs + "/",
          qrs + "/a/b",
          qrs + "/a:resetx",
          qrs + "/a:reset:reset",
          "/v2alpha1/projects/proj/locations/us-test1-a/operations",
          "/internal",
          "/internal/v1",
          "/internal/v1/hosts/",
          "/internal/v1/hosts:registerx",
          "/internal/v1/queuedResources//logs",
          "/%FF",
          "/..",
          "/../../etc/passwd",
          "http://127.0.0.1" + qrs};
}

// Odd values of every query parameter.
std::vector<std::string> QueryValues() {
  return {"%FF",
          "-1",
          "1e9",
          "99999999999999999999999",
          "1001",
          "0",
          "abc",
          "",
          "%00",
          "+1",
          "%201",
          "0x10",
          "1.5",
          "%",
          "..",
          ".",
          "-x",
          "TRUE",
          "yes",
          std::string(79, 'a') + "%C3%A9",
          std::string(2000, '9'),
          "%uD800",
          "a%26b"};
}

// Odd query strings as a whole.
std::vector<std::string> QueryStrings() {
  return {"queued_resource_id",
          "queued_resource_id=",
          "queued_resource_id=a&queued_resource_id=b",
          "&&&",
          "=&=&=",
          "?",
          "a?b?c",
          "queued_resource_id[]=a",
          "%FF=%FF",
          std::string(5000, '&'),
          "x=" + std::string(9000, 'x')};
}

void ReplaceAll(std::string& text, const std::string& from,
                const std::string& to) {
  for (size_t at = text.find(from); at != std::string::npos;
       at = text.find(from, at + to.size())) {
    text.replace(at, from.size(), to);
  }
}

}  // namespace

std::string Corpus::ExistingId() const {
  return options_.existing_ids.empty() ? std::string("fz-none")
                                       : options_.existing_ids.front();
}

std::string Corpus::FillRoute(std::string path, const std::string& slot,
                              const std::string& value) {
  const std::vector<std::pair<std::string, std::string>> defaults = {
      {"{v}", "v2alpha1"},
      {"{p}", options_.project},
      {"{z}", options_.zone},
      {"{id}", ExistingId()},
      {"{op}", "operation-0123456789abcdef"},
      {"{host}", "host-none"},
      {"{new}", NextId()}};
  for (const auto& [name, fallback] : defaults) {
    ReplaceAll(path, name, name == slot ? value : fallback);
  }
  return path;
}

std::vector<FuzzRequest> Corpus::PathCases() {
  std::vector<FuzzRequest> out;
  for (const Route& route : Routes()) {
    for (const char* slot :
         {"{v}", "{p}", "{z}", "{id}", "{op}", "{host}", "{new}"}) {
      if (route.path.find(slot) == std::string::npos) continue;
      for (const auto& [kind, value] : SegmentOddities()) {
        out.push_back(MakeRequest(
            route.method + " " + route.path + " with " + slot + " = " + kind,
            route.method, FillRoute(route.path, slot, value), route.body));
      }
    }
    for (const char* method : {"GET", "POST", "PUT", "PATCH", "DELETE", "HEAD",
                               "OPTIONS", "TRACE", "CONNECT"}) {
      if (route.method == method) continue;
      out.push_back(MakeRequest(std::string(method) + " on " + route.path,
                                method, FillRoute(route.path, "", ""),
                                route.body));
    }
  }
  for (const std::string& path : UnknownPaths()) {
    out.push_back(MakeRequest("unknown path " + path, "GET", path));
  }
  return out;
}

std::vector<FuzzRequest> Corpus::QueryCases() {
  std::vector<FuzzRequest> out;
  const std::string qrs = ApiBase() + "/queuedResources";
  const std::string id = ExistingId();
  for (const std::string& v : QueryValues()) {
    out.push_back(Create("queued_resource_id = '" + v + "'", SimpleBody()));
    out.back().target = qrs + "?queued_resource_id=" + v;
    out.push_back(
        MakeRequest("pageSize = '" + v + "'", "GET", qrs + "?pageSize=" + v));
    out.push_back(
        MakeRequest("pageToken = '" + v + "'", "GET", qrs + "?pageToken=" + v));
    out.push_back(MakeRequest("force = '" + v + "' on an existing QR", "DELETE",
                              qrs + "/" + id + "?force=" + v));
    out.push_back(
        MakeRequest("logs bytes = '" + v + "'", "GET",
                    "/internal/v1/queuedResources/" + id + "/logs?bytes=" + v));
  }
  for (const std::string& q : QueryStrings()) {
    out.push_back(
        Create("create query '" + Printable(q, 40) + "'", SimpleBody()));
    out.back().target = qrs + "?" + q;
    out.push_back(MakeRequest("list query '" + Printable(q, 40) + "'", "GET",
                              qrs + "?" + q));
  }
  const std::string every_zone =
      "/v2/projects/" + options_.project + "/locations/-/queuedResources";
  out.push_back(
      MakeRequest("list every zone", "GET", every_zone + "?pageSize=1"));
  out.push_back(MakeRequest("create in zone '-'", "POST",
                            every_zone + "?queued_resource_id=" + NextId(),
                            SimpleBody()));
  return out;
}

std::vector<FuzzRequest> Corpus::InternalCases() {
  std::vector<FuzzRequest> out;
  // Hosts nobody asks for (cpu-1 at a closed port), so that a register
  // the controller accepts cannot take the corpus's creates.
  const json reg = {{"hostname", "fuzz-host"},
                    {"zone", options_.zone},
                    {"acceleratorType", "cpu-1"},
                    {"agentAddress", "127.0.0.1:1"},
                    {"workdir", "/nonexistent"}};
  std::vector<json::json_pointer> fields;
  CollectPointers(reg, json::json_pointer(), fields);
  for (const auto& at : fields) {
    for (const auto& [kind, raw] : ValueKinds()) {
      out.push_back(MakeRequest("register " + at.to_string() + " = " + kind,
                                "POST", "/internal/v1/hosts:register",
                                WithRaw(reg, at, raw)));
    }
  }
  for (const auto& body :
       {std::string(), std::string("null"), std::string("[]"),
        DeepArrays(16000), DeepObjects(16000), std::string("{\xFF}")}) {
    out.push_back(MakeRequest("register body '" + Printable(body, 20) + "'",
                              "POST", "/internal/v1/hosts:register", body));
  }
  for (const auto& [host, secret] : options_.hosts) {
    AddHeartbeatCases(host, secret, out);
  }
  return out;
}

void Corpus::AddHeartbeatCases(const std::string& host,
                               const std::string& secret,
                               std::vector<FuzzRequest>& out) {
  const json beat = {{"workers", json::array()}};
  const std::string path = "/internal/v1/hosts/" + host + ":heartbeat";
  auto add = [&](const std::string& label, const std::string& body) {
    out.push_back(MakeRequest(label, "POST", path, body));
    out.back().token = secret;
    // The stored workers, shown by the host listing.
    out.push_back(
        MakeRequest("hosts after " + label, "GET", "/internal/v1/hosts"));
  };
  for (const auto& [kind, raw] : ValueKinds()) {
    add("heartbeat workers = " + kind,
        WithRaw(beat, json::json_pointer("/workers"), raw));
    // What the host's sshd applied (node_access.h NoteSshApplied).
    add("heartbeat ssh = " + kind,
        WithRaw(beat, json::json_pointer("/ssh"), raw));
    add("heartbeat ssh.generation = " + kind,
        WithRaw({{"workers", json::array()}, {"ssh", {{"owner", "x"}}}},
                json::json_pointer("/ssh/generation"), raw));
  }
  // Nested 16,000 deep, not deeper: 100,000 kills the controller (see
  // api_fuzz_test's HeartbeatWithDeeplyNestedWorkers...).
  for (const std::string& w :
       {std::string("[{\"pid\":\"x\",\"state\":\"RUNNING\"}]"),
        std::string("[{\"pid\":1e300,\"state\":\"RUNNING\"}]"),
        std::string("[{\"pid\":99999999999999,\"state\":\"RUNNING\"}]"),
        std::string("[{\"state\":7}]"), std::string("[1,\"x\",null]"),
        "[" + DeepArrays(16000) + "]", "[" + DeepObjects(16000) + "]"}) {
    add("heartbeat workers " + Printable(w, 40), "{\"workers\":" + w + "}");
  }
  add("heartbeat with an empty body", "");
  add("heartbeat, not JSON", "{\xFF");
  add("heartbeat of 16000 nested arrays", DeepArrays(16000));
}

// ------------------------------------------------------- random requests

std::string Corpus::MutateBody(std::string text) {
  const json tree = json::parse(text, nullptr, false);
  switch (rng_() % 7) {
    case 0:
      if (!tree.is_discarded() && tree.is_structured() && !tree.empty()) {
        std::vector<json::json_pointer> pointers;
        CollectPointers(tree, json::json_pointer(), pointers);
        const auto& kinds = ValueKinds();
        return WithRaw(tree, pointers[rng_() % pointers.size()],
                       kinds[rng_() % kinds.size()].second);
      }
      [[fallthrough]];
    case 1:
      if (!text.empty()) text[rng_() % text.size()] = static_cast<char>(rng_());
      return text;
    case 2: {
      std::string bytes(1 + rng_() % 8, '\0');
      for (char& c : bytes) c = static_cast<char>(rng_());
      return text.insert(text.empty() ? 0 : rng_() % text.size(), bytes);
    }
    case 3:
      if (!text.empty()) text.erase(rng_() % text.size(), 1 + rng_() % 16);
      return text;
    case 4:
      return text.substr(0, text.empty() ? 0 : rng_() % text.size());
    case 5: {
      const size_t at = text.empty() ? 0 : rng_() % text.size();
      return text.insert(at, text.substr(at, rng_() % 64));
    }
    default: {
      static const char kStructural[] = "[]{},:\"\\";
      return text.insert(text.empty() ? 0 : rng_() % text.size(), 1,
                         kStructural[rng_() % (sizeof(kStructural) - 1)]);
    }
  }
}

FuzzRequest Corpus::RandomRoute() {
  const std::vector<Route> routes = Routes();
  const Route& route = routes[rng_() % routes.size()];
  const auto oddities = SegmentOddities();
  std::string path = route.path;
  if (rng_() % 2 == 0) ReplaceAll(path, "{v}", "v2");
  for (const char* slot :
       {"{v}", "{p}", "{z}", "{id}", "{op}", "{host}", "{new}"}) {
    if (rng_() % 3 == 0) {
      ReplaceAll(path, slot, oddities[rng_() % oddities.size()].second);
    }
  }
  path = FillRoute(path, "", "");
  static const char* kMethods[] = {"GET", "POST", "DELETE", "PUT", "HEAD"};
  const bool same_method = rng_() % 4 != 0;
  return MakeRequest("random route " + route.path,
                     same_method ? route.method : kMethods[rng_() % 5], path,
                     route.body.empty() ? "" : MutateBody(route.body),
                     rng_() % 16 != 0);
}

FuzzRequest Corpus::RandomRequest() {
  if (rng_() % 10 < 3) return RandomRoute();
  const std::vector<std::string> bodies = ValidBodies();
  std::string body = bodies[rng_() % bodies.size()];
  const int mutations = 1 + static_cast<int>(rng_() % 3);
  for (int i = 0; i < mutations; ++i) body = MutateBody(std::move(body));
  return Create("random body mutation", std::move(body), rng_() % 2 == 0);
}

// ------------------------------------------------------------- raw bytes

namespace {

// Requests broken at the HTTP level: request lines, headers, lengths,
// chunking, encodings, credentials. `post` is the start of a create
// request (its request line and token), `body` a valid create body.
std::vector<std::string> BrokenHttp(const std::string& token,
                                    const std::string& post,
                                    const std::string& body) {
  const std::string auth = "Authorization: Bearer " + token + "\r\n";
  return {
      "",
      "\r\n\r\n",
      "GET / HTTP/1.1\r\n\r\n",
      "GET / HTTP/2.0\r\n\r\n",
      "GET / HTTP/1.2\r\n\r\n",
      "GET / http/1.1\r\n\r\n",
      "GET /\r\n\r\n",
      "GET / HTTP/1.1\n\n",
      "FOO / HTTP/1.1\r\n\r\n",
      "get / HTTP/1.1\r\n\r\n",
      "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
      "GET  / HTTP/1.1\r\n\r\n",
      "GET " + std::string(9000, 'a') + " HTTP/1.1\r\n\r\n",
      "GET /internal/v1/hosts HTTP/1.1\r\nno colon here\r\n\r\n",
      "GET /internal/v1/hosts HTTP/1.1\r\nX: " + std::string(10000, 'x') +
          "\r\n\r\n",
      "GET /internal/v1/hosts HTTP/1.1\r\nX: a\0b\r\n\r\n",
      "GET /internal/v1/hosts HTTP/1.0\r\n" + auth + "\r\n",
      "GET /internal/v1/hosts HTTP/1.1\r\n" + auth + "Range: bytes=x\r\n\r\n",
      "GET /internal/v1/hosts HTTP/1.1\r\n" + auth + "Range: bytes=0-3\r\n\r\n",
      "GET /internal/v1/hosts HTTP/1.1\r\nAuthorization: Bearer\r\n\r\n",
      "GET /internal/v1/hosts HTTP/1.1\r\nAuthorization: bearer " + token +
          "\r\n\r\n",
      "GET /internal/v1/hosts HTTP/1.1\r\nAuthorization: Bearer  " + token +
          "\r\n\r\n",
      "GET /internal/v1/hosts HTTP/1.1\r\nAuthorization: Basic eDp5\r\n\r\n",
      post + "Content-Length: -1\r\n\r\n" + body,
      post + "Content-Length: abc\r\n\r\n" + body,
      post + "Content-Length: 18446744073709551616\r\n\r\n" + body,
      post + "Content-Length: 99999999999\r\n\r\n" + body,
      post + "Content-Length: 100000\r\n\r\n" + body,
      post + "Content-Length: 5\r\nContent-Length: 500\r\n\r\n" + body,
      post + "Transfer-Encoding: chunked\r\n\r\nzz\r\n" + body,
      post + "Transfer-Encoding: chunked\r\n\r\nFFFFFFFFFFFFFFFF\r\n" + body,
      post + "Transfer-Encoding: chunked\r\n\r\n-5\r\n" + body,
      post + "Transfer-Encoding: chunked\r\n\r\n5\r\nab",
      post + "Transfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n0\r\n\r\n",
      post + "Content-Encoding: gzip\r\nContent-Length: " +
          std::to_string(body.size()) + "\r\n\r\n" + body,
      post +
          "Content-Encoding: deflate\r\nContent-Length: 4\r\n\r\n\x1f\x8b"
          "xx",
      post + "Content-Encoding: br\r\nContent-Length: 4\r\n\r\nabcd",
      post + "Content-Encoding: compress\r\nContent-Length: 4\r\n\r\nabcd",
      post + "Expect: 100-continue\r\nContent-Length: " +
          std::to_string(body.size()) + "\r\n\r\n" + body,
      post + "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" +
          body + "GET / HTTP/1.1\r\n\r\n",
      post + "Content-Length: " + std::to_string(body.size() + 10) +
          "\r\n\r\n" + body,
  };
}

}  // namespace

std::vector<std::string> Corpus::RawCases(const std::string& token,
                                          int random_count) {
  const std::string auth = "Authorization: Bearer " + token + "\r\n";
  const std::string post = "POST " + ApiBase() +
                           "/queuedResources?queued_resource_id=" + NextId() +
                           " HTTP/1.1\r\n" + auth;
  std::vector<std::string> out = BrokenHttp(token, post, SimpleBody());
  // Kept packed: clang-format puts each word ending in \n on its own line.
  // clang-format off
  const std::string words[] = {
      "GET", "POST", "DELETE", " ", "/", "/v2alpha1/projects/proj", "?", "&",
      "=", "%FF", "HTTP/1.1", "\r\n", "\r\n\r\n", ":", "Content-Length",
      "Transfer-Encoding: chunked", "0", "9", "{", "}", "\xFF", auth};
  // clang-format on
  for (int i = 0; i < random_count; ++i) {
    std::string bytes;
    if (i % 2 == 0) {
      bytes.resize(1 + rng_() % (i % 8 == 0 ? 8192 : 512));
      for (char& c : bytes) c = static_cast<char>(rng_());
    } else {
      const int count = 1 + static_cast<int>(rng_() % 40);
      for (int w = 0; w < count; ++w) {
        bytes += words[rng_() % std::size(words)];
      }
    }
    out.push_back(std::move(bytes));
  }
  return out;
}

// -------------------------------------------------------------- libFuzzer

namespace {

// `field` safe inside a request line: the bytes that would end it (space,
// CR, LF, NUL, '#') percent-encoded, every other byte as is.
std::string LineSafe(std::string_view field) {
  std::string out;
  for (const char c : field) {
    if (c == ' ' || c == '\r' || c == '\n' || c == '\0' || c == '#' ||
        c == '\t') {
      char hex[4];
      std::snprintf(hex, sizeof(hex), "%%%02X", static_cast<unsigned char>(c));
      out += hex;
    } else {
      out += c;
    }
  }
  return out;
}

}  // namespace

FuzzRequest RequestFromBytes(std::string_view data,
                             const CorpusOptions& options) {
  static const char* kMethods[] = {"GET",  "POST",  "DELETE", "PUT",
                                   "HEAD", "PATCH", "OPTIONS"};
  const auto byte = [&](size_t i) {
    return i < data.size() ? static_cast<unsigned char>(data[i]) : 0;
  };
  FuzzRequest r;
  r.label = "libFuzzer input";
  r.method = kMethods[byte(0) % 7];
  const int route = byte(1);
  r.authenticated = (byte(2) & 1) == 0;
  const std::string version = (byte(2) & 2) ? "v2" : "v2alpha1";
  std::string_view rest = data.size() > 3 ? data.substr(3) : "";
  std::string fields[4];
  for (std::string& field : fields) {
    const size_t newline = rest.find('\n');
    field = LineSafe(rest.substr(0, newline));
    rest = newline == std::string_view::npos ? "" : rest.substr(newline + 1);
  }
  r.body = std::string(rest);
  const std::string id = options.existing_ids.empty()
                             ? std::string("fz-none")
                             : options.existing_ids.front();
  const std::string base =
      "/" + version + "/projects/" + fields[0] + "/locations/" + fields[1];
  const std::string query = fields[3].empty() ? "" : "?" + fields[3];
  switch (route % 10) {
    case 0:
      r.target = base + "/queuedResources?queued_resource_id=" + fields[2] +
                 (fields[3].empty() ? "" : "&" + fields[3]);
      break;
    case 1:
      r.target = base + "/queuedResources" + query;
      break;
    case 2:
      r.target = base + "/queuedResources/" + fields[2] + query;
      break;
    case 3:
      r.target = base + "/queuedResources/" + fields[2] + ":reset" + query;
      break;
    case 4:
      r.target = base + "/operations/" + fields[2] + query;
      break;
    case 5:
      r.target = "/internal/v1/queuedResources/" +
                 (fields[2].empty() ? id : fields[2]) + "/" + fields[0] + query;
      break;
    case 6:
      r.target = "/internal/v1/hosts" + fields[0] + query;
      break;
    case 7:
      r.target = "/" + version + "/projects/" + options.project +
                 "/locations/" + options.zone + fields[0] + query;
      break;
    case 8:  // a heartbeat of a registered host, with its secret
      if (!options.hosts.empty()) {
        r.target = "/internal/v1/hosts/" + options.hosts.front().first +
                   ":heartbeat" + query;
        r.token = options.hosts.front().second;
        break;
      }
      [[fallthrough]];
    default:
      r.target = "/" + fields[0] + query;
      break;
  }
  return r;
}

}  // namespace multislice::control::fuzz
