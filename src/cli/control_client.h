// What the control-plane clients (`queued-resources`, `tpu-vm`, `admin`)
// share: the --controller / --token-file flags with their environment
// defaults (MULTISLICE_CONTROLLER, MULTISLICE_TOKEN_FILE), the API client
// they make, and gcloud's habits: --project/--zone (defaults from
// $CLOUDSDK_CORE_PROJECT / $CLOUDSDK_COMPUTE_ZONE), --quiet, --format and
// --json, Cloud TPU's name rule checked before any call, and API messages
// retold in terms of the CLI's flags.
#pragma once

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "cli/gcloud_format.h"
#include "common/status.h"
#include "control/http.h"

namespace multislice::cli {

struct ControllerFlags {
  std::string controller;
  std::string token_file;
  int timeout_seconds = 30;  // per request
};

// Adds --controller and --token-file to `cmd`.
void AddControllerFlags(CLI::App* cmd, ControllerFlags* flags);

// The client for `flags` (flag, else environment); kInvalidArgument naming
// the flag when neither gives a usable value.
Result<control::ApiClient> MakeControllerClient(const ControllerFlags& flags);

// Adds --project and --zone. Their defaults: $CLOUDSDK_CORE_PROJECT and
// $CLOUDSDK_COMPUTE_ZONE (gcloud's own variables) when set, else "local" and
// "local-a" (the controller's defaults).
void AddLocationFlags(CLI::App* cmd, std::string* project, std::string* zone);

// AddIntFlag (flags.h) for gcloud-shaped commands: a bad value is named by
// the dashed spelling users type, "--node-count: 'abc' is not an integer".
CLI::Option* AddDashedIntFlag(CLI::App* cmd, const std::string& underscore_name,
                              int* target, const std::string& description);

// Adds gcloud's global --quiet / -q. Nothing here prompts, so it changes
// nothing; it is accepted so that pasted gcloud lines run.
void AddQuietFlag(CLI::App* cmd, bool* quiet);

// --format (gcloud's, see gcloud_format.h) and --json (--format=json).
struct OutputFlags {
  std::string format;
  bool json = false;
};
void AddOutputFlags(CLI::App* cmd, OutputFlags* flags,
                    const std::string& default_name);
// The format the flags ask for, else `default_format`; a table, value or
// csv without columns takes those of `table_format`.
Result<OutputFormat> ParseOutputFlags(const OutputFlags& flags,
                                      std::string_view default_format,
                                      std::string_view table_format);

// Cloud TPU's rule for queued resource and node names: 1 to 63 lower-case
// letters, digits and hyphens, starting with a letter and not ending with a
// hyphen. InvalidArgument naming `what` (a flag or argument, e.g. "QR" or
// "--node-prefix") otherwise.
Status CheckResourceName(std::string_view what, std::string_view value);

// An API error message in the CLI's terms: request fields
// (tpu.node_spec[0].multi_node_params.node_count, force=true, ...) become
// the flags that set them (--node-count, --force, ...).
std::string InCliTerms(std::string message);

// The body of a 2xx answer, else the answer's error.
Result<nlohmann::json> CheckedBody(Result<control::HttpResponse> response);

// Every item of a paged list (GET path?pageSize=...&pageToken=...): the
// arrays under `field` of every page, in order.
Result<nlohmann::json> ListAllPages(const control::ApiClient& client,
                                    const std::string& path,
                                    const std::string& field);

}  // namespace multislice::cli
