#include "control/http.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <thread>

#include "common/temp_dir.h"
#include "gtest/gtest.h"

namespace multislice::control {
namespace {

TEST(TokenTest, CreatedOnceWithMode0600AndReadBack) {
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  const std::string path = dir.path() + "/token";
  Result<std::string> first = LoadOrCreateToken(path);
  ASSERT_TRUE(first.ok()) << first.status().message();
  EXPECT_EQ(first->size(), 64u);
  EXPECT_EQ(first->find_first_not_of("0123456789abcdef"), std::string::npos);
  struct stat st {};
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  Result<std::string> second = LoadOrCreateToken(path);
  ASSERT_TRUE(second.ok());
  EXPECT_EQ(*second, *first);
  Result<std::string> read = ReadToken(path);
  ASSERT_TRUE(read.ok());
  EXPECT_EQ(*read, *first);
  // Two fresh tokens differ.
  Result<std::string> other = LoadOrCreateToken(dir.path() + "/token2");
  ASSERT_TRUE(other.ok());
  EXPECT_NE(*other, *first);
  // No temporary files are left behind.
  int files = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir.path())) {
    (void)e;
    ++files;
  }
  EXPECT_EQ(files, 2);
}

// Writes `text` to `path` with `mode` (whatever the umask).
void WriteFile(const std::string& path, const std::string& text, mode_t mode) {
  std::ofstream(path) << text;
  ASSERT_EQ(::chmod(path.c_str(), mode), 0);
}

TEST(TokenTest, ReadTokenNamesThePath) {
  TempDir dir;
  const std::string missing = dir.path() + "/nope";
  Result<std::string> r = ReadToken(missing);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find(missing), std::string::npos);
  const std::string empty = dir.path() + "/empty";
  WriteFile(empty, "  \n", 0600);
  r = ReadToken(empty);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(), "token file " + empty + " is empty");
  WriteFile(dir.path() + "/t", "  0123456789abcdef\n", 0600);
  r = ReadToken(dir.path() + "/t");
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(*r, "0123456789abcdef");
  r = ReadToken(dir.path());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(),
            "token file " + dir.path() + " is not a regular file");
}

TEST(TokenTest, RefusesFilesOthersCanReadAndShortTokens) {
  TempDir dir;
  const std::string path = dir.path() + "/token";
  for (mode_t mode : {0644, 0640, 0604, 0620, 0660}) {
    WriteFile(path, std::string(64, 'a') + "\n", mode);
    Result<std::string> r = ReadToken(path);
    ASSERT_FALSE(r.ok()) << std::oct << mode;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    char shown[8];
    std::snprintf(shown, sizeof(shown), "%04o", static_cast<unsigned>(mode));
    EXPECT_EQ(r.status().message(),
              "token file " + path +
                  " is readable or writable by group or others (mode " + shown +
                  "); make it private with chmod 600 " + path);
    // LoadOrCreateToken reads an existing file the same way.
    EXPECT_FALSE(LoadOrCreateToken(path).ok());
  }
  WriteFile(path, "abc\n", 0600);
  Result<std::string> r = ReadToken(path);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(),
            "token file " + path +
                " holds a token of 3 characters; at least 16 are required "
                "(delete the file to have the controller create one)");
  WriteFile(path, std::string(15, 'x'), 0600);
  EXPECT_FALSE(ReadToken(path).ok());
  WriteFile(path, std::string(16, 'x'), 0400);
  EXPECT_TRUE(ReadToken(path).ok());
  WriteFile(path, std::string(5000, 'x'), 0600);
  r = ReadToken(path);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("longer than 4096 bytes"),
            std::string::npos);
}

TEST(TokenTest, CreatedPrivateEvenOverAStaleTemporaryFile) {
  TempDir dir;
  const std::string path = dir.path() + "/token";
  // A temporary of a dead process that had our pid, left readable by all.
  const std::string stale = path + ".tmp." + std::to_string(::getpid());
  WriteFile(stale, "old", 0666);
  const mode_t old_umask = ::umask(0);
  Result<std::string> token = LoadOrCreateToken(path);
  ::umask(old_umask);
  ASSERT_TRUE(token.ok()) << token.status().message();
  EXPECT_EQ(token->size(), 64u);
  struct stat st {};
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  EXPECT_NE(::access(stale.c_str(), F_OK), 0);
  Result<std::string> again = ReadToken(path);
  ASSERT_TRUE(again.ok()) << again.status().message();
  EXPECT_EQ(*again, *token);
}

TEST(WriteJsonTest, BytesThatAreNotUtf8NeverThrow) {
  // A message quoting raw request bytes (a decoded %FF) used to make
  // json::dump throw, which the server turned into a 500.
  httplib::Response res;
  ASSERT_NO_THROW(WriteError(res, 400, "", "queued_resource_id: 'p\xFF'"));
  EXPECT_EQ(res.status, 400);
  nlohmann::json body = nlohmann::json::parse(res.body);
  EXPECT_EQ(body["error"]["message"], "queued_resource_id: 'p\xEF\xBF\xBD'");
  EXPECT_EQ(body["error"]["status"], "INVALID_ARGUMENT");
}

TEST(ApiClientTest, BodyThatIsNotUtf8IsAnError) {
  Result<ApiClient> client =
      ApiClient::Create("http://127.0.0.1:1", "t", std::chrono::seconds(1));
  ASSERT_TRUE(client.ok());
  nlohmann::json body = {{"a", "\xFF"}};
  Result<HttpResponse> r = Internal("not called");
  ASSERT_NO_THROW(r = client->Call("POST", "/x", &body));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
}

TEST(ConstantTimeEqualsTest, Compares) {
  EXPECT_TRUE(ConstantTimeEquals("abc", "abc"));
  EXPECT_TRUE(ConstantTimeEquals("", ""));
  EXPECT_FALSE(ConstantTimeEquals("abc", "abd"));
  EXPECT_FALSE(ConstantTimeEquals("abc", "ab"));
  EXPECT_FALSE(ConstantTimeEquals("ab", "abc"));
  EXPECT_FALSE(ConstantTimeEquals("", "a"));
}

TEST(ApiClientTest, CreateRejectsBadUrls) {
  using std::chrono::milliseconds;
  EXPECT_TRUE(
      ApiClient::Create("http://127.0.0.1:8080", "t", milliseconds(5)).ok());
  EXPECT_TRUE(
      ApiClient::Create("http://localhost:1/", "t", milliseconds(5)).ok());
  for (const char* bad :
       {"127.0.0.1:8080", "https://a:1", "http://a", "http://a:", "http://:80",
        "http://a:8x", "http://a:1/path"}) {
    Result<ApiClient> c = ApiClient::Create(bad, "t", milliseconds(5));
    ASSERT_FALSE(c.ok()) << bad;
    EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument);
  }
}

TEST(ErrorFromResponseTest, MapsCodesAndMessages) {
  HttpResponse r;
  r.status = 400;
  r.body = {
      {"error", {{"code", 400}, {"message", "bad field"}, {"status", "X"}}}};
  Status s = ErrorFromResponse(r);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "bad field");
  r.status = 404;
  EXPECT_EQ(ErrorFromResponse(r).code(), StatusCode::kNotFound);
  r.status = 409;
  EXPECT_EQ(ErrorFromResponse(r).code(), StatusCode::kFailedPrecondition);
  r.status = 412;
  EXPECT_EQ(ErrorFromResponse(r).code(), StatusCode::kFailedPrecondition);
  r.status = 401;
  EXPECT_EQ(ErrorFromResponse(r).code(), StatusCode::kInvalidArgument);
  r.status = 503;
  EXPECT_EQ(ErrorFromResponse(r).code(), StatusCode::kInternal);
  r.body = "plain text";
  EXPECT_EQ(ErrorFromResponse(r).message(), "plain text");
  r.body = nullptr;
  EXPECT_EQ(ErrorFromResponse(r).message(), "HTTP 503");
}

// A loopback server guarded by RequireBearer that echoes the method and
// body, for the client's round trip.
class EchoServer {
 public:
  explicit EchoServer(std::string token) : token_(std::move(token)) {
    auto handler = [this](const httplib::Request& req, httplib::Response& res) {
      if (!RequireBearer(req, res, token_)) return;
      nlohmann::json body = nlohmann::json::parse(req.body, nullptr, false);
      if (req.path == "/fail") {
        WriteError(res, 409, "ALREADY_EXISTS", "it exists");
        return;
      }
      WriteJson(res, 200,
                {{"method", req.method},
                 {"path", req.path},
                 {"body", body.is_discarded() ? nlohmann::json() : body}});
    };
    server_.Get(".*", handler);
    server_.Post(".*", handler);
    server_.Put(".*", handler);
    server_.Delete(".*", handler);
    port_ = server_.bind_to_any_port("127.0.0.1");
    thread_ = std::thread([this] { server_.listen_after_bind(); });
    // bind_to_any_port already listens: early connections queue.
  }
  ~EchoServer() {
    server_.stop();
    thread_.join();
  }
  std::string url() const {
    return "http://127.0.0.1:" + std::to_string(port_);
  }

 private:
  std::string token_;
  httplib::Server server_;
  int port_ = 0;
  std::thread thread_;
};

TEST(ApiClientTest, RoundTripWithBearerToken) {
  EchoServer server("secret");
  Result<ApiClient> client =
      ApiClient::Create(server.url(), "secret", std::chrono::seconds(5));
  ASSERT_TRUE(client.ok());
  nlohmann::json body = {{"a", 1}};
  for (const char* method : {"GET", "POST", "PUT", "DELETE"}) {
    Result<HttpResponse> r =
        client->Call(method, "/x/y?z=1", method[0] == 'G' ? nullptr : &body);
    ASSERT_TRUE(r.ok()) << r.status().message();
    EXPECT_EQ(r->status, 200);
    EXPECT_EQ(r->body["method"], method);
    EXPECT_EQ(r->body["path"], "/x/y");
    if (method[0] != 'G') {
      EXPECT_EQ(r->body["body"]["a"], 1);
    }
  }
  Result<HttpResponse> failed = client->Call("POST", "/fail", &body);
  ASSERT_TRUE(failed.ok());
  EXPECT_EQ(failed->status, 409);
  EXPECT_EQ(ErrorFromResponse(*failed).message(), "it exists");
  EXPECT_EQ(failed->body["error"]["status"], "ALREADY_EXISTS");
  EXPECT_EQ(failed->body["error"]["code"], 409);
}

TEST(ApiClientTest, WrongOrMissingTokenIs401) {
  EchoServer server("secret");
  for (const char* token : {"secreT", "secret2", "", "secre"}) {
    Result<ApiClient> client =
        ApiClient::Create(server.url(), token, std::chrono::seconds(5));
    ASSERT_TRUE(client.ok());
    Result<HttpResponse> r = client->Call("GET", "/x");
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(r->status, 401) << token;
    EXPECT_EQ(r->body["error"]["status"], "UNAUTHENTICATED");
  }
  // No Authorization header at all.
  httplib::Client raw(server.url());
  auto res = raw.Get("/x");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 401);
}

TEST(ApiClientTest, ConnectionFailureIsUnavailableNamingTheUrl) {
  // Bind a port, then close it so nothing listens there.
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), len), 0);
  ASSERT_EQ(::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  ::close(fd);
  const int port = ntohs(addr.sin_port);
  const std::string url = "http://127.0.0.1:" + std::to_string(port);
  Result<ApiClient> client =
      ApiClient::Create(url, "t", std::chrono::milliseconds(500));
  ASSERT_TRUE(client.ok());
  Result<HttpResponse> r = client->Call("GET", "/health");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(r.status().message().find(url + "/health"), std::string::npos);
}

}  // namespace
}  // namespace multislice::control
