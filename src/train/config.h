// The trainer's configuration, MaxText style: a YAML file of `key: value`
// scalars (configs/base.yml lists every key with its default) followed by
// `key=value` overrides from the command line, e.g.
//
//   multislice train configs/base.yml steps=50 run_name=smoke
//
// Every key lives in one table in config.cc (name, type, member, help), so
// parsing, ToJson, the list of known keys and the help text cannot drift
// apart. Defaults live only in the member initializers below.
//
// Errors are kInvalidArgument with one sentence that names the key, the value,
// where it came from and what was expected.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "common/status.h"

namespace multislice {

struct TrainConfig {
  // Run identity and output. The run writes into RunDirectory(config).
  std::string run_name;  // "" = the caller picks a timestamp
  std::string base_output_directory = "runs";

  // Loop and batch shape.
  int steps = 200;
  int per_device_batch_size = 8;  // sequences per device per step
  int max_target_length = 128;    // tokens per sequence

  // Mesh: devices per axis within a slice (ici_*) and slices per axis (dcn_*).
  // -1 means "whatever is left"; at most one axis per group may be -1.
  // The mesh's axes are MaxText's: diloco, data, stage (the *_pipeline_*
  // keys), fsdp, tensor.
  int ici_diloco_parallelism = 1;
  int ici_data_parallelism = 1;
  int ici_pipeline_parallelism = 1;
  int ici_fsdp_parallelism = -1;
  int ici_tensor_parallelism = 1;
  int dcn_diloco_parallelism = 1;
  int dcn_data_parallelism = -1;
  int dcn_pipeline_parallelism = 1;
  int dcn_fsdp_parallelism = 1;
  int dcn_tensor_parallelism = 1;
  // Pipelines (with more than one stage): microbatches per step (-1 = one
  // per stage) and the schedule, "GPipe" or "1F1B".
  int num_pipeline_microbatches = -1;
  std::string pipeline_parallel_schedule = "1F1B";

  // DiLoCo (train/diloco.h): the diloco axis's replicas train on their own
  // and every diloco_sync_period steps average their pseudo-gradients into
  // one outer step of SGD with Nesterov momentum. Streaming DiLoCo syncs
  // num_diloco_fragments fragments of whole layers in turn, each overlapping
  // num_communication_overlapping_steps inner steps and mixed back with
  // weight communication_overlapping_alpha on the local values.
  bool enable_diloco = false;
  int diloco_sync_period = 36;
  double diloco_outer_lr = 0.3;
  double diloco_outer_momentum = 0.9;
  bool enable_streaming_diloco = false;
  int num_diloco_fragments = 1;
  int num_communication_overlapping_steps = 0;
  double communication_overlapping_alpha = 0.0;
  // How the pseudo-gradient crosses DCN, and the per-step gradient
  // all-reduce of data parallelism across slices: f32, bf16 or int8.
  std::string diloco_wire_dtype = "f32";
  std::string dcn_gradient_wire_dtype = "f32";
  // A lost slice drops its replica from the next syncs while the other
  // replicas go on (docs/diloco.md), instead of stopping the job.
  bool diloco_continue_on_failure = false;
  // With it: how many times the local launcher starts a lost slice again;
  // the restarted slice rejoins at the next sync. 0: it stays lost.
  int diloco_max_slice_restarts = 3;

  // Model. model_name names a MaxText model file (configs/models/NAME.yml)
  // whose keys LoadTrainConfig applies over the config file; "default" =
  // none. decoder_block is MaxText's name of the layer's style: gpt3,
  // llama2, mistral or gemma.
  std::string model_name = "default";
  std::string decoder_block = "gpt3";
  int vocab_size = 256;
  int emb_dim = 256;  // a multiple of num_heads
  int num_heads = 4;
  int num_kv_heads = -1;  // -1 = num_heads (MaxText: base_num_kv_heads)
  int head_dim = -1;      // -1 = emb_dim / num_heads
  int num_decoder_layers = 4;
  int mlp_dim = 1024;
  // The MLP's activations, each gelu, silu, relu or linear; two entries make
  // a gated MLP (MaxText: ["silu", "linear"] is SwiGLU). Empty = the
  // decoder block's own.
  std::vector<std::string> mlp_activations = {};
  // The output head is the token embedding transposed (tied weights).
  bool logits_via_embedding = true;
  // A tied head's logits divided by sqrt(emb_dim), as MaxText does by
  // default (its Gemma); false here by default: GPT-2's tied head is not
  // scaled. No effect on an untied head.
  bool normalize_embedding_logits = false;
  double normalization_layer_epsilon = 1e-5;  // > 0, in every norm layer
  double rope_max_timescale = 10000;          // RoPE's longest wavelength
  // The master weights' dtype; only float32 (matmuls run in `dtype`).
  std::string weight_dtype = "float32";

  // Optimizer: AdamW with linear warmup, then cosine decay to
  // learning_rate * cosine_learning_rate_final_fraction at `steps`.
  double learning_rate = 1e-3;
  int warmup_steps = 20;
  double cosine_learning_rate_final_fraction = 0.1;
  double adam_b1 = 0.9;
  double adam_b2 = 0.95;
  double adam_eps = 1e-8;
  double adam_weight_decay = 0.1;
  double gradient_clipping_threshold = 1.0;  // global norm; 0 = no clipping

  // Checkpoints.
  int checkpoint_period = 50;  // steps between checkpoints
  int max_num_checkpoints_to_keep = 3;
  bool async_checkpointing = true;
  bool enable_checkpointing = true;

  // In-memory recovery: every in_memory_replica_period steps each host keeps
  // a copy of its training state in host memory (MULTISLICE_HOST_MEMORY_DIR,
  // default /dev/shm); a restarted job that finds a replica newer than the
  // newest checkpoint on every data replica's hosts restores from it,
  // sending it over DCN to the hosts that lack it (a repaired slice).
  bool enable_in_memory_recovery = false;
  int in_memory_replica_period = 1;

  // Data and evaluation.
  std::string dataset_path;  // "" = the default prepared fortunes dataset
  // The tokenizer: a SentencePiece model file ("" = byte-level tokens,
  // vocabulary 256), and whether each document gets BOS and EOS tokens.
  std::string tokenizer_path;
  std::string tokenizer_type = "sentencepiece";  // the only one here
  bool add_bos = true;
  bool add_eos = true;
  int eval_interval = 20;  // steps between evaluations
  int eval_batches = 4;    // batches per evaluation

  // Numerics and logging.
  int seed = 0;
  // bfloat16 or float32 (bf16, f32 and float accepted and stored as those)
  std::string dtype = "bfloat16";
  bool deterministic = false;
  int log_period = 1;  // steps between log lines

  // Observability (docs/observability.md).
  // A collective that has not completed this long makes every worker report
  // where its devices are and one write the hang digest; 0 = automatic
  // (5x the median step time, at least 30 s), always below the DCN timeout.
  double hang_timeout_seconds = 0;
  // Every straggler_report_interval steps (0: never) the workers' compute
  // times are compared; a worker whose score against the fastest worker or
  // against its own best is below the threshold is reported.
  int straggler_report_interval = 10;
  double straggler_relative_threshold = 0.7;
  double straggler_individual_threshold = 0.7;
  // A Prometheus text-format file worker 0 rewrites after every step (the
  // node exporter's textfile collector reads it); "" = none.
  std::string prometheus_metrics_file;
  // MaxText's profiler keys: "xplane" writes one Chrome/Perfetto trace per
  // worker of profiler_steps steps after skip_first_n_steps_for_profiler
  // ("" = none).
  std::string profiler;
  int skip_first_n_steps_for_profiler = 1;
  int profiler_steps = 5;

  friend bool operator==(const TrainConfig&, const TrainConfig&) = default;
};

// Reads the YAML mapping at `yaml_path` on top of the defaults, then applies
// `overrides` of the form "key=value" in order (later wins; the value is
// taken verbatim, no YAML quoting). Values are scalars, except the list keys
// (mlp_activations): a YAML list in a file, `[a,b]` or `a,b` in an override.
// Does not check value ranges: call ValidateTrainConfig on the result.
Result<TrainConfig> LoadTrainConfig(const std::string& yaml_path,
                                    const std::vector<std::string>& overrides);

// Applies "key=value" overrides to `config` in order. `where` names their
// source in error messages ("the command line").
Status ApplyTrainConfigOverrides(const std::vector<std::string>& overrides,
                                 const std::string& where, TrainConfig& config);

// Checks value ranges and relations between keys (e.g. emb_dim divisible by
// num_heads). Returns the first problem found.
Status ValidateTrainConfig(const TrainConfig& config);

// With ici_stages x dcn_stages pipeline stages and `tensor` tensor ranks
// (the config's values, or the mesh's once resolved): the stages on one
// level only, dividing the layers, and the microbatches dividing the rows
// each pipeline sees; kInvalidArgument naming the keys otherwise.
Status CheckPipelineSplit(const TrainConfig& config, int ici_stages,
                          int dcn_stages, int tensor);
// With ici_replicas x dcn_replicas DiLoCo replicas (the config's values or
// the mesh's): more than one needs enable_diloco.
Status CheckDilocoReplicas(const TrainConfig& config, int ici_replicas,
                           int dcn_replicas);
// With diloco_continue_on_failure: one DiLoCo replica per slice, at least
// two, so that a lost slice takes exactly one replica with it.
Status CheckLosableSlices(const TrainConfig& config, int ici_replicas,
                          int dcn_replicas, int num_slices);
// num_pipeline_microbatches, with -1 resolved to `stages`.
int PipelineMicrobatches(const TrainConfig& config, int stages);

// The matmul dtype of a validated config.
DType MatmulDType(const TrainConfig& config);

// Every key with its value, for config.json in the run directory (a list key
// as a JSON array). Writing the values back as overrides ("key=" + value,
// strings unquoted, arrays as JSON) gives the same config.
nlohmann::json ToJson(const TrainConfig& config);

// base_output_directory + "/" + run_name. run_name must already be set.
std::string RunDirectory(const TrainConfig& config);

// The known keys in table order (the order of configs/base.yml).
std::vector<std::string> TrainConfigKeys();

// One line per key, "  name (type, default D): help", for `--help` output;
// type is string, int, float, bool or list.
std::string DescribeTrainConfigKeys();

}  // namespace multislice
