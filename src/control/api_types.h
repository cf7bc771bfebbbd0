// The queued-resource model of the Cloud TPU v2alpha1 API (spec 4.1): the
// request body as users send it, its validation, and the records the
// controller keeps and answers with.
//
// Input accepts Google's JSON mapping in both spellings (`node_spec` and
// `nodeSpec`); everything is stored and answered in camelCase. Errors are
// kInvalidArgument naming the field in snake_case (`tpu.node_spec[0].
// multi_node_params.node_count`), and for malformed JSON the line and column.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace multislice::control {

enum class QrState {
  kCreating,
  kAccepted,
  kWaitingForResources,
  kProvisioning,
  kActive,
  kSuspending,
  kSuspended,
  kFailed,
  kDeleting,
};
std::string StateName(QrState state);
Result<QrState> ParseStateName(std::string_view name);

// Capacity tiers, in priority order.
enum class Tier { kReserved = 0, kOnDemand = 1, kSpot = 2, kBestEffort = 3 };
inline constexpr int kNumTiers = 4;
std::string TierName(Tier tier);  // "reserved", "on-demand", "spot", ...
Result<Tier> ParseTierName(std::string_view name);

// Bounds on user input.
inline constexpr int kMaxNodeCount = 256;
inline constexpr size_t kMaxStringBytes = 1024;
inline constexpr size_t kMaxStartupScriptBytes = 256 * 1024;
inline constexpr size_t kMaxListEntries = 64;

// The deepest nesting of arrays and objects accepted in a JSON body.
inline constexpr int kMaxJsonDepth = 64;

// Whether `id` is a queued resource or node id as the Cloud TPU API defines
// them: ^[a-z]([-a-z0-9]*[a-z0-9])?$, at most 63 characters. Prefer
// ValidateResourceId (validation.h), whose error names field and value.
bool ValidResourceId(std::string_view id);

// Parses JSON text into a tree, all errors kInvalidArgument:
//   malformed JSON or invalid UTF-8: "malformed JSON at line L, column C:
//     ..." (1-based, column counted in bytes);
//   nesting deeper than kMaxJsonDepth: the same, at the bracket too deep,
//     refused before any tree is built;
//   a number out of range of a double (1e999): "FIELD: the number '1e999'
//     at line L, column C is out of range ..." naming the field as written.
// Never throws.
Result<nlohmann::json> ParseJsonText(std::string_view text);

// Protobuf JSON durations ("3600s", "1.5s": digits, at most 9 fractional,
// at most 315576000000 s) and RFC 3339 times ("2024-05-01T10:00:00Z",
// "...+02:00", "....25Z"; real dates only: no 2024-02-30, month 13, hour
// 24 or second 60), as milliseconds; a fraction past milliseconds is
// rounded (durations) or truncated (times).
Result<int64_t> ParseDurationMs(std::string_view text);
Result<int64_t> ParseTimestampMs(std::string_view text);
// Milliseconds since the epoch as "2024-05-01T10:00:00.123Z".
std::string FormatTimestamp(int64_t ms);

// What the controller needs from a validated create body.
struct QueuedResourceSpec {
  std::string accelerator_type;
  std::string runtime_version;
  std::vector<std::string> node_ids;  // one per slice: {prefix}-0.. or node_id
  Tier tier = Tier::kOnDemand;
  std::string startup_script;  // node.metadata["startup-script"], may be ""
  int64_t valid_until_ms = 0;  // absolute deadline; 0 when none
  int64_t valid_after_ms = 0;  // absolute eligibility time; 0 when none
  nlohmann::json body;         // the request in camelCase, as echoed back
};

// Validates a create body for queued resource `id` at time now_ms (for the
// relative queueing policies): every field's JSON type ("FIELD: expected a
// string, got a number"), strings' lengths, counts' ranges, node ids and
// the node id prefix (ValidateResourceId; the node ids made from a prefix
// at most 63 characters too), durations and times. `id` itself is checked
// only as the default node id or prefix: check it first with
// ValidateResourceId("queued_resource_id", id).
//
// `api` is the version the request came on, each with its own schema:
// "v2alpha1" takes tpu.node_spec[].multi_node_params and best_effort; "v2"
// takes multislice_params {node_count, node_id_prefix} instead and has no
// best_effort. The stored body is in the v2alpha1 form either way.
Result<QueuedResourceSpec> ParseQueuedResource(
    const nlohmann::json& body, const std::string& id, int64_t now_ms,
    const std::string& api = "v2alpha1");

// Recursively renames snake_case keys to camelCase, except the user keys of
// `metadata` and `labels` maps. Two spellings of one key are an error, and
// so is nesting deeper than kMaxJsonDepth (checked first, without
// recursion, so any tree is safe to pass).
Result<nlohmann::json> ToCamelCase(const nlohmann::json& value,
                                   const std::string& path = "");

// A node's metadata or labels: an object of at most kMaxListEntries
// strings, each at most kMaxStringBytes (startup-script and ssh-keys:
// kMaxStartupScriptBytes). The error names the field under `path`.
Status ValidateStringMap(const nlohmann::json& map, const std::string& path);

struct NodeRecord {
  std::string node_id;
  std::string state = "CREATING";  // CREATING READY RESTARTING REPAIRING ...
  std::string health = "HEALTHY";  // HEALTHY TIMEOUT UNHEALTHY_MAINTENANCE
  std::vector<std::string> hosts;  // host ids, TPU_WORKER_ID order
  bool started = false;            // workers of the current attempt run
  // The node's metadata once patched (nodes.patch, updateMask metadata:
  // gcloud's ssh-keys); null: the request's node.metadata.
  nlohmann::json metadata;
  // How many times metadata was patched: the agents of the node's hosts
  // report the generation whose ssh-keys they applied.
  int64_t metadata_generation = 0;
};

// A nodes.patch of metadata whose operation ends once every live host of
// the node has applied it (gcloud waits on it, then connects with the key
// it added), or at `deadline_ms` (wall clock) whatever the hosts did.
struct NodeUpdate {
  std::string op;  // the operation's name
  std::string node_id;
  int64_t generation = 0;
  int64_t deadline_ms = 0;
};

// One entry of a queued resource's state history (an extra output field,
// `stateHistory`, for the console's details page).
struct StateChange {
  std::string state;      // StateName()
  int64_t time_ms = 0;    // wall clock
  std::string initiator;  // USER or SERVICE
};
// The most entries kept; older ones are dropped first.
inline constexpr size_t kMaxStateHistory = 64;

// One queued resource as the controller stores it. The store keeps it as
// the JSON of ToStorage(); the API answers with ToApi().
struct QueuedResourceRecord {
  std::string name;  // projects/{p}/locations/{z}/queuedResources/{id}
  std::string project, zone, id;
  // Unique for the record's lifetime and never reused (an id may be deleted
  // and created again): names the run of its workers (MULTISLICE_RUN_ID)
  // and its rendezvous namespace.
  std::string uid;
  int64_t seq = 0;  // creation order: FIFO within a tier
  int64_t create_ms = 0;
  QueuedResourceSpec spec;
  int hosts_per_slice = 1;
  int chips_per_slice = 1;
  QrState state = QrState::kCreating;
  std::string state_initiator = "USER";
  std::string failed_error;
  bool holds_quota = false;  // from admission until deletion
  int attempt = 0;           // MULTISLICE_ATTEMPT of the workers (1 first)
  // The transition under way, carried on after a restart:
  //   ""      steady (or waiting)
  //   "start" PUT the workers of `attempt` on every node
  //   "stop"  stop every worker (all nodes and retired hosts), then "start"
  //           with attempt+1 (repair, reset) or release (suspend, delete)
  std::string stage;
  std::vector<NodeRecord> nodes;
  std::vector<std::string> retired_hosts;  // lost hosts whose workers we stop
  bool delete_requested = false;
  std::vector<std::string> waiting_ops;  // finished when the transition ends
  std::string coordinator;               // MEGASCALE_COORDINATOR_ADDRESS
  // On cluster capacity (capacity.h ClusterCapacity): the job holding the
  // record's nodes ("" until it is submitted).
  std::string cluster_job;
  std::vector<StateChange> state_history;  // oldest first, bounded
  std::vector<NodeUpdate> node_updates;    // metadata patches under way
  // Made by nodes.create (`gcloud compute tpus tpu-vm create`): a queued
  // resource of one node named after it, which nodes.delete deletes.
  bool created_as_node = false;

  // Appends {state, now_ms, state_initiator} unless the last entry already
  // has this state and initiator; keeps the last kMaxStateHistory entries.
  // Returns whether an entry was added.
  bool RecordStateChange(int64_t now_ms);

  int total_chips() const {
    return chips_per_slice * static_cast<int>(spec.node_ids.size());
  }
  nlohmann::json ToStorage() const;
  static Result<QueuedResourceRecord> FromStorage(const nlohmann::json& j);
  // As version `api` ("v2alpha1" or "v2") shows it.
  nlohmann::json ToApi(const std::string& api = "v2alpha1") const;
  // Node `n`'s metadata: its patched one, else the request's.
  nlohmann::json NodeMetadata(const NodeRecord& n) const;
  // The numeric id (Node.id) of node `index`, stable for the record's
  // lifetime and unique to it.
  std::string NodeNumericId(size_t index) const;

 private:
  void ExpandNodeSpecs(nlohmann::json& out) const;
};

// A long-running operation (google.longrunning.Operation).
struct OperationRecord {
  std::string name;  // projects/{p}/locations/{z}/operations/operation-...
  std::string target;
  std::string verb;  // create, delete, reset
  std::string api_version;
  int64_t create_ms = 0;
  int64_t end_ms = 0;
  bool done = false;
  nlohmann::json response;  // when done without error
  nlohmann::json error;     // google.rpc.Status when done with error

  nlohmann::json ToStorage() const;
  static Result<OperationRecord> FromStorage(const nlohmann::json& j);
  nlohmann::json ToApi() const;
};

}  // namespace multislice::control
