// The public keys of a node's `ssh-keys` metadata, read the way Google's
// guest agent reads them on a TPU VM: one key a line, `USER:KEY`, where KEY
// is an OpenSSH public key (`TYPE BASE64 [COMMENT]`) and a comment of the
// form `google-ssh {"userName": ..., "expireOn": "2026-12-06T10:00:00+0000"}`
// ends the key's life at that time.
//
// The value arrives from whoever can patch the node, so it is hostile input:
// a line that is not exactly that shape is skipped (with the reason, for the
// agent's log), never passed on. What comes out is only `TYPE BASE64`, so a
// line cannot smuggle authorized_keys options (`command=`, `from=`) or a
// second key into sshd.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace multislice::control {

// Bounds on what one ssh-keys value may hold.
inline constexpr size_t kMaxSshKeysBytes = 256 * 1024;
inline constexpr size_t kMaxSshKeys = 1024;

struct SshKeyLines {
  // User -> the keys that open it, one `TYPE BASE64` line each, in the
  // order given, without duplicates.
  std::map<std::string, std::vector<std::string>> by_user;
  // One sentence per skipped line (its number, 1-based, and why).
  std::vector<std::string> skipped;
};

// A login name as the guest agent accepts it: 1 to 32 of [A-Za-z0-9._-],
// not starting with '-' or '.'.
bool ValidSshUser(std::string_view user);

// Parses `value` (the metadata value of `ssh-keys`); keys whose expireOn has
// passed at `now_unix_seconds` are skipped. A value over kMaxSshKeysBytes is
// skipped whole; lines past kMaxSshKeys are skipped.
SshKeyLines ParseSshKeys(std::string_view value, int64_t now_unix_seconds);

}  // namespace multislice::control
