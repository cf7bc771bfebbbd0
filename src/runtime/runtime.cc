#include "runtime/runtime.h"

#include <pthread.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <mutex>
#include <thread>

#include "common/float_env.h"
#include "runtime/first_failure.h"
#include "runtime/membership.h"

namespace multislice::runtime {

Runtime::Runtime(const RuntimeOptions& options) : options_(options) {}
Runtime::~Runtime() {
  // The watch reads the collectives' progress; streams use the transports.
  hang_watch_.reset();
  collectives_.clear();
  dcn_.clear();
}

int Runtime::process_index() const {
  return options_.env.worker_id +
         options_.env.slice_id * accelerator_.hosts_per_slice();
}
int Runtime::process_count() const {
  return options_.env.num_slices * accelerator_.hosts_per_slice();
}

Result<std::unique_ptr<Runtime>> Runtime::Create(
    const RuntimeOptions& options) {
  std::unique_ptr<Runtime> rt(new Runtime(options));
  const WorkerEnv& env = options.env;
  ASSIGN_OR_RETURN(rt->accelerator_,
                   mesh::ParseAcceleratorType(env.accelerator_type));
  ASSIGN_OR_RETURN(rt->parallelism_,
                   mesh::ResolveParallelism(
                       options.parallelism,
                       rt->accelerator_.devices_per_slice(), env.num_slices));
  rt->devices_ = mesh::MakeDevices(rt->accelerator_, env.num_slices);
  ASSIGN_OR_RETURN(rt->mesh_,
                   mesh::MeshForConfig(rt->parallelism_, rt->devices_));
  for (const mesh::Device& d : rt->devices_) {
    if (d.slice_index == env.slice_id && d.host == env.worker_id) {
      rt->local_devices_.push_back(d.id);
    }
  }
  ASSIGN_OR_RETURN(rt->store_address_,
                   dcn::ParseStoreAddress(env.coordinator_address));
  RETURN_IF_ERROR(
      dcn::ClaimAttempt(rt->store_address_, env.run_id, env.attempt));
  ASSIGN_OR_RETURN(
      rt->store_,
      dcn::OpenStore(rt->store_address_,
                     env.run_id + "/" + std::to_string(env.attempt) + "/",
                     options.timeout));
  // A device waiting on a member of its own host waits twice the network's
  // timeout: that member may be waiting on a peer host, whose loss it then
  // reports first, by name, instead of this device reporting a stuck member.
  rt->ici_domain_ = std::make_unique<ici::Domain>(options.timeout * 2);
  for (int p = 0; p < rt->process_count(); ++p) {
    rt->live_processes_.push_back(p);
    rt->dcn_rank_of_.push_back(p);
  }
  rt->incarnations_.assign(rt->process_count(), 0);
  if (rt->process_count() > 1 && env.incarnation > 0) {
    RETURN_IF_ERROR(rt->JoinRunning());
  } else if (rt->process_count() > 1) {
    RETURN_IF_ERROR(rt->ConnectDcn(rt->live_processes_, 0));
  }
  for (int id : rt->local_devices_) {
    rt->collectives_.push_back(std::make_unique<DeviceCollectives>(*rt, id));
  }
  rt->StartHangWatch();
  // A restarted worker finds its first start's record (redis keeps keys
  // once): hosts do not change with a restart of a local launcher's slice.
  const std::string host = env.hostname();
  try {
    rt->store_->set("host/" + std::to_string(rt->process_index()),
                    std::vector<char>(host.begin(), host.end()));
  } catch (const std::exception&) {
  }
  return rt;
}

const std::vector<std::string>& Runtime::process_hosts() {
  if (!process_hosts_.empty()) return process_hosts_;
  for (int p = 0; p < process_count(); ++p) {
    std::string host = "?";
    try {
      const std::vector<char> bytes = store_->get("host/" + std::to_string(p));
      host.assign(bytes.begin(), bytes.end());
    } catch (const std::exception&) {
    }
    process_hosts_.push_back(host);
  }
  return process_hosts_;
}

void Runtime::StartHangWatch() {
  HangWatchOptions o;
  o.store = store_.get();
  o.process = process_index();
  for (int p = 0; p < process_count(); ++p) o.names.push_back(ProcessName(p));
  o.live = [this] { return live_processes(); };
  o.report = [this] { return HangReport(); };
  o.oldest_pending = [this] {
    std::chrono::steady_clock::duration oldest{};
    for (const auto& c : collectives_) {
      oldest = std::max(oldest, c->progress().OldestPendingAge());
    }
    return oldest;
  };
  o.on_digest = [this](const HangDigest& digest) {
    std::fprintf(stderr, "multislice: %s: %s", env().name().c_str(),
                 FormatHangDigest(digest).c_str());
    std::string culprits;
    for (const HangCulprit& c : digest.culprits) {
      culprits += (culprits.empty() ? "" : ", ") + c.name;
    }
    EndWithFailure(DeadlineExceeded(
        "the job is stuck (" + digest.cause + "); suspected culprit(s): " +
        (culprits.empty() ? "none found" : culprits) +
        (digest.file.empty() ? "" : "; hang digest: " + digest.file)));
  };
  hang_watch_ = std::make_unique<HangWatch>(std::move(o));
}

void Runtime::ArmHangWatch(std::chrono::milliseconds threshold,
                           const std::string& digest_path) {
  hang_watch_->Arm(threshold, digest_path);
}

WorkerHangReport Runtime::HangReport() const {
  WorkerHangReport r;
  r.process = process_index();
  r.name = env().name();
  r.host = env().hostname();
  for (const auto& c : collectives_) {
    r.devices.push_back({c->progress().Snapshot(), StageOf(c->device_id())});
  }
  return r;
}

std::string Runtime::ProcessName(int process) const {
  const int hosts = accelerator_.hosts_per_slice();
  return WorkerName(process / hosts, process % hosts);
}

int Runtime::StageOf(int id) const {
  const auto stage = std::find(mesh_.axis_names.begin(), mesh_.axis_names.end(),
                               std::string("stage"));
  if (stage == mesh_.axis_names.end()) return 0;
  Result<std::vector<int>> coords = mesh_.coords_of(id);
  return coords.ok() ? (*coords)[stage - mesh_.axis_names.begin()] : 0;
}

void Runtime::EndWithFailure(const Status& failure) {
  if (options_.on_device_error) {
    options_.on_device_error(failure);
    return;
  }
  std::fprintf(stderr, "multislice: %s: %s\n", env().name().c_str(),
               failure.message().c_str());
  std::fflush(stderr);
  std::fflush(stdout);
  ::_exit(1);
}

Status Runtime::ConnectDcn(const std::vector<int>& processes, int generation) {
  const int hosts = accelerator_.hosts_per_slice();
  std::vector<std::string> names;
  int rank = -1;
  for (size_t r = 0; r < processes.size(); ++r) {
    names.push_back(WorkerName(processes[r] / hosts, processes[r] % hosts));
    if (processes[r] == process_index()) rank = static_cast<int>(r);
  }
  std::vector<std::unique_ptr<dcn::Communicator>> comms;
  for (size_t column = 0; column < local_devices_.size(); ++column) {
    dcn::ConnectOptions connect;
    connect.rank = rank;
    connect.size = static_cast<int>(processes.size());
    connect.hostname = env().hostname();
    connect.key_prefix = "dcn/column" + std::to_string(column) + "/";
    if (generation > 0) {
      connect.key_prefix += "generation" + std::to_string(generation) + "/";
    }
    connect.timeout = options_.timeout;
    connect.peer_names = names;
    auto comm = dcn::Communicator::Connect(*store_, connect);
    if (!comm.ok()) {
      return comm.status().WithContext("connecting DCN column " +
                                       std::to_string(column));
    }
    comms.push_back(std::move(comm).value());
  }
  for (auto& old : dcn_) retired_dcn_.push_back(std::move(old));
  dcn_ = std::move(comms);
  return OkStatus();
}

dcn::Communicator* Runtime::dcn(int column) {
  std::lock_guard<std::mutex> lock(membership_mu_);
  return dcn_.empty() ? nullptr : dcn_[column].get();
}

int Runtime::dcn_rank_of(int process) const {
  std::lock_guard<std::mutex> lock(membership_mu_);
  return dcn_rank_of_[process];
}

bool Runtime::AllLocalDevicesOk(bool ok) {
  std::unique_lock<std::mutex> lock(vote_.mu);
  vote_.all_ok = vote_.all_ok && ok;
  if (++vote_.arrived == static_cast<int>(local_devices_.size())) {
    vote_.result = vote_.all_ok;
    vote_.all_ok = true;
    vote_.arrived = 0;
    ++vote_.round;
    vote_.cv.notify_all();
    return vote_.result;
  }
  const int64_t round = vote_.round;
  vote_.cv.wait(lock, [&] { return vote_.round != round; });
  return vote_.result;
}

int Runtime::membership_generation() const { return generation_.load(); }

std::vector<int> Runtime::lost_slices() const {
  std::lock_guard<std::mutex> lock(membership_mu_);
  return lost_slices_;
}

std::vector<int> Runtime::incarnations() const {
  std::lock_guard<std::mutex> lock(membership_mu_);
  return incarnations_;
}

std::vector<int> Runtime::live_processes() const {
  std::lock_guard<std::mutex> lock(membership_mu_);
  return live_processes_;
}

Result<int> Runtime::DropLostSlices(int seen_generation) {
  std::lock_guard<std::mutex> drop_lock(drop_mu_);
  if (generation_.load() > seen_generation) return 0;
  const int generation = generation_.load();
  ASSIGN_OR_RETURN(
      std::vector<int> gone,
      AgreeOnGone(*store_, generation, process_index(), live_processes(),
                  incarnations(), options_.timeout));
  const int hosts = accelerator_.hosts_per_slice();
  std::vector<int> lost = lost_slices(), live;
  const size_t lost_before = lost.size();
  for (int p : gone) {
    if (std::find(lost.begin(), lost.end(), p / hosts) == lost.end()) {
      lost.push_back(p / hosts);
    }
  }
  if (lost.size() == lost_before) return 0;
  if (std::find(lost.begin(), lost.end(), env().slice_id) != lost.end()) {
    return FailedPrecondition("this worker's slice was lost");
  }
  for (int p : live_processes()) {
    if (std::find(lost.begin(), lost.end(), p / hosts) == lost.end()) {
      live.push_back(p);
    }
  }
  {
    std::lock_guard<std::mutex> lock(membership_mu_);
    RETURN_IF_ERROR(EnterGeneration(generation + 1, live, lost));
  }
  return static_cast<int>(lost.size() - lost_before);
}

Status Runtime::EnterGeneration(int generation, const std::vector<int>& live,
                                const std::vector<int>& lost) {
  if (live.size() > 1) {
    RETURN_IF_ERROR(ConnectDcn(live, generation));
  } else {
    for (auto& old : dcn_) retired_dcn_.push_back(std::move(old));
    dcn_.clear();
  }
  lost_slices_ = lost;
  std::sort(lost_slices_.begin(), lost_slices_.end());
  live_processes_ = live;
  std::fill(dcn_rank_of_.begin(), dcn_rank_of_.end(), -1);
  for (size_t r = 0; r < live.size(); ++r) dcn_rank_of_[live[r]] = r;
  generation_ = generation;
  return OkStatus();
}

// The survivors look for requests only at their sync steps, which may be
// minutes apart in a long period: the wait is long, but bounded.
Status Runtime::JoinRunning() {
  const int me = process_index();
  const int incarnation = env().incarnation;
  RETURN_IF_ERROR(RequestRejoin(*store_, me, incarnation));
  const auto wait = std::max<std::chrono::milliseconds>(
      options_.timeout * 10, std::chrono::minutes(10));
  ASSIGN_OR_RETURN(
      std::optional<Admission> admission,
      WaitForAdmission(*store_, me, incarnation, process_count(), wait));
  if (!admission.has_value()) {
    too_late_to_join_ = true;
    return OkStatus();
  }
  if (std::find(admission->members.begin(), admission->members.end(), me) ==
          admission->members.end() ||
      admission->incarnations[me] != incarnation) {
    return InvalidArgument("the admission record does not name " +
                           env().name() + " in start " +
                           std::to_string(incarnation));
  }
  const int hosts = accelerator_.hosts_per_slice();
  std::vector<int> lost;
  for (int slice = 0; slice < env().num_slices; ++slice) {
    if (std::find(admission->members.begin(), admission->members.end(),
                  slice * hosts) == admission->members.end()) {
      lost.push_back(slice);
    }
  }
  std::lock_guard<std::mutex> lock(membership_mu_);
  incarnations_ = admission->incarnations;
  joined_step_ = admission->step;
  return EnterGeneration(admission->generation, admission->members, lost);
}

std::vector<int> Runtime::RejoinRequests() {
  const int hosts = accelerator_.hosts_per_slice();
  std::vector<int> slices;
  const std::vector<int> started = incarnations();
  for (int slice : lost_slices()) {
    bool all = true;
    for (int w = 0; w < hosts && all; ++w) {
      const int p = slice * hosts + w;
      all = RejoinRequested(*store_, p, started[p] + 1);
    }
    if (all) slices.push_back(slice);
  }
  return slices;
}

Status Runtime::AdmitSlices(int seen_generation, const std::vector<int>& slices,
                            int64_t step) {
  std::lock_guard<std::mutex> drop_lock(drop_mu_);
  if (generation_.load() > seen_generation || slices.empty()) {
    return OkStatus();
  }
  const int hosts = accelerator_.hosts_per_slice();
  Admission a;
  a.generation = generation_.load() + 1;
  a.step = step;
  std::vector<int> lost;
  for (int slice : lost_slices()) {
    if (std::find(slices.begin(), slices.end(), slice) == slices.end()) {
      lost.push_back(slice);
    }
  }
  for (int p = 0; p < process_count(); ++p) {
    if (std::find(lost.begin(), lost.end(), p / hosts) == lost.end()) {
      a.members.push_back(p);
    }
  }
  std::lock_guard<std::mutex> lock(membership_mu_);
  a.incarnations = incarnations_;
  std::vector<int> joining;
  for (int slice : slices) {
    for (int w = 0; w < hosts; ++w) {
      joining.push_back(slice * hosts + w);
      ++a.incarnations[slice * hosts + w];
    }
  }
  if (process_index() == live_processes_.front()) {
    for (int p : joining) {
      RETURN_IF_ERROR(RecordAdmission(*store_, p, a.incarnations[p], a));
    }
  }
  incarnations_ = a.incarnations;
  return EnterGeneration(a.generation, a.members, lost);
}

void Runtime::CloseAdmissions() {
  if (store_ && process_index() == live_processes().front()) {
    runtime::CloseAdmissions(*store_);
  }
}

Status Runtime::WithFirstFailure(const Status& failure) {
  int lost = -1;  // a process index
  {
    std::lock_guard<std::mutex> lock(membership_mu_);
    for (const auto& comm : dcn_) {
      if (comm->broken_peer() >= 0) {
        // The communicator's ranks are the live processes in order.
        lost = live_processes_[comm->broken_peer()];
        break;
      }
    }
  }
  if (lost < 0 || !store_) return failure;
  const int me = process_index();
  RecordLost(*store_, me, lost);
  const auto wait =
      std::clamp(options_.timeout / 4, std::chrono::milliseconds(100),
                 std::chrono::milliseconds(2000));
  const std::optional<int> first =
      FirstFailure(me, lost, process_count(), StoreLostRecords(*store_), wait);
  if (!first.has_value() || *first == lost) return failure;
  const int hosts = accelerator_.hosts_per_slice();
  return Status(failure.code(), failure.message() +
                                    "; the failure started at " +
                                    WorkerName(*first / hosts, *first % hosts));
}

Status Runtime::RunOnDevices(const std::function<Status(int)>& fn) {
  const int n = static_cast<int>(local_devices_.size());
  std::vector<Status> results(n);
  std::mutex mu;
  bool reported = false;
  auto report = [&](const Status& failure) {
    std::lock_guard<std::mutex> lock(mu);
    if (reported) return;
    reported = true;
    if (hang_watch_ && hang_watch_->round_started()) {
      // A peer that ended after the digest made this device fail: the round
      // ends this process once it has the digest.
      std::this_thread::sleep_for(hang_watch_->round_bound());
    }
    EndWithFailure(WithFirstFailure(failure));
  };
  std::vector<std::thread> threads;
  for (int i = 0; i < n; ++i) {
    threads.emplace_back([&, i] {
      const std::string name = "device" + std::to_string(local_devices_[i]);
      pthread_setname_np(pthread_self(), name.substr(0, 15).c_str());
      FlushSubnormalsInThisThread();
      results[i] = fn(i);
      if (!results[i].ok()) report(results[i]);
    });
  }
  for (std::thread& t : threads) t.join();
  for (const Status& s : results) {
    if (!s.ok()) return s;
  }
  return OkStatus();
}

}  // namespace multislice::runtime
