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
// `export RUN_DIR` and `import DIR_OR_FILE`: checkpoints to and from Hugging
// Face's safetensors and config.json.
void AddExportCommand(CLI::App& root, CommandTable& table);
void AddImportCommand(CLI::App& root, CommandTable& table);
void AddJobCommand(CLI::App& root, CommandTable& table);
// `goodput RUN_DIR`: a run's or job's goodput and badput buckets.
void AddGoodputCommand(CLI::App& root, CommandTable& table);
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

// Every command, in the order `multislice --help` lists them: its group
// (command.h), its one-line summary, and the function that declares it. A new
// command is one line here.
inline void AddAllCommands(CLI::App& root, CommandTable& table) {
  RegisterCommand(
      root, table, kTrainGroup,
      "The seed's example workload (shardings.py): TFLOP/s on a mesh",
      AddShardingsCommand);
  RegisterCommand(root, table, kTrainGroup,
                  "Train a GPT-2 style language model across slices",
                  AddTrainCommand);
  RegisterCommand(root, table, kTrainGroup,
                  "Sample text from a train run's newest checkpoint",
                  AddGenerateCommand);
  RegisterCommand(root, table, kTrainGroup,
                  "Write a run's checkpoint as a Hugging Face model "
                  "(safetensors)",
                  AddExportCommand);
  RegisterCommand(root, table, kTrainGroup,
                  "Make a run directory from a Hugging Face model",
                  AddImportCommand);
  RegisterCommand(root, table, kTrainGroup,
                  "Training data tools (prepare the corpus)", AddDataCommand);
  RegisterCommand(root, table, kTrainGroup,
                  "Goodput and badput of a train run or a job, or of its "
                  "last seconds",
                  AddGoodputCommand);
  RegisterCommand(root, table, kPlanGroup,
                  "Print the device mesh of a parallelism configuration",
                  AddMeshCommand);
  RegisterCommand(root, table, kPlanGroup,
                  "Predict whether multislice training scales (DCN vs compute)",
                  AddPlanCommand);
  RegisterCommand(root, table, kClusterGroup,
                  "Request, list, describe, delete and ssh to queued resources",
                  AddQueuedResourcesCommand);
  RegisterCommand(
      root, table, kClusterGroup,
      "List, describe, ssh and scp to the nodes of queued resources",
      AddTpuVmCommand);
  RegisterCommand(root, table, kClusterGroup,
                  "Run a command on every worker of a queued resource",
                  AddRunCommand);
  RegisterCommand(root, table, kClusterGroup,
                  "Run a self-healing job on a new queued resource",
                  AddJobCommand);
  RegisterCommand(root, table, kClusterGroup,
                  "Run the queued-resource controller (API, scheduler, repair)",
                  AddControllerCommand);
  RegisterCommand(root, table, kClusterGroup,
                  "Run the host agent that starts workers on this host",
                  AddAgentCommand);
  RegisterCommand(root, table, kClusterGroup,
                  "Operator tools of the control plane", AddAdminCommand);
  RegisterCommand(
      root, table, kBenchmarkGroup,
      "Matmul peaks and memory bandwidth of one device, measured now",
      AddPeakCommand);
  RegisterCommand(root, table, kBenchmarkGroup,
                  "Collectives (nccl-tests format) and checkpoint benchmarks",
                  AddBenchCommand);
}

}  // namespace multislice::cli
