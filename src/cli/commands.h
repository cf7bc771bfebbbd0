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
// `bench checkpoint`, a subcommand of `bench`.
void AddBenchCheckpointCommand(CLI::App& bench, CommandTable& table);

inline void AddAllCommands(CLI::App& root, CommandTable& table) {
  AddMeshCommand(root, table);
  AddShardingsCommand(root, table);
  AddPlanCommand(root, table);
  AddPeakCommand(root, table);
  AddDataCommand(root, table);
  AddTrainCommand(root, table);
  AddGenerateCommand(root, table);
  AddBenchCommand(root, table);
}

}  // namespace multislice::cli
