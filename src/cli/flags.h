// Flag helpers shared by the commands.
//
// Commands that mirror MaxText (`mesh`, `shardings`, `train`, `bench`) use
// underscore names (`--ici_fsdp_parallelism`); each flag also accepts the
// dashed spelling (`--ici-fsdp-parallelism`). Values are checked by us, not
// by CLI11's converters, so that a bad value gives one sentence naming the
// flag, the value and what was expected, e.g.
//   "--ici_fsdp_parallelism: 'abc' is not an integer"
// and the command exits with code 2.
#pragma once

#include <CLI/CLI.hpp>
#include <string>

#include "runtime/mesh/parallelism.h"

namespace multislice::cli {

// "ici_fsdp_parallelism" -> "--ici_fsdp_parallelism,--ici-fsdp-parallelism"
// (plus `short_name`, e.g. "-i", when given).
std::string FlagNames(const std::string& underscore_name,
                      const std::string& short_name = "");

// Adds an integer flag. The value is parsed as a whole decimal integer
// (optionally negative); anything else is a ValidationError with the message
// above.
CLI::Option* AddIntFlag(CLI::App* app, const std::string& underscore_name,
                        int* target, const std::string& description);
CLI::Option* AddSizeFlag(CLI::App* app, const std::string& underscore_name,
                         long long* target, const std::string& description);

// Adds --ici_{data,fsdp,tensor}_parallelism and --dcn_{...}_parallelism,
// defaults from `config`.
void AddParallelismFlags(CLI::App* app, mesh::ParallelismConfig* config);

// Parses a byte size such as "1K", "64M", "256MiB", "1048576" (K/M/G are
// binary: 1K = 1024). Returns -1 when the text is not a size.
long long ParseByteSize(const std::string& text);

}  // namespace multislice::cli
