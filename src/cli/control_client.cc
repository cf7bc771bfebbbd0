// The control-plane clients' shared flags and helpers (see
// control_client.h).
#include "cli/control_client.h"

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdlib>
#include <optional>
#include <regex>
#include <utility>
#include <vector>

#include "cli/flags.h"
#include "control/validation.h"

namespace multislice::cli {

using nlohmann::json;

void AddControllerFlags(CLI::App* cmd, ControllerFlags* flags) {
  AddStringFlag(cmd, "controller", &flags->controller,
                "The controller, http://HOST:PORT (default: "
                "$MULTISLICE_CONTROLLER).");
  AddStringFlag(cmd, "token_file", &flags->token_file,
                "File holding the controller's bearer token (default: "
                "$MULTISLICE_TOKEN_FILE).");
}

Result<control::ApiClient> MakeControllerClient(const ControllerFlags& flags) {
  std::string url = flags.controller;
  if (url.empty()) {
    const char* env = std::getenv("MULTISLICE_CONTROLLER");
    if (env) url = env;
  }
  if (url.empty()) {
    return InvalidArgument(
        "--controller: not given and MULTISLICE_CONTROLLER is not set");
  }
  std::string token_file = flags.token_file;
  if (token_file.empty()) {
    const char* env = std::getenv("MULTISLICE_TOKEN_FILE");
    if (env) token_file = env;
  }
  if (token_file.empty()) {
    return InvalidArgument(
        "--token-file: not given and MULTISLICE_TOKEN_FILE is not set");
  }
  Result<std::string> token = control::ReadToken(token_file);
  if (!token.ok()) {
    return InvalidArgument("--token-file: " + token.status().message());
  }
  Result<control::ApiClient> client = control::ApiClient::Create(
      url, *token, std::chrono::seconds(flags.timeout_seconds));
  if (!client.ok()) {
    return InvalidArgument("--controller: " + client.status().message());
  }
  return client;
}

void AddLocationFlags(CLI::App* cmd, std::string* project, std::string* zone) {
  const char* env_project = std::getenv("CLOUDSDK_CORE_PROJECT");
  const char* env_zone = std::getenv("CLOUDSDK_COMPUTE_ZONE");
  *project = env_project && *env_project ? env_project : "local";
  *zone = env_zone && *env_zone ? env_zone : "local-a";
  AddStringFlag(cmd, "project", project,
                "Project of the resource ($CLOUDSDK_CORE_PROJECT, else "
                "local).");
  AddStringFlag(cmd, "zone", zone,
                "Zone of the resource ($CLOUDSDK_COMPUTE_ZONE, else "
                "local-a).");
}

CLI::Option* AddDashedIntFlag(CLI::App* cmd, const std::string& underscore_name,
                              int* target, const std::string& description) {
  std::string flag = "--" + underscore_name;
  std::replace(flag.begin(), flag.end(), '_', '-');
  return cmd
      ->add_option_function<std::string>(
          FlagNames(underscore_name),
          [flag, target](const std::string& text) {
            const std::optional<long long> value = ParseInteger(text);
            if (!value || *value < INT_MIN || *value > INT_MAX) {
              throw CLI::ValidationError(flag,
                                         "'" + text + "' is not an integer");
            }
            *target = static_cast<int>(*value);
          },
          description)
      ->type_name("INT")
      ->default_str(std::to_string(*target))
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
}

void AddQuietFlag(CLI::App* cmd, bool* quiet) {
  cmd->add_flag("--quiet,-q", *quiet,
                "gcloud's no-prompt flag: accepted (nothing here prompts).");
}

void AddOutputFlags(CLI::App* cmd, OutputFlags* flags,
                    const std::string& default_name) {
  AddStringFlag(cmd, "format", &flags->format,
                "gcloud's output format: yaml, json, table, value(KEY,...), "
                "table(KEY[:label=L],...), csv(...), flattened or none; KEYs "
                "are dotted paths such as state.state (default: " +
                    default_name + ").");
  AddBoolFlag(cmd, "json", &flags->json, "The same as --format=json.");
}

Result<OutputFormat> ParseOutputFlags(const OutputFlags& flags,
                                      std::string_view default_format,
                                      std::string_view table_format) {
  if (flags.json && !flags.format.empty() && flags.format != "json") {
    return InvalidArgument("--json: cannot be given with --format=" +
                           flags.format);
  }
  const std::string text = flags.json             ? "json"
                           : flags.format.empty() ? std::string(default_format)
                                                  : flags.format;
  return ParseFormat(text, table_format);
}

Status CheckResourceName(std::string_view what, std::string_view value) {
  if (control::IsResourceId(value)) return OkStatus();
  return InvalidArgument(
      std::string(what) + ": " + control::QuoteForMessage(value) +
      " is not a valid name: use 1 to " +
      std::to_string(control::kMaxIdLength) +
      " lower-case letters, digits and hyphens, starting with a letter and "
      "not ending with a hyphen");
}

std::string InCliTerms(std::string message) {
  static const std::vector<std::pair<std::regex, std::string>> kFlags = [] {
    const std::string node = R"(tpu\.node_spec\[0\]\.)";
    const std::vector<std::pair<std::string, std::string>> table = {
        {node + R"(multi_node_params\.node_count)", "--node-count"},
        {node + R"(multi_node_params\.node_id_prefix)", "--node-prefix"},
        {node + R"(multi_node_params)", "--node-count"},
        {node + R"(node_id)", "--node-id"},
        {node + R"(node\.accelerator_type)", "--accelerator-type"},
        {node + R"(node\.runtime_version)", "--runtime-version"},
        {node + R"(node\.network_config\.network)", "--network"},
        {node + R"(node\.network_config\.subnetwork)", "--subnetwork"},
        {node + R"(node\.tags(\[[0-9]+\])?)", "--tags"},
        {node + R"(node\.metadata(\[[^\]]*\]|\.[-A-Za-z0-9_]+)?)",
         "--metadata"},
        {node + R"(parent)", "--project/--zone"},
        {R"(queueing_policy\.valid_until_duration)", "--valid-until-duration"},
        {R"(queueing_policy\.valid_until_time)", "--valid-until-time"},
        {R"(queueing_policy\.valid_after_duration)", "--valid-after-duration"},
        {R"(queueing_policy\.valid_after_time)", "--valid-after-time"},
        {R"(\bqueued_resource_id\b)", "QR"},
        {R"(^queued_resource:)", "QR:"},
        {R"(^location:)", "--zone:"},
        {R"(^project:)", "--project:"},
        {R"(\bpass force=true\b)", "pass --force"},
        {R"(\bwithout force\b)", "without --force"},
    };
    std::vector<std::pair<std::regex, std::string>> compiled;
    for (const auto& [pattern, flag] : table) {
      compiled.emplace_back(std::regex(pattern), flag);
    }
    return compiled;
  }();
  for (const auto& [pattern, flag] : kFlags) {
    message = std::regex_replace(message, pattern, flag);
  }
  return message;
}

Result<json> CheckedBody(Result<control::HttpResponse> response) {
  if (!response.ok()) return response.status();
  if (response->status < 200 || response->status >= 300) {
    return control::ErrorFromResponse(*response);
  }
  return response->body;
}

Result<json> ListAllPages(const control::ApiClient& client,
                          const std::string& path, const std::string& field) {
  json all = json::array();
  std::string token;
  for (int page = 0; page < 100000; ++page) {
    ASSIGN_OR_RETURN(
        json body,
        CheckedBody(client.Call(
            "GET", path + "?pageSize=500" +
                       (token.empty() ? "" : "&pageToken=" + token))));
    for (const json& item : body.value(field, json::array())) {
      all.push_back(item);
    }
    token = body.value("nextPageToken", "");
    if (token.empty()) break;
  }
  return all;
}

}  // namespace multislice::cli
