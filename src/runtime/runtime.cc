#include "runtime/runtime.h"

#include <pthread.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <mutex>
#include <thread>

#include "common/float_env.h"
#include "runtime/first_failure.h"

namespace multislice::runtime {

Runtime::Runtime(const RuntimeOptions& options) : options_(options) {}
Runtime::~Runtime() {
  // Streams use the transports: stop them first.
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
  if (rt->process_count() > 1) {
    std::vector<std::string> names;
    for (int p = 0; p < rt->process_count(); ++p) {
      const int hosts = rt->accelerator_.hosts_per_slice();
      names.push_back(WorkerName(p / hosts, p % hosts));
    }
    for (size_t column = 0; column < rt->local_devices_.size(); ++column) {
      dcn::ConnectOptions connect;
      connect.rank = rt->process_index();
      connect.size = rt->process_count();
      connect.hostname = env.hostname();
      connect.key_prefix = "dcn/column" + std::to_string(column) + "/";
      connect.timeout = options.timeout;
      connect.peer_names = names;
      auto comm = dcn::Communicator::Connect(*rt->store_, connect);
      if (!comm.ok()) {
        return comm.status().WithContext("connecting DCN column " +
                                         std::to_string(column));
      }
      rt->dcn_.push_back(std::move(comm).value());
    }
  }
  for (int id : rt->local_devices_) {
    rt->collectives_.push_back(std::make_unique<DeviceCollectives>(*rt, id));
  }
  return rt;
}

Status Runtime::WithFirstFailure(const Status& failure) {
  int lost = -1;
  for (const auto& comm : dcn_) {
    if (comm->broken_peer() >= 0) {
      lost = comm->broken_peer();
      break;
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
    const Status s = WithFirstFailure(failure);
    if (options_.on_device_error) {
      options_.on_device_error(s);
      return;
    }
    std::fprintf(stderr, "multislice: %s: %s\n", env().name().c_str(),
                 s.message().c_str());
    std::fflush(stderr);
    std::fflush(stdout);
    ::_exit(1);
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
