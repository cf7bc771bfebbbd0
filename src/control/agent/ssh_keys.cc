#include "control/agent/ssh_keys.h"

#include <algorithm>
#include <cctype>
#include <ctime>
#include <nlohmann/json.hpp>
#include <optional>

namespace multislice::control {
namespace {

// The key types OpenSSH 9 accepts in authorized_keys.
constexpr std::string_view kKeyTypes[] = {
    "ssh-ed25519",
    "ssh-rsa",
    "ecdsa-sha2-nistp256",
    "ecdsa-sha2-nistp384",
    "ecdsa-sha2-nistp521",
    "sk-ssh-ed25519@openssh.com",
    "sk-ecdsa-sha2-nistp256@openssh.com",
};

bool IsBase64(std::string_view s) {
  if (s.size() < 16 || s.size() > 16384) return false;
  return std::all_of(s.begin(), s.end(), [](unsigned char c) {
    return std::isalnum(c) || c == '+' || c == '/' || c == '=';
  });
}

// The words of `s` split at runs of spaces and tabs.
std::vector<std::string_view> Words(std::string_view s) {
  std::vector<std::string_view> words;
  size_t i = 0;
  while (i < s.size()) {
    while (i < s.size() && (s[i] == ' ' || s[i] == '\t')) ++i;
    const size_t start = i;
    while (i < s.size() && s[i] != ' ' && s[i] != '\t') ++i;
    if (i > start) words.push_back(s.substr(start, i - start));
  }
  return words;
}

// "2026-12-06T10:00:00+0000" (the guest agent's form), also with a
// fraction, "Z" or "+00:00": seconds since the epoch.
std::optional<int64_t> ParseRfc3339(const std::string& text) {
  std::tm tm = {};
  int consumed = 0;
  if (std::sscanf(text.c_str(), "%4d-%2d-%2dT%2d:%2d:%2d%n", &tm.tm_year,
                  &tm.tm_mon, &tm.tm_mday, &tm.tm_hour, &tm.tm_min, &tm.tm_sec,
                  &consumed) != 6) {
    return std::nullopt;
  }
  std::string_view rest = std::string_view(text).substr(consumed);
  if (!rest.empty() && rest[0] == '.') {
    size_t i = 1;
    while (i < rest.size() && std::isdigit(static_cast<unsigned char>(rest[i])))
      ++i;
    rest.remove_prefix(i);
  }
  int64_t offset = 0;
  if (rest == "Z") {
  } else if (rest.size() >= 5 && (rest[0] == '+' || rest[0] == '-')) {
    std::string digits;
    for (char c : rest.substr(1)) {
      if (c != ':') digits.push_back(c);
    }
    if (digits.size() != 4 ||
        !std::all_of(digits.begin(), digits.end(), ::isdigit)) {
      return std::nullopt;
    }
    offset =
        (std::stoi(digits.substr(0, 2)) * 60 + std::stoi(digits.substr(2))) *
        60 * (rest[0] == '-' ? -1 : 1);
  } else {
    return std::nullopt;
  }
  tm.tm_year -= 1900;
  tm.tm_mon -= 1;
  return static_cast<int64_t>(::timegm(&tm)) - offset;
}

// Why the key line (after "USER:") is not taken, or "" when it is; the
// accepted `TYPE BASE64` goes to `key`.
std::string CheckKey(std::string_view text, int64_t now, std::string* key) {
  if (std::any_of(text.begin(), text.end(),
                  [](unsigned char c) { return c < 0x20 && c != '\t'; })) {
    return "a control character";
  }
  const std::vector<std::string_view> words = Words(text);
  if (words.size() < 2) return "expected 'TYPE BASE64 [COMMENT]' after USER:";
  if (std::find(std::begin(kKeyTypes), std::end(kKeyTypes), words[0]) ==
      std::end(kKeyTypes)) {
    return "'" + std::string(words[0].substr(0, 40)) +
           "' is not an OpenSSH public key type";
  }
  if (!IsBase64(words[1])) return "the key is not base64";
  if (words.size() >= 3 && words[2] == "google-ssh") {
    // The rest is JSON; it may contain spaces.
    const size_t brace = text.find('{');
    const nlohmann::json meta =
        brace == std::string_view::npos
            ? nlohmann::json()
            : nlohmann::json::parse(text.substr(brace), nullptr, false);
    if (meta.is_object() && meta.contains("expireOn") &&
        meta["expireOn"].is_string()) {
      const std::optional<int64_t> expires =
          ParseRfc3339(meta["expireOn"].get<std::string>());
      if (!expires) return "its expireOn is not an RFC 3339 time";
      if (*expires <= now) return "it expired";
    }
  }
  *key = std::string(words[0]) + " " + std::string(words[1]);
  return "";
}

}  // namespace

bool ValidSshUser(std::string_view user) {
  if (user.empty() || user.size() > 32 || user[0] == '-' || user[0] == '.') {
    return false;
  }
  return std::all_of(user.begin(), user.end(), [](unsigned char c) {
    return std::isalnum(c) || c == '.' || c == '_' || c == '-';
  });
}

SshKeyLines ParseSshKeys(std::string_view value, int64_t now_unix_seconds) {
  SshKeyLines out;
  if (value.size() > kMaxSshKeysBytes) {
    out.skipped.push_back("the whole value: " + std::to_string(value.size()) +
                          " bytes, more than " +
                          std::to_string(kMaxSshKeysBytes));
    return out;
  }
  size_t count = 0;
  int number = 0;
  size_t start = 0;
  while (start <= value.size()) {
    size_t end = value.find('\n', start);
    if (end == std::string_view::npos) end = value.size();
    std::string_view line = value.substr(start, end - start);
    start = end + 1;
    ++number;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (Words(line).empty()) continue;
    auto skip = [&](const std::string& why) {
      out.skipped.push_back("line " + std::to_string(number) + ": " + why);
    };
    if (++count > kMaxSshKeys) {
      skip("more than " + std::to_string(kMaxSshKeys) + " keys");
      continue;
    }
    const size_t colon = line.find(':');
    if (colon == std::string_view::npos) {
      skip("expected USER:KEY");
      continue;
    }
    const std::string_view user = line.substr(0, colon);
    if (!ValidSshUser(user)) {
      skip("'" + std::string(user.substr(0, 40)) +
           "' is not a user name (1 to 32 of A-Z a-z 0-9 . _ -)");
      continue;
    }
    std::string key;
    const std::string why =
        CheckKey(line.substr(colon + 1), now_unix_seconds, &key);
    if (!why.empty()) {
      skip(why);
      continue;
    }
    std::vector<std::string>& keys = out.by_user[std::string(user)];
    if (std::find(keys.begin(), keys.end(), key) == keys.end()) {
      keys.push_back(key);
    }
  }
  return out;
}

}  // namespace multislice::control
