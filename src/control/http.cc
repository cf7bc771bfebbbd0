// Token file, JSON client and error shape of the control plane's HTTP
// channels (see http.h and docs/control-protocol.md).
#include "control/http.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>

namespace multislice::control {
namespace {

std::string Trimmed(std::string text) {
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back())))
    text.pop_back();
  size_t start = 0;
  while (start < text.size() &&
         std::isspace(static_cast<unsigned char>(text[start])))
    ++start;
  return text.substr(start);
}

const char* StatusNameFor(int code) {
  switch (code) {
    case 400:
      return "INVALID_ARGUMENT";
    case 401:
      return "UNAUTHENTICATED";
    case 403:
      return "PERMISSION_DENIED";
    case 404:
      return "NOT_FOUND";
    case 409:
      return "ALREADY_EXISTS";
    case 413:
      return "INVALID_ARGUMENT";
    case 503:
      return "UNAVAILABLE";
    default:
      return code >= 500 ? "INTERNAL" : "UNKNOWN";
  }
}

}  // namespace

Result<std::string> RandomHex(size_t bytes) {
  std::ifstream in("/dev/urandom", std::ios::binary);
  std::string raw(bytes, '\0');
  if (!in.read(raw.data(), static_cast<std::streamsize>(bytes))) {
    return Internal("cannot read /dev/urandom");
  }
  static const char kHex[] = "0123456789abcdef";
  std::string out;
  for (unsigned char c : raw) {
    out.push_back(kHex[c >> 4]);
    out.push_back(kHex[c & 15]);
  }
  return out;
}

Result<std::string> ReadToken(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return InvalidArgument("token file " + path +
                           ": cannot read it: " + std::strerror(errno));
  }
  struct stat st {};
  std::string text;
  Status checked = OkStatus();
  if (::fstat(fd, &st) != 0) {
    checked = InvalidArgument("token file " + path +
                              ": cannot stat it: " + std::strerror(errno));
  } else if (!S_ISREG(st.st_mode)) {
    checked = InvalidArgument("token file " + path + " is not a regular file");
  } else if ((st.st_mode & 077) != 0) {
    char mode[8];
    std::snprintf(mode, sizeof(mode), "%04o",
                  static_cast<unsigned>(st.st_mode & 07777));
    checked = InvalidArgument(
        "token file " + path + " is readable or writable by group or others " +
        "(mode " + mode + "); make it private with chmod 600 " + path);
  } else {
    char buf[4096 + 2];
    ssize_t n = 0;
    while (text.size() <= kMaxTokenBytes &&
           (n = ::read(fd, buf, sizeof(buf))) > 0) {
      text.append(buf, static_cast<size_t>(n));
    }
    if (n < 0) {
      checked = InvalidArgument("token file " + path +
                                ": cannot read it: " + std::strerror(errno));
    }
  }
  ::close(fd);
  RETURN_IF_ERROR(checked);
  std::string token = Trimmed(std::move(text));
  if (token.empty()) return InvalidArgument("token file " + path + " is empty");
  if (token.size() > kMaxTokenBytes) {
    return InvalidArgument("token file " + path + " is longer than " +
                           std::to_string(kMaxTokenBytes) + " bytes");
  }
  if (token.size() < kMinTokenChars) {
    return InvalidArgument(
        "token file " + path + " holds a token of " +
        std::to_string(token.size()) + " characters; at least " +
        std::to_string(kMinTokenChars) +
        " are required (delete the file to have the controller create one)");
  }
  return token;
}

Result<std::string> LoadOrCreateToken(const std::string& path) {
  if (::access(path.c_str(), F_OK) == 0) return ReadToken(path);
  ASSIGN_OR_RETURN(std::string token, RandomHex(32));
  // Write a private temporary file, then link it into place: link() fails
  // when the name exists, so two processes racing agree on one token and a
  // reader never sees a partial file.
  std::string temp = path + ".tmp." + std::to_string(::getpid());
  ::unlink(temp.c_str());  // a stale one of a dead process with this pid
  int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) {
    return Internal("token file " + path + ": cannot create " + temp + ": " +
                    std::strerror(errno));
  }
  std::string line = token + "\n";
  bool wrote = ::fchmod(fd, 0600) == 0 &&
               ::write(fd, line.data(), line.size()) ==
                   static_cast<ssize_t>(line.size()) &&
               ::fsync(fd) == 0;
  ::close(fd);
  if (!wrote) {
    ::unlink(temp.c_str());
    return Internal("token file " + path + ": cannot write " + temp);
  }
  int linked = ::link(temp.c_str(), path.c_str());
  int link_errno = errno;
  ::unlink(temp.c_str());
  if (linked != 0 && link_errno != EEXIST) {
    return Internal("token file " + path +
                    ": cannot create it: " + std::strerror(link_errno));
  }
  if (linked != 0) return ReadToken(path);  // another process won the race
  return token;
}

Result<ApiClient> ApiClient::Create(std::string base_url, std::string token,
                                    std::chrono::milliseconds timeout) {
  const std::string kScheme = "http://";
  if (base_url.rfind(kScheme, 0) != 0) {
    return InvalidArgument("controller URL '" + base_url +
                           "' does not start with http://");
  }
  while (!base_url.empty() && base_url.back() == '/') base_url.pop_back();
  std::string host_port = base_url.substr(kScheme.size());
  size_t colon = host_port.rfind(':');
  if (host_port.empty() || host_port.find('/') != std::string::npos ||
      colon == std::string::npos || colon == 0 ||
      colon + 1 == host_port.size()) {
    return InvalidArgument("controller URL '" + base_url +
                           "' is not http://HOST:PORT");
  }
  for (size_t i = colon + 1; i < host_port.size(); ++i) {
    if (!std::isdigit(static_cast<unsigned char>(host_port[i]))) {
      return InvalidArgument("controller URL '" + base_url +
                             "' has a port that is not a number");
    }
  }
  if (timeout.count() <= 0) {
    return InvalidArgument("client timeout must be positive");
  }
  return ApiClient(std::move(base_url), std::move(token), timeout);
}

Result<HttpResponse> ApiClient::Call(std::string_view method,
                                     const std::string& path,
                                     const nlohmann::json* body) const {
  httplib::Client client(base_url_);
  const auto seconds =
      std::chrono::duration_cast<std::chrono::seconds>(timeout_);
  const auto micros =
      std::chrono::duration_cast<std::chrono::microseconds>(timeout_ - seconds);
  client.set_connection_timeout(seconds.count(), micros.count());
  client.set_read_timeout(seconds.count(), micros.count());
  client.set_write_timeout(seconds.count(), micros.count());
  client.set_keep_alive(false);
  client.set_tcp_nodelay(true);
  httplib::Headers headers = {{"Authorization", "Bearer " + token_}};
  std::string payload;
  if (body != nullptr) {
    try {
      payload = body->dump();
    } catch (const nlohmann::json::exception& e) {
      return InvalidArgument("request body for " + path +
                             " is not valid JSON text: " + e.what());
    }
  }
  const char* kType = "application/json";
  httplib::Result result{nullptr, httplib::Error::Unknown};
  if (method == "GET") {
    result = client.Get(path, headers);
  } else if (method == "POST") {
    result = client.Post(path, headers, payload, kType);
  } else if (method == "PUT") {
    result = client.Put(path, headers, payload, kType);
  } else if (method == "DELETE") {
    result = client.Delete(path, headers, payload, kType);
  } else if (method == "PATCH") {
    result = client.Patch(path, headers, payload, kType);
  } else {
    return Internal("unsupported HTTP method " + std::string(method));
  }
  if (!result) {
    return Unavailable("cannot reach " + base_url_ + path + ": " +
                       httplib::to_string(result.error()));
  }
  HttpResponse response;
  response.status = result->status;
  if (!result->body.empty()) {
    response.body = nlohmann::json::parse(result->body, nullptr,
                                          /*allow_exceptions=*/false);
    if (response.body.is_discarded()) response.body = result->body;
  }
  return response;
}

Status ErrorFromResponse(const HttpResponse& response) {
  std::string message;
  const nlohmann::json& body = response.body;
  if (body.is_object() && body.contains("error") && body["error"].is_object() &&
      body["error"].contains("message") &&
      body["error"]["message"].is_string()) {
    message = body["error"]["message"].get<std::string>();
  } else if (body.is_string()) {
    message = body.get<std::string>();
  } else if (!body.is_null()) {
    message = body.dump();
  }
  if (message.empty()) message = "HTTP " + std::to_string(response.status);
  switch (response.status) {
    case 400:
    case 401:
    case 413:
      return InvalidArgument(message);
    case 404:
      return NotFound(message);
    case 409:
    case 412:
      return FailedPrecondition(message);
    default:
      return Internal(message);
  }
}

void WriteJson(httplib::Response& res, int http_code,
               const nlohmann::json& body) {
  res.status = http_code;
  // Replace bytes that are not UTF-8 (a message quoting a request's bytes)
  // rather than throw, which would turn any answer into a 500.
  res.set_content(
      body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace),
      "application/json");
}

void WriteError(httplib::Response& res, int http_code,
                std::string_view status_name, std::string_view message) {
  nlohmann::json body = {
      {"error",
       {{"code", http_code},
        {"message", std::string(message)},
        {"status", status_name.empty() ? std::string(StatusNameFor(http_code))
                                       : std::string(status_name)}}}};
  WriteJson(res, http_code, body);
}

bool ConstantTimeEquals(std::string_view a, std::string_view b) {
  // Compare over the longer length so the time does not reveal where the
  // first difference is; the length difference is folded in.
  size_t n = std::max(a.size(), b.size());
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < n; ++i) {
    unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
    diff |= static_cast<unsigned char>(x ^ y);
  }
  return diff == 0;
}

bool HasBearer(const httplib::Request& req, const std::string& token) {
  const std::string header = req.get_header_value("Authorization");
  const std::string kPrefix = "Bearer ";
  return header.size() > kPrefix.size() &&
         header.compare(0, kPrefix.size(), kPrefix) == 0 &&
         ConstantTimeEquals(std::string_view(header).substr(kPrefix.size()),
                            token);
}

bool RequireBearer(const httplib::Request& req, httplib::Response& res,
                   const std::string& token) {
  const bool ok = HasBearer(req, token);
  if (!ok) {
    const std::string header = req.get_header_value("Authorization");
    WriteError(res, 401, "UNAUTHENTICATED",
               header.empty() ? "missing Authorization: Bearer token"
                              : "invalid bearer token");
  }
  return ok;
}

}  // namespace multislice::control
