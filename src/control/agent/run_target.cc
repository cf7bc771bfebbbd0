// What a run is before it runs: its options, the queued resource they
// name, and its packed scripts (run_target.h).
#include "control/agent/run_target.h"

#include <ctime>
#include <functional>

#include "control/agent/agent.h"
#include "control/agent/pack.h"
#include "control/agent/run_output.h"

namespace multislice::control {
namespace {

using nlohmann::json;

// The queued resources of `project` in `zone` ("-": every zone), page by
// page: fn(answer, id) for each.
Status ForEachQueuedResource(
    const ApiClient& controller, const std::string& project,
    const std::string& zone,
    const std::function<void(const json&, const std::string&)>& fn) {
  std::string page_token;
  for (int page = 0; page < 10000; ++page) {
    std::string path = "/v2alpha1/projects/" + project + "/locations/" + zone +
                       "/queuedResources?pageSize=1000";
    if (!page_token.empty()) path += "&pageToken=" + page_token;
    ASSIGN_OR_RETURN(HttpResponse response, controller.Call("GET", path));
    if (response.status / 100 != 2) return ErrorFromResponse(response);
    const json& body = response.body;
    if (!body.is_object()) return Internal("the controller's list is not JSON");
    for (const json& qr : body.value("queuedResources", json::array())) {
      if (!qr.is_object()) continue;
      const std::string name = qr.value("name", "");
      fn(qr, name.substr(name.rfind('/') + 1));
    }
    page_token = body.value("nextPageToken", "");
    if (page_token.empty()) break;
  }
  return OkStatus();
}

// Whether queued resource `id`'s nodes are {prefix}-0, ... or {prefix}: the
// node ids of its answer (one node spec per node, as Google answers a
// multislice request).
bool HasNodePrefix(const json& qr, const std::string& id,
                   const std::string& prefix) {
  (void)id;
  const json spec = qr.contains("tpu") && qr["tpu"].is_object()
                        ? qr["tpu"].value("nodeSpec", json::array())
                        : json::array();
  if (!spec.is_array() || spec.empty()) return false;
  std::vector<std::string> ids;
  for (const json& node : spec) {
    if (!node.is_object()) return false;
    ids.push_back(node.value("nodeId", ""));
  }
  if (ids.size() == 1 && ids[0] == prefix) return true;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] != prefix + "-" + std::to_string(i)) return false;
  }
  return true;
}

// FindQueuedResourceByPrefix's answer and id.
Result<RunTarget> FindTargetByPrefix(const ApiClient& controller,
                                     const std::string& project,
                                     const std::string& prefix,
                                     const std::string& zone) {
  std::vector<RunTarget> matches;
  RETURN_IF_ERROR(ForEachQueuedResource(
      controller, project, zone, [&](const json& qr, const std::string& id) {
        if (HasNodePrefix(qr, id, prefix)) matches.push_back({id, qr});
      }));
  if (matches.empty()) {
    return NotFound("--tpu_prefix: no queued resource of project " + project +
                    (zone == "-" ? "" : " in zone " + zone) +
                    " has nodes named " + prefix + "-0, " + prefix +
                    "-1, ... or " + prefix);
  }
  if (matches.size() > 1) {
    std::string names;
    for (const RunTarget& m : matches) {
      names += (names.empty() ? "" : ", ") + m.id;
    }
    return InvalidArgument("--tpu_prefix: " + prefix +
                           " names the nodes of several queued resources (" +
                           names + "); choose one with --qr");
  }
  return matches[0];
}

}  // namespace

bool ValidRunName(const std::string& name) {
  if (name.empty() || name.size() > 100) return false;
  for (char c : name) {
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
          (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-')) {
      return false;
    }
  }
  return name[0] != '.' && name[0] != '-' && name[0] != '_';
}

std::string DefaultRunName(std::chrono::system_clock::time_point now) {
  const std::time_t t = std::chrono::system_clock::to_time_t(now);
  std::tm utc{};
  ::gmtime_r(&t, &utc);
  char text[32];
  std::strftime(text, sizeof text, "%Y-%m-%d-%H-%M-%S", &utc);
  return text;
}

Result<std::string> FindQueuedResourceByPrefix(const ApiClient& controller,
                                               const std::string& project,
                                               const std::string& prefix,
                                               const std::string& zone) {
  ASSIGN_OR_RETURN(RunTarget target,
                   FindTargetByPrefix(controller, project, prefix, zone));
  return target.id;
}

Status ValidateRunOptions(const RunOptions& options) {
  if (options.command.empty()) return InvalidArgument("--command: empty");
  if (options.queued_resource.empty() == options.tpu_prefix.empty()) {
    return InvalidArgument("give exactly one of --qr and --tpu_prefix");
  }
  if (!ValidRunName(options.run_name)) {
    return InvalidArgument("--run_name: '" + options.run_name +
                           "' is not 1 to 100 of [A-Za-z0-9._-] starting "
                           "with a letter or digit");
  }
  return OkStatus();
}

Result<RunTarget> FindRunTarget(const RunOptions& options) {
  ASSIGN_OR_RETURN(ApiClient controller,
                   ApiClient::Create(options.controller_url, options.token,
                                     options.http_timeout));
  if (options.queued_resource.empty()) {
    Result<RunTarget> found = FindTargetByPrefix(
        controller, options.project, options.tpu_prefix, options.zone);
    const std::string flag = "--tpu_prefix";
    if (!found.ok() && found.status().message().rfind(flag, 0) == 0) {
      return Status(found.status().code(),
                    options.tpu_prefix_flag +
                        found.status().message().substr(flag.size()));
    }
    return found;
  }
  RunTarget target{options.queued_resource, nullptr};
  if (options.zone == "-") {
    RETURN_IF_ERROR(
        ForEachQueuedResource(controller, options.project, "-",
                              [&](const json& qr, const std::string& id) {
                                if (id == target.id) target.answer = qr;
                              }));
    return target;
  }
  // The id must be in that zone.
  ASSIGN_OR_RETURN(
      HttpResponse response,
      controller.Call("GET", "/v2alpha1/projects/" + options.project +
                                 "/locations/" + options.zone +
                                 "/queuedResources/" +
                                 options.queued_resource));
  if (response.status == 404) {
    return NotFound("--zone: project " + options.project + " has no " +
                    "queued resource " + options.queued_resource + " in zone " +
                    options.zone);
  }
  if (response.status / 100 != 2) return ErrorFromResponse(response);
  target.answer = response.body;
  return target;
}

Result<std::unique_ptr<PackedScripts>> PackRunScripts(const RunOptions& options,
                                                      RunOutput& output) {
  RETURN_IF_ERROR(output.MarkFolder());
  auto packed = std::make_unique<PackedScripts>();
  if (!packed->dir.ok()) {
    return Internal("cannot create a temporary directory for the scripts");
  }
  packed->archive = packed->dir.path() + "/code.tar.gz";
  PackOptions pack;
  pack.dir = options.script_dir;
  pack.archive = packed->archive;
  pack.flag = options.script_dir_flag;
  pack.program = "multislice run";
  pack.max_bytes = kMaxUploadBytes;
  pack.timeout = options.setup_timeout;
  pack.cancel = options.cancel;
  pack.err = options.err;
  pack.terminal = options.terminal;
  ASSIGN_OR_RETURN(PackSummary summary, PackDirectory(pack));
  if (summary.archive_bytes > kMaxUploadBytes) {
    return InvalidArgument(options.script_dir_flag + ": " + options.script_dir +
                           " packs into " + FormatBytes(summary.archive_bytes) +
                           ", more than a run copies to its workers (" +
                           FormatBytes(kMaxUploadBytes) + ")");
  }
  return packed;
}

}  // namespace multislice::control
