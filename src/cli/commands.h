// Every subcommand of `multislice`, registered in one place.
#pragma once

#include "cli/command.h"

namespace multislice::cli {

void AddMeshCommand(CLI::App& root, CommandTable& table);
void AddBenchCommand(CLI::App& root, CommandTable& table);
void AddShardingsCommand(CLI::App& root, CommandTable& table);
void AddPlanCommand(CLI::App& root, CommandTable& table);
void AddPeakCommand(CLI::App& root, CommandTable& table);
void AddDataCommand(CLI::App& root, CommandTable& table);
void AddTrainCommand(CLI::App& root, CommandTable& table);
void AddGenerateCommand(CLI::App& root, CommandTable& table);
void AddJobCommand(CLI::App& root, CommandTable& table);
// `bench checkpoint`, a subcommand of `bench`.
void AddBenchCheckpointCommand(CLI::App& bench, CommandTable& table);
void AddControllerCommand(CLI::App& root, CommandTable& table);
void AddAgentCommand(CLI::App& root, CommandTable& table);
void AddQueuedResourcesCommand(CLI::App& root, CommandTable& table);
void AddAdminCommand(CLI::App& root, CommandTable& table);
// `queued-resources ssh`, added under the queued-resources command.
void AddQueuedResourcesSshCommand(CLI::App& queued_resources,
                                  CommandTable& table);
// `run`: a command on every worker of a queued resource (runner.h).
void AddRunCommand(CLI::App& root, CommandTable& table);
// `tpu-vm list|describe|ssh|scp`: the nodes of queued resources.
void AddTpuVmCommand(CLI::App& root, CommandTable& table);

inline void AddAllCommands(CLI::App& root, CommandTable& table) {
  AddMeshCommand(root, table);
  AddShardingsCommand(root, table);
  AddPlanCommand(root, table);
  AddPeakCommand(root, table);
  AddDataCommand(root, table);
  AddTrainCommand(root, table);
  AddGenerateCommand(root, table);
  AddJobCommand(root, table);
  AddBenchCommand(root, table);
  AddControllerCommand(root, table);
  AddAgentCommand(root, table);
  AddQueuedResourcesCommand(root, table);
  AddTpuVmCommand(root, table);
  AddAdminCommand(root, table);
  AddRunCommand(root, table);
}

}  // namespace multislice::cli
