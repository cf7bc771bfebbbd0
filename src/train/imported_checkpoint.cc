// The imported checkpoint's blobs and metadata (imported_checkpoint.h), and
// the MaxText model file of a DecoderConfig.
#include "train/imported_checkpoint.h"

#include <algorithm>
#include <charconv>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <utility>

#include "model/layout.h"
#include "train/checkpoint.h"
#include "train/data.h"
#include "train/train_state.h"

namespace multislice::train {
namespace {

// A shard blob of the whole flat buffer, its bytes `bytes` (moved in).
Blob WholeBufferBlob(const char* kind, std::vector<std::byte> bytes,
                     int64_t count) {
  Blob blob;
  blob.name = ShardBlobName(kind, 0, 0, 1);
  blob.dtype = "f32";
  blob.shape = {count};
  blob.data = std::move(bytes);
  return blob;
}

// The shortest text that reads back as exactly `v` ("1e-05", "10000").
std::string ExactNumber(double v) {
  char text[64];
  const auto end = std::to_chars(text, text + sizeof text, v).ptr;
  return std::string(text, end);
}

}  // namespace

Status WriteImportedCheckpoint(const std::string& checkpoint_dir,
                               const model::DecoderConfig& config,
                               std::vector<float> params,
                               const ImportedFrom& source) {
  const int64_t n = model::NumParameters(config);
  if (static_cast<int64_t>(params.size()) != n) {
    return InvalidArgument(
        "imported parameters: " + std::to_string(params.size()) +
        " values for a model of " + std::to_string(n));
  }
  std::vector<Blob> blobs;
  {
    std::vector<std::byte> bytes(params.size() * sizeof(float));
    std::memcpy(bytes.data(), params.data(), bytes.size());
    std::vector<float>().swap(params);
    blobs.push_back(WholeBufferBlob("params", std::move(bytes), n));
  }
  for (const char* kind : {"adam_m", "adam_v"}) {
    blobs.push_back(WholeBufferBlob(
        kind, std::vector<std::byte>(static_cast<size_t>(n) * sizeof(float)),
        n));
  }
  StateShard shard;
  shard.count = n;
  IteratorState iterator;  // step 0, one row: the trainer replaces it
  nlohmann::json metadata =
      StateMetadata(0, config, {"diloco", "data", "stage", "fsdp", "tensor"},
                    {1, 1, 1, 1, 1}, 1, {shard}, iterator);
  metadata["imported"] = {{"from", source.from},
                          {"architecture", source.architecture}};
  CheckpointOptions options;
  options.directory = checkpoint_dir;
  options.async = false;
  CheckpointManager manager(options);
  return manager.Save(0, std::move(blobs), std::move(metadata));
}

Result<nlohmann::json> ImportedMetadata(const std::string& checkpoint_dir,
                                        int64_t step) {
  const std::string path =
      checkpoint_dir + "/" + std::to_string(step) + "/host0.json";
  std::ifstream in(path);
  const nlohmann::json index = nlohmann::json::parse(in, nullptr, false);
  if (!index.is_object()) {
    return InvalidArgument(path + ": not a readable JSON object");
  }
  const nlohmann::json metadata =
      index.value("metadata", nlohmann::json::object());
  if (!metadata.is_object()) return nlohmann::json();
  return metadata.value("imported", nlohmann::json());
}

Result<bool> StartFromImportedWeights(const std::string& checkpoint_dir,
                                      int global_rows, uint64_t seed,
                                      int max_seq_len, FullState& state) {
  ASSIGN_OR_RETURN(const nlohmann::json imported,
                   ImportedMetadata(checkpoint_dir, state.step));
  if (imported.is_null()) return false;
  if (!model::UsesLearnedPositions(state.model)) {
    state.model.max_seq_len = max_seq_len;
  }
  state.step = 0;
  std::fill(state.adam_m.begin(), state.adam_m.end(), 0.0f);
  std::fill(state.adam_v.begin(), state.adam_v.end(), 0.0f);
  state.iterator = IteratorState{};
  state.iterator.global_rows = global_rows;
  state.iterator.seed = seed;
  return true;
}

std::string MaxTextModelYaml(const model::DecoderConfig& c,
                             const std::string& comment) {
  std::ostringstream y;
  std::istringstream lines(comment);
  for (std::string line; std::getline(lines, line);) y << "# " << line << "\n";
  const bool gpt3 = c.block == model::BlockKind::kGpt3;
  const char* act =
      c.mlp_activation == model::Activation::kSilu ? "silu" : "gelu";
  y << "decoder_block: \"" << model::BlockName(c.block) << "\"\n"
    << "base_emb_dim: " << c.emb_dim << "\n"
    << "base_num_query_heads: " << c.num_heads << "\n"
    << "base_num_kv_heads: " << c.num_kv_heads << "\n"
    << "head_dim: " << c.head_dim << "\n"
    << "base_mlp_dim: " << c.mlp_dim << "\n"
    << "base_num_decoder_layers: " << c.num_layers << "\n"
    << "vocab_size: " << c.vocab_size << "\n"
    << "mlp_activations: [\"" << act << "\""
    << (c.gated_mlp ? ", \"linear\"" : "") << "]\n"
    << "logits_via_embedding: " << (c.tied_embedding ? "true" : "false") << "\n"
    << "normalize_embedding_logits: "
    << (c.normalize_embedding_logits ? "true" : "false") << "\n"
    << "normalization_layer_epsilon: " << ExactNumber(c.norm_epsilon) << "\n"
    << "rope_max_timescale: " << ExactNumber(c.rope_max_timescale) << "\n";
  if (gpt3) {
    y << "# The learned position table's rows: the only sequence length the\n"
         "# weights fit.\n"
      << "max_target_length: " << c.max_seq_len << "\n";
  }
  return y.str();
}

}  // namespace multislice::train
