// The control-plane clients' connection flags (see control_client.h).
#include "cli/control_client.h"

#include <chrono>
#include <cstdlib>

#include "cli/flags.h"

namespace multislice::cli {

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

}  // namespace multislice::cli
