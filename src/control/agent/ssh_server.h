// A host's OpenSSH server, run by its agent the way a TPU VM runs one: on
// the host's own address, port 22, opening only with the keys of the node
// that holds the host (its `ssh-keys` metadata, which `gcloud compute tpus
// tpu-vm ssh` patches), as the user each key names, in the worker's
// directory and environment.
//
// Debian's /usr/sbin/sshd runs as a process group of the agent's launcher
// (so it dies with the agent) with a configuration of its own in DIR
// (`<agent workdir>/ssh/`), never the machine's /etc/ssh:
//   ssh_host_ed25519_key, ssh_host_ecdsa_key  this host's keys, made once
//                                             and kept (gcloud remembers
//                                             them under HostKeyAlias)
//   sshd_config                               written at every start
//   authorized_keys/USER                      `TYPE BASE64` lines, read by
//                                             AuthorizedKeysCommand
//                                             /usr/bin/cat (sshd checks the
//                                             command's path, not the file's)
//   session.sh                                every session's ForceCommand:
//                                             reads session.env, enters the
//                                             worker's directory (also as
//                                             HOME, so `~/x` is there for
//                                             ssh, scp and sftp alike), runs
//                                             the command or a login shell
//   session.env                               the current worker's
//                                             environment (mode 0600, the
//                                             worker's user)
//   sshd.log                                  sshd's own log
// Password and keyboard-interactive logins are off; root may log in with a
// key only; forwarding is limited to -L.
//
// Thread-safety: every method may be called from any thread.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "control/process.h"

namespace multislice::control {

struct SshServerOptions {
  std::string address;  // the IPv4 address sshd listens on
  int port = 22;
  std::string dir;  // where its files live (created, mode 0755)
  std::string sshd = "/usr/sbin/sshd";
  std::string keygen = "/usr/bin/ssh-keygen";
  // When set, the only user a key may open (the agent's --worker-user);
  // otherwise any user of this machine that a key names.
  std::string only_user;
  // Starts sshd's group and ssh-keygen; must outlive the server.
  ProcessLauncher* launcher = nullptr;
};

class SshServer {
 public:
  // Makes the host keys when absent, writes the configuration and starts
  // sshd; returns once it accepts connections (at most 10 s). Fails with one
  // sentence: sshd or ssh-keygen missing, DIR not usable, or sshd's own last
  // log line (e.g. the address in use, or a port below 1024 without root).
  static Result<std::unique_ptr<SshServer>> Start(SshServerOptions options);

  ~SshServer();
  SshServer(const SshServer&) = delete;
  SshServer& operator=(const SshServer&) = delete;

  // "ADDRESS:PORT".
  std::string address() const;
  // Key type ("ssh-ed25519") -> base64 public key, as guest attributes
  // report them (namespace hostkeys).
  const std::map<std::string, std::string>& host_keys() const;

  // Applies a node's `ssh-keys` value on behalf of `owner` (the queued
  // resource holding the host; "" when none, which removes every key).
  // When the owner changes, every session of the previous one is ended
  // first. Returns the sentences of the lines skipped (for the log).
  std::vector<std::string> SetKeys(const std::string& owner,
                                   const std::string& ssh_keys);

  // The worker whose directory and environment ("NAME=value") sessions
  // start in, readable by `uid` (-1: the agent's user). Empty `directory`:
  // none (sessions start in the user's home).
  Status SetSession(const std::string& directory,
                    const std::vector<std::string>& env, int uid);

  // Ends every session: sshd's connection processes, what they started, and
  // every process still carrying this server's session mark.
  void EndSessions();

  // Ends the sessions and stops sshd. Idempotent; also run by the
  // destructor.
  void Stop();

  struct Impl;

 private:
  explicit SshServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace multislice::control
