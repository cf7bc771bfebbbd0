// A fresh directory under $TMPDIR (or /tmp), removed with its contents when
// the object goes away: the local launcher's rendezvous store, and tests.
#pragma once

#include <cstdlib>
#include <filesystem>
#include <string>
#include <system_error>

namespace multislice {

class TempDir {
 public:
  // Creates "<tmp>/<prefix>XXXXXX"; ok() is false if that failed.
  explicit TempDir(const std::string& prefix = "multislice-") {
    const char* base = std::getenv("TMPDIR");
    std::string pattern =
        std::string(base && *base ? base : "/tmp") + "/" + prefix + "XXXXXX";
    if (::mkdtemp(pattern.data()) != nullptr) path_ = pattern;
  }
  ~TempDir() {
    if (path_.empty()) return;
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  bool ok() const { return !path_.empty(); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace multislice
