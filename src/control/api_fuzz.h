// A fuzz driver for the controller's HTTP API (issue 12: no request can
// crash the controller, wedge it, or get a 5xx). It owns:
//   - the wire: a request written byte for byte on a fresh loopback
//     connection (nothing encoded or checked on the way, so a path may hold
//     any byte), and the answer read back with a deadline;
//   - the checks every answer must pass (CheckApiAnswer);
//   - the corpus: structured cases (every field x every JSON type, deep
//     nesting, bad UTF-8, path and query oddities of every route), seeded
//     random mutations, and whole requests of raw bytes;
//   - the mapping of a libFuzzer input to one request (RequestFromBytes).
// Shared by api_fuzz_test (GoogleTest, bounded, in CI) and
// api_fuzz_libfuzzer (optional, clang only).
//
// Thread-safety: the free functions are pure or touch only their own
// socket; a Corpus is used from one thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <random>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace multislice::control::fuzz {

// One HTTP/1.1 request as sent.
struct FuzzRequest {
  std::string label;  // the case, for failure messages ("body: tags = null")
  std::string method = "GET";
  std::string target;  // path and query as written in the request line
  std::string body;
  bool authenticated = true;  // Authorization: Bearer <token>
  std::string token;          // when not empty, sent instead of <token>
  std::vector<std::pair<std::string, std::string>> headers;  // extra ones
};

FuzzRequest MakeRequest(std::string label, std::string method,
                        std::string target, std::string body = "",
                        bool authenticated = true);

struct FuzzAnswer {
  bool answered = false;  // a status line and headers came back
  int status = 0;
  std::string headers;  // the header block, status line included
  std::string body;
  std::string failure;  // why not answered: "timeout ...", "closed ..."
  double ms = 0;        // from connect to the last byte read
};

// How long one request may take before the controller counts as wedged.
inline constexpr std::chrono::milliseconds kAnswerTimeout{8000};

// Writes `bytes` on a new connection to 127.0.0.1:port and reads one
// answer: the headers, then Content-Length bytes of body (or up to EOF),
// for at most `timeout`. When `end_after` is not negative and nothing has
// come back that long after the write, half-closes the connection, so
// that a server waiting for the rest of an incomplete request sees its
// end (cpp-httplib then answers nothing: it writes no answer to a peer
// that shut its side, so a complete request is never half-closed). Never
// throws; never raises SIGPIPE.
FuzzAnswer SendBytes(
    int port, std::string_view bytes,
    std::chrono::milliseconds timeout = kAnswerTimeout,
    std::chrono::milliseconds end_after = std::chrono::milliseconds(-1));

// Like SendBytes, but writes `bytes` in `pieces` parts with `gap` between
// them (a slow client).
FuzzAnswer SendSlowly(int port, std::string_view bytes, int pieces,
                      std::chrono::milliseconds gap);

// Writes the first `bytes` of a request and closes the connection without
// reading (a client that goes away mid-request).
void SendAndAbandon(int port, std::string_view bytes);

// `request` as HTTP/1.1 bytes: Host, the bearer token when authenticated,
// Content-Length (always for POST/PUT/PATCH/DELETE, else when there is a
// body), Connection: close, then the extra headers and the body.
std::string Serialize(const FuzzRequest& request, const std::string& token);

FuzzAnswer Send(int port, const std::string& token, const FuzzRequest& request,
                std::chrono::milliseconds timeout = kAnswerTimeout);

// "" when `answer` is what issue 12 requires of an API answer: it came
// back, its status is below 500, a 2xx body (other than HEAD's) is JSON,
// and every other answer's body is a google.rpc.Status object: {"error":
// {"code": <the HTTP status>, "message": <a string>, ...}}, valid UTF-8.
// Otherwise one sentence saying what is wrong. Paths under /console (the
// console's files, not the API) are held only to the status rule.
std::string CheckApiAnswer(const FuzzRequest& request,
                           const FuzzAnswer& answer);

// The error message of a google.rpc.Status answer; "" if there is none.
std::string ErrorMessage(const FuzzAnswer& answer);

// `bytes` safe to print: printable ASCII as is, other bytes as \xNN, cut
// after max_bytes input bytes (with the total length).
std::string Printable(std::string_view bytes, size_t max_bytes = 300);

// Valid create bodies as JSON text: the seed's, CpuBody-like ones (one and
// two slices, every tier, queueing policies), and one with every field
// the API takes.
std::vector<std::string> ValidBodies();
// The create body that sets every field the API takes (cpu-2, 2 slices).
std::string FullBody();
// A 1-slice cpu-2 create body that the controller accepts.
std::string SimpleBody(const std::string& startup_script = "sleep 1000");

// `depth` nested arrays ("[[...]]") or objects ({"a":{"a":...}}), closed
// or not.
std::string DeepArrays(int depth, bool closed = true);
std::string DeepObjects(int depth, bool closed = true);

struct CorpusOptions {
  std::string project = "proj";
  std::string zone = "us-test1-a";
  // Queued resources that exist: the targets of get, delete, reset and
  // the internal per-QR routes (none of the corpus's requests deletes or
  // resets them: their paths or queries are always invalid).
  std::vector<std::string> existing_ids = {"fz-existing"};
  // Registered hosts, id and the secret that authenticates their
  // heartbeats: heartbeats with odd bodies go to them (never :fail).
  std::vector<std::pair<std::string, std::string>> hosts;
  // Prefix of the ids of the corpus's creates (each create gets its own).
  std::string id_prefix = "fz";
};

class Corpus {
 public:
  Corpus(CorpusOptions options, uint32_t seed);

  // Every field x every JSON type, unknown and odd keys, deep nesting
  // (16,000 levels), bad UTF-8, overlong strings, truncations, empty and
  // non-JSON bodies, duplicate keys, BOMs, odd content types.
  std::vector<FuzzRequest> BodyCases();
  // Every route x every path segment x every oddity (%FF, %00, .., .,
  // -x, %, %2F, 79 'a' + 'é', long, uppercase, empty, ...), odd versions
  // and methods, unknown paths.
  std::vector<FuzzRequest> PathCases();
  // queued_resource_id, pageSize, pageToken, force, bytes: odd values;
  // odd query syntax.
  std::vector<FuzzRequest> QueryCases();
  // The internal API: register and heartbeat with odd bodies.
  std::vector<FuzzRequest> InternalCases();
  // One random request: a valid body or route with 1..3 random mutations.
  FuzzRequest RandomRequest();
  // Whole requests of raw bytes: random bytes, broken request lines and
  // headers, bad Content-Length and chunking, compressed garbage, ...
  std::vector<std::string> RawCases(const std::string& token, int random_count);

  std::mt19937& rng() { return rng_; }

 private:
  std::string NextId();
  std::string ExistingId() const;
  // `path` with its {slot}s filled: `slot` with `value`, the others with
  // valid values.
  std::string FillRoute(std::string path, const std::string& slot,
                        const std::string& value);
  std::string ApiBase(bool v2 = false) const;
  FuzzRequest Create(const std::string& label, std::string body,
                     bool v2 = false);
  void AddFieldTypeCases(const std::string& body_text,
                         std::vector<FuzzRequest>& out);
  void AddKeyCases(std::vector<FuzzRequest>& out);
  void AddDeepCases(std::vector<FuzzRequest>& out);
  void AddTextCases(std::vector<FuzzRequest>& out);
  void AddHeartbeatCases(const std::string& host, const std::string& secret,
                         std::vector<FuzzRequest>& out);
  std::string MutateBody(std::string text);
  FuzzRequest RandomRoute();

  CorpusOptions options_;
  std::mt19937 rng_;
  int next_id_ = 0;
};

// Maps a libFuzzer input to one request: byte 0 the method, byte 1 the
// route (create, list, get/delete, reset, operation, internal per-QR,
// hosts, any path under the default parent, a heartbeat of
// options.hosts[0] with its secret, any path), byte 2 flags (bit 0: no
// token; bit 1: /v2/), then up to four '\n'-separated fields (project or
// path, zone, id, extra query) and the rest as the body. Bytes that would end
// the request line (space, CR, LF, NUL, '#') are percent-encoded; every other
// byte is sent as is.
FuzzRequest RequestFromBytes(std::string_view data,
                             const CorpusOptions& options);

}  // namespace multislice::control::fuzz
