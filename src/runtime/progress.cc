#include "runtime/progress.h"

#include <cctype>

namespace multislice::runtime {

uint64_t ChainHash(uint64_t previous, const std::string& signature) {
  uint64_t h = previous == 0 ? 14695981039346656037ull : previous;
  for (unsigned char c : signature) h = (h ^ c) * 1099511628211ull;
  return (h ^ 0x1f) * 1099511628211ull;  // the separator
}

std::string SignatureOf(const std::string& what) {
  const size_t hash = what.find('#');
  if (hash == std::string::npos) return what;
  size_t end = hash + 1;
  while (end < what.size() &&
         std::isdigit(static_cast<unsigned char>(what[end]))) {
    ++end;
  }
  return what.substr(0, hash) + what.substr(end);
}

DeviceProgress::DeviceProgress(int device, size_t recent)
    : device_(device), keep_(recent) {}

void DeviceProgress::Issued(uint64_t sequence, const std::string& what) {
  std::lock_guard<std::mutex> lock(mu_);
  const std::string signature = SignatureOf(what);
  issued_ = sequence;
  hash_ = ChainHash(hash_, signature);
  recent_.push_back({sequence, signature, hash_});
  if (recent_.size() > keep_) recent_.pop_front();
  pending_[sequence] = {what, "queued", std::chrono::steady_clock::now()};
}

void DeviceProgress::PhaseStarted(uint64_t sequence, const std::string& phase) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = pending_.find(sequence);
  if (it != pending_.end()) it->second.phase = phase;
}

void DeviceProgress::Finished(uint64_t sequence) {
  std::lock_guard<std::mutex> lock(mu_);
  pending_.erase(sequence);
}

void DeviceProgress::AddWait(std::chrono::steady_clock::duration waited) {
  wait_ns_ +=
      std::chrono::duration_cast<std::chrono::nanoseconds>(waited).count();
}

double DeviceProgress::wait_seconds() const { return wait_ns_.load() * 1e-9; }

DeviceProgressSnapshot DeviceProgress::Snapshot() const {
  std::lock_guard<std::mutex> lock(mu_);
  DeviceProgressSnapshot s;
  s.device = device_;
  s.issued = issued_;
  s.hash = hash_;
  s.recent.assign(recent_.begin(), recent_.end());
  if (!pending_.empty()) {
    const auto& [sequence, p] = *pending_.begin();
    s.pending =
        PendingCollective{sequence, p.what, p.phase,
                          std::chrono::duration<double>(
                              std::chrono::steady_clock::now() - p.issued_at)
                              .count()};
  }
  return s;
}

std::chrono::steady_clock::duration DeviceProgress::OldestPendingAge() const {
  std::lock_guard<std::mutex> lock(mu_);
  if (pending_.empty()) return std::chrono::steady_clock::duration::zero();
  return std::chrono::steady_clock::now() - pending_.begin()->second.issued_at;
}

}  // namespace multislice::runtime
