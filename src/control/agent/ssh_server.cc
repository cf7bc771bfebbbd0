#include "control/agent/ssh_server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <pwd.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <random>
#include <set>
#include <sstream>
#include <thread>

#include "common/shell_quote.h"
#include "control/agent/ssh_keys.h"

namespace multislice::control {
namespace {

namespace fs = std::filesystem;
using std::chrono::milliseconds;

constexpr const char* kKeyTypes[][2] = {
    {"ed25519", "ssh-ed25519"},
    {"ecdsa", "ecdsa-sha2-nistp256"},
};

// Characters a path may have to be written into sshd_config and a shell
// script unquoted-safe (single quotes are never needed then).
bool SafePath(const std::string& path) {
  return !path.empty() && path[0] == '/' &&
         std::all_of(path.begin(), path.end(), [](unsigned char c) {
           return std::isalnum(c) || std::strchr("/._+-@", c) != nullptr;
         });
}

bool ValidEnvName(const std::string& name) {
  if (name.empty() || std::isdigit(static_cast<unsigned char>(name[0]))) {
    return false;
  }
  return std::all_of(name.begin(), name.end(), [](unsigned char c) {
    return std::isalnum(c) || c == '_';
  });
}

// Writes `path` whole or not at all: a temporary file beside it, then a
// rename. `uid` -1 keeps ours.
Status WriteFileAtomic(const std::string& path, const std::string& text,
                       mode_t mode, int uid = -1) {
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  const int fd =
      ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode);
  if (fd < 0) return Internal("cannot write " + tmp + ": " + strerror(errno));
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const std::string why = strerror(errno);
      ::close(fd);
      ::unlink(tmp.c_str());
      return Internal("cannot write " + tmp + ": " + why);
    }
    done += n;
  }
  bool ok = ::fchmod(fd, mode) == 0;
  if (uid >= 0) ok = ok && ::fchown(fd, uid, -1) == 0;
  ok = ::close(fd) == 0 && ok;
  if (!ok || ::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string why = strerror(errno);
    ::unlink(tmp.c_str());
    return Internal("cannot write " + path + ": " + why);
  }
  return OkStatus();
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// The last non-empty line of a log file, for an error sentence.
std::string LastLine(const std::string& path) {
  std::istringstream in(ReadFile(path));
  std::string last;
  for (std::string line; std::getline(in, line);) {
    if (!line.empty()) last = line;
  }
  return last;
}

std::string RandomHex(int bytes) {
  std::random_device rd;
  std::string out;
  static const char* kHex = "0123456789abcdef";
  for (int i = 0; i < bytes; ++i) {
    const unsigned v = rd() & 0xff;
    out += kHex[v >> 4];
    out += kHex[v & 15];
  }
  return out;
}

// One process of /proc: its parent and session.
struct ProcEntry {
  pid_t pid, ppid, sid;
};

std::vector<ProcEntry> ListProcesses() {
  std::vector<ProcEntry> out;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator("/proc", ec)) {
    const std::string name = entry.path().filename();
    if (name.empty() || !std::all_of(name.begin(), name.end(), ::isdigit)) {
      continue;
    }
    const std::string stat = ReadFile("/proc/" + name + "/stat");
    const size_t paren = stat.rfind(')');
    if (paren == std::string::npos) continue;
    std::istringstream rest(stat.substr(paren + 1));
    std::string state;
    long ppid = 0, pgrp = 0, sid = 0;
    if (!(rest >> state >> ppid >> pgrp >> sid)) continue;
    out.push_back({static_cast<pid_t>(std::stol(name)),
                   static_cast<pid_t>(ppid), static_cast<pid_t>(sid)});
  }
  return out;
}

bool CarriesMark(pid_t pid, const std::string& mark) {
  const std::string environ =
      ReadFile("/proc/" + std::to_string(pid) + "/environ");
  const std::string needle = "MULTISLICE_SSH_SESSION=" + mark;
  size_t at = 0;
  while ((at = environ.find(needle, at)) != std::string::npos) {
    const size_t end = at + needle.size();
    if ((at == 0 || environ[at - 1] == '\0') &&
        (end == environ.size() || environ[end] == '\0')) {
      return true;
    }
    at = end;
  }
  return false;
}

std::string AgentUserName() {
  const passwd* pw = ::getpwuid(::geteuid());
  return pw != nullptr ? pw->pw_name : std::to_string(::geteuid());
}

}  // namespace

struct SshServer::Impl {
  SshServerOptions options;
  std::string mark;  // MULTISLICE_SSH_SESSION of this server's sessions
  std::map<std::string, std::string> host_keys;
  std::unique_ptr<ProcessGroup> sshd;

  std::mutex mu;
  std::string owner;
  bool stopped = false;

  std::string Path(const std::string& name) const {
    return options.dir + "/" + name;
  }

  Status MakeHostKeys() {
    for (const auto& [file_type, key_type] : kKeyTypes) {
      const std::string key =
          Path("ssh_host_" + std::string(file_type) + "_key");
      if (!fs::exists(key) || !fs::exists(key + ".pub")) {
        fs::remove(key);
        fs::remove(key + ".pub");
        ProcessSpec spec;
        spec.argv = {options.keygen, "-q", "-t", file_type, "-N", "",
                     "-C",           "",   "-f", key};
        spec.log_path = Path("ssh-keygen.log");
        ASSIGN_OR_RETURN(std::unique_ptr<ProcessGroup> keygen,
                         options.launcher->Start(spec));
        const ProcessState state = keygen->Wait(std::chrono::seconds(30));
        if (state.running || state.ShellExitCode() != 0) {
          keygen->Stop(milliseconds(0)).ok();
          return Internal("ssh-keygen could not make " + key + ": " +
                          LastLine(spec.log_path));
        }
      }
      std::istringstream pub(ReadFile(key + ".pub"));
      std::string type, base64;
      if (!(pub >> type >> base64) || type != key_type) {
        return Internal(key + ".pub is not an " + std::string(key_type) +
                        " public key");
      }
      host_keys[type] = base64;
    }
    return OkStatus();
  }

  std::string Config() const {
    const std::string cat =
        fs::exists("/usr/bin/cat") ? "/usr/bin/cat" : "/bin/cat";
    std::ostringstream c;
    c << "# Written by the multislice agent at each start of this host's "
         "sshd.\n"
      << "ListenAddress " << options.address << ":" << options.port << "\n";
    for (const auto& [file_type, key_type] : kKeyTypes) {
      c << "HostKey " << Path("ssh_host_" + std::string(file_type) + "_key")
        << "\n";
    }
    c << "PidFile none\n"
         "AuthenticationMethods publickey\n"
         "PubkeyAuthentication yes\n"
         "PasswordAuthentication no\n"
         "KbdInteractiveAuthentication no\n"
         "HostbasedAuthentication no\n"
         "PermitEmptyPasswords no\n"
         "PermitRootLogin prohibit-password\n"
         "UsePAM no\n"
         "AuthorizedKeysFile none\n"
      << "AuthorizedKeysCommand " << cat << " " << Path("authorized_keys")
      << "/%u\n"
      << "AuthorizedKeysCommandUser " << AgentUserName() << "\n"
      << "ForceCommand /bin/bash " << Path("session.sh") << "\n"
      << "Subsystem sftp /usr/lib/openssh/sftp-server\n"
         "PermitUserEnvironment no\n"
         "AllowTcpForwarding local\n"
         "AllowStreamLocalForwarding no\n"
         "AllowAgentForwarding no\n"
         "X11Forwarding no\n"
         "PermitTunnel no\n"
         "GatewayPorts no\n"
         "UseDNS no\n"
         "PrintMotd no\n"
         "PrintLastLog no\n"
         "MaxStartups 100:30:200\n"
         "LoginGraceTime 30\n"
         "ClientAliveInterval 15\n"
         "ClientAliveCountMax 4\n";
    if (!options.only_user.empty()) {
      c << "AllowUsers " << options.only_user << "\n";
    }
    return c.str();
  }

  std::string SessionScript() const {
    const std::string env = Path("session.env");
    return "#!/bin/bash\n"
           "# Written by the multislice agent: sshd's ForceCommand, so every\n"
           "# session (ssh, scp, sftp) starts in the worker's directory and\n"
           "# environment.\n"
           "export MULTISLICE_SSH_SESSION=" +
           mark +
           "\n"
           "if [ -r " +
           env + " ]; then . " + env +
           "; fi\n"
           "if [ -n \"${MULTISLICE_SESSION_DIRECTORY:-}\" ] &&\n"
           "   cd \"$MULTISLICE_SESSION_DIRECTORY\" 2>/dev/null; then\n"
           "  export HOME=\"$MULTISLICE_SESSION_DIRECTORY\"\n"
           "fi\n"
           "unset MULTISLICE_SESSION_DIRECTORY\n"
           "if [ -n \"${SSH_ORIGINAL_COMMAND:-}\" ]; then\n"
           "  exec /bin/bash -c \"$SSH_ORIGINAL_COMMAND\"\n"
           "fi\n"
           "exec -l \"${SHELL:-/bin/bash}\"\n";
  }

  Status StartSshd() {
    if (::geteuid() == 0) {
      // sshd's privilege separation directory (systemd makes it at boot).
      ::mkdir("/run/sshd", 0755);
    }
    ProcessSpec spec;
    spec.argv = {options.sshd, "-D", "-e", "-f", Path("sshd_config")};
    spec.log_path = Path("sshd.log");
    ::unlink(spec.log_path.c_str());  // this start's lines only
    ASSIGN_OR_RETURN(sshd, options.launcher->Start(spec));
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (std::chrono::steady_clock::now() < deadline) {
      if (!sshd->Poll().running) {
        return FailedPrecondition("sshd on " + options.address + ":" +
                                  std::to_string(options.port) +
                                  " did not start: " + LastLine(spec.log_path));
      }
      // sshd's own line, not a connect (which another server on the same
      // address would answer).
      if (ReadFile(spec.log_path)
              .find("Server listening on " + options.address + " port " +
                    std::to_string(options.port)) != std::string::npos) {
        return OkStatus();
      }
      std::this_thread::sleep_for(milliseconds(20));
    }
    sshd->Stop(milliseconds(0)).ok();
    return DeadlineExceeded("sshd on " + options.address + ":" +
                            std::to_string(options.port) +
                            " did not accept connections within 10 s");
  }

  // Every process of a session: below sshd's listener (the guardian's
  // child), in a session one of those leads, or carrying the mark.
  void EndSessions() {
    const pid_t guardian = sshd ? sshd->pid() : -1;
    const std::vector<ProcEntry> procs = ListProcesses();
    std::set<pid_t> victims;
    std::set<pid_t> listeners;
    for (const ProcEntry& p : procs) {
      if (guardian > 0 && p.ppid == guardian) listeners.insert(p.pid);
    }
    // Descendants of the listeners, to a fixed point.
    std::set<pid_t> parents = listeners;
    for (bool grew = true; grew;) {
      grew = false;
      for (const ProcEntry& p : procs) {
        if (parents.count(p.ppid) && !parents.count(p.pid)) {
          parents.insert(p.pid);
          victims.insert(p.pid);
          grew = true;
        }
      }
    }
    std::set<pid_t> sessions;
    for (pid_t v : victims) {
      for (const ProcEntry& p : procs) {
        if (p.pid == v && p.sid == v) sessions.insert(v);
      }
    }
    for (const ProcEntry& p : procs) {
      if (p.pid == ::getpid() || p.pid == guardian || listeners.count(p.pid)) {
        continue;
      }
      if (sessions.count(p.sid) || CarriesMark(p.pid, mark)) {
        victims.insert(p.pid);
      }
    }
    for (pid_t v : victims) ::kill(v, SIGKILL);
    // Those reparented to this agent (a subreaper) are reaped here.
    for (pid_t v : victims) ::waitpid(v, nullptr, WNOHANG);
  }

  std::vector<std::string> SetKeys(const std::string& new_owner,
                                   const std::string& ssh_keys) {
    std::lock_guard<std::mutex> lock(mu);
    if (new_owner != owner) {
      EndSessions();
      owner = new_owner;
    }
    SshKeyLines lines;
    if (!new_owner.empty()) {
      lines = ParseSshKeys(ssh_keys, std::time(nullptr));
    }
    std::vector<std::string> notes = lines.skipped;
    std::set<std::string> written;
    for (const auto& [user, keys] : lines.by_user) {
      if (!options.only_user.empty() && user != options.only_user) {
        notes.push_back("keys of user " + user + " skipped: this host lets " +
                        options.only_user + " log in only");
        continue;
      }
      if (::getpwnam(user.c_str()) == nullptr) {
        notes.push_back("keys of user " + user +
                        " skipped: no such user on this host");
        continue;
      }
      std::string text;
      for (const std::string& key : keys) text += key + "\n";
      Status s = WriteFileAtomic(Path("authorized_keys/" + user), text, 0644);
      if (!s.ok()) {
        notes.push_back(s.message());
        continue;
      }
      written.insert(user);
    }
    std::error_code ec;
    for (const auto& entry :
         fs::directory_iterator(Path("authorized_keys"), ec)) {
      if (!written.count(entry.path().filename())) fs::remove(entry.path(), ec);
    }
    return notes;
  }
};

Result<std::unique_ptr<SshServer>> SshServer::Start(SshServerOptions options) {
  in_addr parsed;
  if (::inet_pton(AF_INET, options.address.c_str(), &parsed) != 1) {
    return InvalidArgument("ssh address: '" + options.address +
                           "' is not an IPv4 address");
  }
  if (options.port < 1 || options.port > 65535) {
    return InvalidArgument("ssh port: " + std::to_string(options.port) +
                           " is not a port from 1 to 65535");
  }
  if (!SafePath(options.dir)) {
    return InvalidArgument("ssh directory: '" + options.dir +
                           "' must be absolute and of A-Z a-z 0-9 / . _ + - @");
  }
  if (options.launcher == nullptr) return InvalidArgument("no launcher");
  for (const std::string& program : {options.sshd, options.keygen}) {
    if (::access(program.c_str(), X_OK) != 0) {
      return FailedPrecondition(program +
                                " is missing: install Debian's openssh-server "
                                "(scripts/install_deps.sh does)");
    }
  }
  auto impl = std::make_unique<Impl>();
  impl->options = std::move(options);
  impl->mark = RandomHex(16);
  std::error_code ec;
  fs::create_directories(impl->Path("authorized_keys"), ec);
  if (ec) {
    return Internal("cannot create " + impl->Path("authorized_keys") + ": " +
                    ec.message());
  }
  for (const std::string& d :
       {impl->options.dir, impl->Path("authorized_keys")}) {
    ::chmod(d.c_str(), 0755);
  }
  RETURN_IF_ERROR(impl->MakeHostKeys());
  RETURN_IF_ERROR(
      WriteFileAtomic(impl->Path("sshd_config"), impl->Config(), 0644));
  RETURN_IF_ERROR(
      WriteFileAtomic(impl->Path("session.sh"), impl->SessionScript(), 0755));
  // Keys of an earlier run of this agent open nothing until the controller
  // says whose the host is.
  impl->SetKeys("", "");
  ::unlink(impl->Path("session.env").c_str());
  RETURN_IF_ERROR(impl->StartSshd());
  return std::unique_ptr<SshServer>(new SshServer(std::move(impl)));
}

SshServer::SshServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
SshServer::~SshServer() { Stop(); }

std::string SshServer::address() const {
  return impl_->options.address + ":" + std::to_string(impl_->options.port);
}

const std::map<std::string, std::string>& SshServer::host_keys() const {
  return impl_->host_keys;
}

std::vector<std::string> SshServer::SetKeys(const std::string& owner,
                                            const std::string& ssh_keys) {
  return impl_->SetKeys(owner, ssh_keys);
}

Status SshServer::SetSession(const std::string& directory,
                             const std::vector<std::string>& env, int uid) {
  const std::string path = impl_->Path("session.env");
  if (directory.empty()) {
    ::unlink(path.c_str());
    return OkStatus();
  }
  std::string text =
      "MULTISLICE_SESSION_DIRECTORY=" + ShellQuote(directory) + "\n";
  for (const std::string& entry : env) {
    const size_t eq = entry.find('=');
    if (eq == std::string::npos || !ValidEnvName(entry.substr(0, eq))) {
      continue;
    }
    text += "export " + entry.substr(0, eq) + "=" +
            ShellQuote(entry.substr(eq + 1)) + "\n";
  }
  std::lock_guard<std::mutex> lock(impl_->mu);
  return WriteFileAtomic(path, text, 0600, uid);
}

void SshServer::EndSessions() {
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->EndSessions();
}

void SshServer::Stop() {
  std::lock_guard<std::mutex> lock(impl_->mu);
  if (impl_->stopped) return;
  impl_->stopped = true;
  impl_->EndSessions();
  if (impl_->sshd) impl_->sshd->Stop(milliseconds(2000)).ok();
}

}  // namespace multislice::control
