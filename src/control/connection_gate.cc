#include "control/connection_gate.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>

namespace multislice::control {

namespace {

// The peer address of `fd` when it is a connected TCP socket whose local
// port is `port`; empty otherwise.
std::string PeerOnPort(int fd, int port) {
  sockaddr_storage local{}, peer{};
  socklen_t local_len = sizeof(local), peer_len = sizeof(peer);
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &local_len) != 0 ||
      ::getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &peer_len) != 0) {
    return "";
  }
  char text[INET6_ADDRSTRLEN] = {};
  if (local.ss_family == AF_INET && peer.ss_family == AF_INET) {
    const auto* l = reinterpret_cast<const sockaddr_in*>(&local);
    const auto* p = reinterpret_cast<const sockaddr_in*>(&peer);
    if (ntohs(l->sin_port) != port) return "";
    ::inet_ntop(AF_INET, &p->sin_addr, text, sizeof(text));
  } else if (local.ss_family == AF_INET6 && peer.ss_family == AF_INET6) {
    const auto* l = reinterpret_cast<const sockaddr_in6*>(&local);
    const auto* p = reinterpret_cast<const sockaddr_in6*>(&peer);
    if (ntohs(l->sin6_port) != port) return "";
    ::inet_ntop(AF_INET6, &p->sin6_addr, text, sizeof(text));
  }
  return text;
}

ino_t SocketInode(int fd) {
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISSOCK(st.st_mode)) return 0;
  return st.st_ino;
}

}  // namespace

const ConnectionGate::Connection* ConnectionGate::Track() {
  for (auto it = open_.begin(); it != open_.end();) {
    it = SocketInode(it->second.fd) == it->first ? std::next(it)
                                                 : open_.erase(it);
  }
  const Connection* newest = nullptr;
  DIR* fds = ::opendir("/proc/self/fd");
  if (fds == nullptr) return nullptr;
  const int self = ::dirfd(fds);
  while (dirent* entry = ::readdir(fds)) {
    if (entry->d_name[0] == '.') continue;
    const int fd = std::atoi(entry->d_name);
    if (fd == self) continue;
    const ino_t inode = SocketInode(fd);
    if (inode == 0 || open_.count(inode)) continue;
    std::string address = PeerOnPort(fd, *port_);
    if (address.empty()) continue;
    const Connection& c = open_[inode] = Connection{fd, std::move(address)};
    if (newest == nullptr || c.fd > newest->fd) newest = &c;
  }
  ::closedir(fds);
  return newest;
}

void ConnectionGate::enqueue(std::function<void()> fn) {
  if (const Connection* c = Track()) {
    int held = 0;
    for (const auto& [inode, other] : open_)
      held += other.address == c->address;
    if (held > max_per_address_) {
      // The task still runs: it reads end-of-file and closes the socket.
      ::shutdown(c->fd, SHUT_RDWR);
      ++refused_;
    }
  }
  pool_.enqueue(std::move(fn));
}

}  // namespace multislice::control
