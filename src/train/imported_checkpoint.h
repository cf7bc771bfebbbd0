// What `multislice import` leaves in a run directory, and how the trainer
// recognises it: a checkpoint of step 0 holding another framework's weights
// (train_state.h's format: the whole model as one shard of one host, AdamW
// moments zero, the iterator at step 0, a one-device mesh) whose metadata
// also holds "imported": {"from": <the file or directory read>,
// "architecture": <its class, e.g. "LlamaForCausalLM">}; and the MaxText
// model file that describes the same model to `multislice train`.
//
// A run that restores an imported checkpoint takes its weights only: it
// starts at step 0 with fresh moments and its own iterator, so its global
// batch need not match (trainer_start.cc).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/status.h"
#include "model/decoder_config.h"
#include "train/train_state.h"

namespace multislice::train {

struct ImportedFrom {
  std::string from;          // what was read
  std::string architecture;  // "GPT2LMHeadModel", "LlamaForCausalLM", ...
};

// Saves step 0 under checkpoint_dir (created if missing) synchronously,
// with CheckpointManager's atomic commit. `params` holds the whole model's
// NumParameters(config) values in the flat layout; it is consumed (freed
// once copied), so that the moments' zeros do not double the peak memory.
// Errors are CheckpointManager::Save's (kInvalidArgument for a params size
// that does not match the config).
Status WriteImportedCheckpoint(const std::string& checkpoint_dir,
                               const model::DecoderConfig& config,
                               std::vector<float> params,
                               const ImportedFrom& source);

// The "imported" object of complete step `step`'s metadata (host 0's) under
// checkpoint_dir, or a null json for a checkpoint that was not imported.
// kInvalidArgument naming the file when it is not readable JSON.
Result<nlohmann::json> ImportedMetadata(const std::string& checkpoint_dir,
                                        int64_t step);

// For the trainer's restore: when `state`, loaded from complete step
// state.step under checkpoint_dir, is an imported checkpoint, makes it a
// start from its weights only (step 0, zero moments, the iterator of a run
// of `global_rows` rows and `seed` at step 0; a rotary model's max_seq_len
// the run's `max_seq_len`, since its positions are not parameters) and
// returns true; returns false and leaves any other checkpoint as it is.
Result<bool> StartFromImportedWeights(const std::string& checkpoint_dir,
                                      int global_rows, uint64_t seed,
                                      int max_seq_len, FullState& state);

// A MaxText model file (YAML; MaxText's key names: decoder_block,
// base_emb_dim, base_num_query_heads, ...) whose keys make `multislice
// train ... model_name=<the file>` build `config`: numbers printed so that
// they read back exactly, and for gpt3 max_target_length too (its learned
// positions are parameters). `comment` opens the file as '#' lines.
std::string MaxTextModelYaml(const model::DecoderConfig& config,
                             const std::string& comment);

}  // namespace multislice::train
