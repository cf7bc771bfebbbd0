// HTTP helpers shared by the controller, the host agent and the client:
// the bearer token file, a small JSON client and the google.rpc.Status error
// shape. See docs/control-protocol.md for the calls made with them.
//
// Thread-safety: ApiClient is immutable after Create(); Call() may be used
// from several threads at once (each call opens its own connection).
#pragma once

#include <httplib.h>

#include <chrono>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "common/status.h"

namespace multislice::control {

// The largest request or response body accepted, in bytes.
inline constexpr size_t kMaxBodyBytes = 1 << 20;

// Bounds on a bearer token read from a file, in characters.
inline constexpr size_t kMinTokenChars = 16;
inline constexpr size_t kMaxTokenBytes = 4096;

// Reads the token in `path` (ReadToken); when the file does not exist,
// creates it with mode 0600 holding 32 random bytes from /dev/urandom as
// 64 hex characters (atomically: a concurrent reader sees either no file
// or the whole token).
Result<std::string> LoadOrCreateToken(const std::string& path);

// Reads the token in `path` (surrounding whitespace removed).
// kInvalidArgument, one sentence naming the path and the reason, when the
// file is missing or unreadable, not a regular file, readable or writable
// by group or others (mode & 077, as ssh refuses private keys), empty,
// shorter than kMinTokenChars or longer than kMaxTokenBytes.
Result<std::string> ReadToken(const std::string& path);

struct HttpResponse {
  int status = 0;       // HTTP status code
  nlohmann::json body;  // parsed body; null when empty, a string if not JSON
};

class ApiClient {
 public:
  // base_url: "http://HOST:PORT" (no path); timeout bounds connecting,
  // sending and each read of the answer.
  static Result<ApiClient> Create(std::string base_url, std::string token,
                                  std::chrono::milliseconds timeout);

  // Sends `method` ("GET", "POST", "PUT", "DELETE") to base_url + path (path
  // starts with '/', may hold a query) with `body` as JSON when given.
  // Any HTTP answer is returned as is (check status); failing to connect or
  // a timeout is Unavailable naming the URL; a body that cannot be written
  // as JSON (a string that is not UTF-8) is InvalidArgument.
  Result<HttpResponse> Call(std::string_view method, const std::string& path,
                            const nlohmann::json* body = nullptr) const;

  const std::string& base_url() const { return base_url_; }
  std::chrono::milliseconds timeout() const { return timeout_; }

 private:
  ApiClient(std::string base_url, std::string token,
            std::chrono::milliseconds timeout)
      : base_url_(std::move(base_url)),
        token_(std::move(token)),
        timeout_(timeout) {}
  std::string base_url_;
  std::string token_;
  std::chrono::milliseconds timeout_;
};

// A non-2xx answer as a Status: the google.rpc.Status message when the body
// has one. 400 -> InvalidArgument, 404 -> NotFound, 409/412 ->
// FailedPrecondition, 401 -> InvalidArgument, 5xx and others -> Internal.
Status ErrorFromResponse(const HttpResponse& response);

// Writes {"error": {"code", "message", "status"}} with http_code.
void WriteError(httplib::Response& res, int http_code,
                std::string_view status_name, std::string_view message);

// Writes a JSON body with http_code. Never throws: bytes that are not
// UTF-8 in a string (a message quoting raw input) are written as U+FFFD.
void WriteJson(httplib::Response& res, int http_code,
               const nlohmann::json& body);

// `bytes` random bytes from the kernel, as hex: tokens and secrets.
Result<std::string> RandomHex(size_t bytes);

// Whether the request carries "Authorization: Bearer <token>" (compared in
// constant time); answers nothing.
bool HasBearer(const httplib::Request& req, const std::string& token);

// True when the request carries "Authorization: Bearer <token>"; otherwise
// writes 401 UNAUTHENTICATED and returns false. The compare takes the same
// time wherever the first difference is.
bool RequireBearer(const httplib::Request& req, httplib::Response& res,
                   const std::string& token);

// Whether a and b are equal, in time that depends only on their lengths.
bool ConstantTimeEquals(std::string_view a, std::string_view b);

}  // namespace multislice::control
