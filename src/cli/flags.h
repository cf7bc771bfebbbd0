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
#include <optional>
#include <string>

#include "runtime/mesh/parallelism.h"

namespace multislice::cli {

// "ici_fsdp_parallelism" -> "--ici_fsdp_parallelism,--ici-fsdp-parallelism"
// (plus `short_name`, e.g. "-i", when given).
std::string FlagNames(const std::string& underscore_name,
                      const std::string& short_name = "");

// A whole decimal integer, optionally negative ("42", "-1", "007"); nullopt
// for anything else ("abc", "1.5", "0x10", "+3", " 3", "") or a value beyond
// long long.
std::optional<long long> ParseInteger(const std::string& text);

// Each Add*Flag below registers FlagNames(underscore_name), shows the current
// *target as the default in --help, writes *target only when the flag is
// given, and lets the last of repeated flags win (as argparse does).

// Adds an integer flag. The value is parsed as a whole decimal integer
// (optionally negative); anything else is a ValidationError with the message
// above, and a value outside int is "--name: '...' is not an integer from
// -2147483648 to 2147483647".
CLI::Option* AddIntFlag(CLI::App* app, const std::string& underscore_name,
                        int* target, const std::string& description);
// Adds a byte-size flag (see ParseByteSize); a bad value is
// "--name: 'abc' is not a byte size (e.g. 1048576, 64K, 256MiB)".
CLI::Option* AddSizeFlag(CLI::App* app, const std::string& underscore_name,
                         long long* target, const std::string& description);
// Adds a text flag taken as given.
CLI::Option* AddStringFlag(CLI::App* app, const std::string& underscore_name,
                           std::string* target, const std::string& description);
// Adds a flag without a value that sets *target to true.
CLI::Option* AddBoolFlag(CLI::App* app, const std::string& underscore_name,
                         bool* target, const std::string& description);

// MaxText's runners spell their flags in upper case (multihost_runner.py's
// --COMMAND, --SCRIPT_DIR, ...). Each Add*Alias registers `--ALIAS`, that
// spelling only, as an option hidden from --help (name it in the flag's
// description) that writes the same target with the same checks, its
// errors naming --ALIAS.
CLI::Option* AddIntAlias(CLI::App* app, const std::string& alias, int* target);
CLI::Option* AddStringAlias(CLI::App* app, const std::string& alias,
                            std::string* target);
// Takes argparse's string booleans: `--ALIAS`, `--ALIAS=True`, `--ALIAS
// false` (true/false, 1/0, yes/no in any case); anything else is
// "--ALIAS: 'x' is not true or false".
CLI::Option* AddBoolAlias(CLI::App* app, const std::string& alias,
                          bool* target);
// The spelling to name in a message about the flag's value: "--ALIAS" when
// the alias was given on the command line, else "--underscore_name".
std::string Spelled(const CLI::App* app, const std::string& underscore_name,
                    const std::string& alias);

// Adds --ici_{data,fsdp,tensor}_parallelism and --dcn_{...}_parallelism,
// defaults from `config`.
void AddParallelismFlags(CLI::App* app, mesh::ParallelismConfig* config);

// Parses a byte size such as "1K", "64M", "256MiB", "1048576" (K/M/G/T are
// binary: 1K = 1024; the suffixes K, KB, KiB, B ... in any case). Returns -1
// when the text is not a size or does not fit in a long long.
long long ParseByteSize(const std::string& text);

}  // namespace multislice::cli
