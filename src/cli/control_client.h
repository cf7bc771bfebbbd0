// What the control-plane clients (`queued-resources`, `admin`) share: the
// --controller / --token-file flags with their environment defaults
// (MULTISLICE_CONTROLLER, MULTISLICE_TOKEN_FILE), and the API client they
// make.
#pragma once

#include <CLI/CLI.hpp>
#include <string>

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

}  // namespace multislice::cli
