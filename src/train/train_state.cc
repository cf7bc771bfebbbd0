#include "train/train_state.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <utility>

#include "model/tensor_shard.h"

namespace multislice::train {
namespace {

Blob FloatBlob(const std::string& name, const float* data, int64_t count) {
  Blob blob;
  blob.name = name;
  blob.dtype = "f32";
  blob.shape = {count};
  blob.data.resize(static_cast<size_t>(count) * sizeof(float));
  std::memcpy(blob.data.data(), data, blob.data.size());
  return blob;
}

Result<int64_t> GetInt(const nlohmann::json& json, const char* field,
                       const std::string& where) {
  auto it = json.find(field);
  if (it == json.end() || !it->is_number_integer()) {
    return InvalidArgument(where + ": metadata field '" + field +
                           "' is missing or not an integer");
  }
  return it->get<int64_t>();
}

}  // namespace

std::string ShardBlobName(const std::string& kind, int64_t begin,
                          int tensor_rank, int tensor_size, int stage,
                          int stages) {
  std::string name = kind;
  if (stages > 1) name += ".s" + std::to_string(stage);
  if (tensor_size > 1) name += ".t" + std::to_string(tensor_rank);
  return name + "." + std::to_string(begin);
}

std::vector<Blob> ShardBlobs(const std::vector<StateShard>& shards) {
  std::vector<Blob> blobs;
  for (const StateShard& s : shards) {
    auto name = [&](const char* kind) {
      return ShardBlobName(kind, s.begin, s.tensor_rank, s.tensor_size, s.stage,
                           s.stages);
    };
    blobs.push_back(FloatBlob(name("params"), s.params, s.count));
    blobs.push_back(FloatBlob(name("adam_m"), s.adam_m, s.count));
    blobs.push_back(FloatBlob(name("adam_v"), s.adam_v, s.count));
  }
  return blobs;
}

nlohmann::json StateMetadata(int64_t step, const model::gpt::GptConfig& model,
                             const std::vector<std::string>& axis_names,
                             const std::vector<int>& mesh_shape, int num_slices,
                             const std::vector<StateShard>& shards,
                             const IteratorState& iterator,
                             int tensor_parallelism, int pipeline_parallelism) {
  nlohmann::json shard_list = nlohmann::json::array();
  for (const StateShard& s : shards) {
    nlohmann::json entry = {{"begin", s.begin}, {"count", s.count}};
    if (tensor_parallelism > 1) entry["tensor_rank"] = s.tensor_rank;
    if (pipeline_parallelism > 1) entry["stage"] = s.stage;
    shard_list.push_back(std::move(entry));
  }
  nlohmann::json meta = {{"format_version", kTrainStateFormatVersion},
                         {"step", step},
                         {"num_params", model::gpt::NumParameters(model)},
                         {"model",
                          {{"vocab_size", model.vocab_size},
                           {"max_seq_len", model.max_seq_len},
                           {"emb_dim", model.emb_dim},
                           {"num_heads", model.num_heads},
                           {"num_layers", model.num_layers},
                           {"mlp_dim", model.mlp_dim}}},
                         {"mesh",
                          {{"axis_names", axis_names},
                           {"shape", mesh_shape},
                           {"num_slices", num_slices}}},
                         {"shards", shard_list},
                         {"iterator", IteratorStateToJson(iterator)}};
  if (tensor_parallelism > 1) meta["tensor_parallelism"] = tensor_parallelism;
  if (pipeline_parallelism > 1) {
    meta["pipeline_parallelism"] = pipeline_parallelism;
  }
  return meta;
}

Result<model::gpt::GptConfig> ModelFromJson(const nlohmann::json& json) {
  model::gpt::GptConfig c;
  const std::string where = "checkpoint model";
  if (!json.is_object()) {
    return InvalidArgument("checkpoint metadata: 'model' is not an object");
  }
  ASSIGN_OR_RETURN(int64_t v, GetInt(json, "vocab_size", where));
  c.vocab_size = static_cast<int>(v);
  ASSIGN_OR_RETURN(v, GetInt(json, "max_seq_len", where));
  c.max_seq_len = static_cast<int>(v);
  ASSIGN_OR_RETURN(v, GetInt(json, "emb_dim", where));
  c.emb_dim = static_cast<int>(v);
  ASSIGN_OR_RETURN(v, GetInt(json, "num_heads", where));
  c.num_heads = static_cast<int>(v);
  ASSIGN_OR_RETURN(v, GetInt(json, "num_layers", where));
  c.num_layers = static_cast<int>(v);
  ASSIGN_OR_RETURN(v, GetInt(json, "mlp_dim", where));
  c.mlp_dim = static_cast<int>(v);
  RETURN_IF_ERROR(model::gpt::ValidateConfig(c));
  return c;
}

namespace {

// One model part's flat buffers (a tensor rank of a pipeline stage) while a
// checkpoint is reassembled, and the ranges its shards covered.
struct RankBuffers {
  std::vector<float> params, adam_m, adam_v;
  std::map<int64_t, int64_t> covered;  // begin -> end
};

// How the checkpoint's flat buffers split the model: part stage * t + rank.
struct Parts {
  int tensor = 1, stages = 1;
  int count() const { return tensor * stages; }
};

Result<int64_t> GetIndex(const nlohmann::json& shard, const char* field,
                         int size, const std::string& where) {
  if (size == 1) return int64_t{0};
  ASSIGN_OR_RETURN(int64_t v, GetInt(shard, field, where));
  if (v < 0 || v >= size) {
    return InvalidArgument(where + ": shard " + field + " " +
                           std::to_string(v) + " is outside [0, " +
                           std::to_string(size) + ")");
  }
  return v;
}

// Reads one host's shards into the parts' buffers.
Status ReadShards(const RestoredState& restored, const std::string& where,
                  const Parts& parts, std::vector<RankBuffers>& ranks) {
  const nlohmann::json& meta = restored.metadata;
  auto shards = meta.find("shards");
  if (shards == meta.end() || !shards->is_array()) {
    return InvalidArgument(where + ": metadata has no 'shards' list");
  }
  for (const nlohmann::json& s : *shards) {
    ASSIGN_OR_RETURN(int64_t begin, GetInt(s, "begin", where));
    ASSIGN_OR_RETURN(int64_t count, GetInt(s, "count", where));
    ASSIGN_OR_RETURN(int64_t rank,
                     GetIndex(s, "tensor_rank", parts.tensor, where));
    ASSIGN_OR_RETURN(int64_t stage, GetIndex(s, "stage", parts.stages, where));
    RankBuffers& r = ranks[static_cast<size_t>(stage * parts.tensor + rank)];
    const auto n = static_cast<int64_t>(r.params.size());
    if (begin < 0 || count < 0 || begin + count > n) {
      return InvalidArgument(where + ": shard [" + std::to_string(begin) +
                             ", " + std::to_string(begin + count) +
                             ") is outside the " + std::to_string(n) +
                             " parameters");
    }
    for (auto [kind, target] :
         {std::pair{"params", &r.params}, std::pair{"adam_m", &r.adam_m},
          std::pair{"adam_v", &r.adam_v}}) {
      const std::string name =
          ShardBlobName(kind, begin, static_cast<int>(rank), parts.tensor,
                        static_cast<int>(stage), parts.stages);
      auto blob = restored.blobs.find(name);
      if (blob == restored.blobs.end() ||
          blob->second.data.size() !=
              static_cast<size_t>(count) * sizeof(float)) {
        return InvalidArgument(where + ": blob '" + name +
                               "' is missing or not " + std::to_string(count) +
                               " f32 values");
      }
      std::memcpy(target->data() + begin, blob->second.data.data(),
                  blob->second.data.size());
    }
    r.covered[begin] = std::max(r.covered[begin], begin + count);
  }
  return OkStatus();
}

// The first element no shard covered, or the size when all are.
int64_t CoveredUpTo(const RankBuffers& r) {
  int64_t reached = 0;
  for (auto [begin, end] : r.covered) {
    if (begin > reached) break;
    reached = std::max(reached, end);
  }
  return reached;
}

// Host 0's split of the model, checked against the model.
Result<Parts> PartsOf(const nlohmann::json& meta,
                      const model::gpt::GptConfig& model,
                      const std::string& where) {
  Parts parts;
  int64_t t = 1, p = 1;
  if (meta.contains("tensor_parallelism")) {
    ASSIGN_OR_RETURN(t, GetInt(meta, "tensor_parallelism", where));
  }
  if (meta.contains("pipeline_parallelism")) {
    ASSIGN_OR_RETURN(p, GetInt(meta, "pipeline_parallelism", where));
  }
  if (t < 1 || t > 4096 ||
      !model::gpt::ValidateTensorParallelism(model, static_cast<int>(t)).ok()) {
    return InvalidArgument(where + ": tensor_parallelism " + std::to_string(t) +
                           " does not split the model");
  }
  if (p < 1 || p > 4096 ||
      !model::gpt::ValidatePipeline(model, static_cast<int>(p)).ok()) {
    return InvalidArgument(where + ": pipeline_parallelism " +
                           std::to_string(p) + " does not split the model");
  }
  parts.tensor = static_cast<int>(t);
  parts.stages = static_cast<int>(p);
  return parts;
}

// The buffers of every part, zeroed, at their sizes.
std::vector<RankBuffers> AllocateParts(const model::gpt::GptConfig& model,
                                       const Parts& parts) {
  std::vector<RankBuffers> ranks(static_cast<size_t>(parts.count()));
  for (int k = 0; k < parts.count(); ++k) {
    const auto local = static_cast<size_t>(model::gpt::NumParameters(
        model, parts.tensor, {k / parts.tensor, parts.stages}));
    RankBuffers& r = ranks[static_cast<size_t>(k)];
    r.params.assign(local, 0.0f);
    r.adam_m.assign(local, 0.0f);
    r.adam_v.assign(local, 0.0f);
  }
  return ranks;
}

// The whole model's buffers from its parts.
void AssembleParts(const Parts& parts, std::vector<RankBuffers>& ranks,
                   FullState& state) {
  if (parts.count() == 1) {
    state.params = std::move(ranks[0].params);
    state.adam_m = std::move(ranks[0].adam_m);
    state.adam_v = std::move(ranks[0].adam_v);
    return;
  }
  const auto whole =
      static_cast<size_t>(model::gpt::NumParameters(state.model));
  state.params.assign(whole, 0.0f);
  state.adam_m.assign(whole, 0.0f);
  state.adam_v.assign(whole, 0.0f);
  for (int k = 0; k < parts.count(); ++k) {
    const RankBuffers& b = ranks[static_cast<size_t>(k)];
    const int r = k % parts.tensor;
    const model::gpt::PipelineStage stage{k / parts.tensor, parts.stages};
    model::gpt::InsertTensorShard(state.model, parts.tensor, r, b.params.data(),
                                  state.params.data(), stage);
    model::gpt::InsertTensorShard(state.model, parts.tensor, r, b.adam_m.data(),
                                  state.adam_m.data(), stage);
    model::gpt::InsertTensorShard(state.model, parts.tensor, r, b.adam_v.data(),
                                  state.adam_v.data(), stage);
  }
}

}  // namespace

Result<FullState> LoadFullState(const CheckpointManager& manager,
                                int64_t step) {
  ASSIGN_OR_RETURN(int hosts, manager.HostCount(step));
  FullState state;
  state.step = step;
  int64_t num_params = -1;
  Parts parts;
  std::vector<RankBuffers> ranks;
  for (int host = 0; host < hosts; ++host) {
    ASSIGN_OR_RETURN(RestoredState restored, manager.Restore(step, host));
    const nlohmann::json& meta = restored.metadata;
    const std::string where = "checkpoint step " + std::to_string(step) +
                              " host " + std::to_string(host);
    ASSIGN_OR_RETURN(int64_t version, GetInt(meta, "format_version", where));
    if (version != kTrainStateFormatVersion) {
      return InvalidArgument(where + ": train state format_version " +
                             std::to_string(version) +
                             " is not supported (this build reads " +
                             std::to_string(kTrainStateFormatVersion) + ")");
    }
    ASSIGN_OR_RETURN(int64_t n, GetInt(meta, "num_params", where));
    if (host == 0) {
      ASSIGN_OR_RETURN(state.model, ModelFromJson(meta.contains("model")
                                                      ? meta["model"]
                                                      : nlohmann::json()));
      num_params = n;
      if (n != model::gpt::NumParameters(state.model)) {
        return InvalidArgument(
            where + ": num_params " + std::to_string(n) +
            " does not match the model's " +
            std::to_string(model::gpt::NumParameters(state.model)));
      }
      ASSIGN_OR_RETURN(parts, PartsOf(meta, state.model, where));
      ranks = AllocateParts(state.model, parts);
      auto it = meta.find("iterator");
      if (it == meta.end()) {
        return InvalidArgument(where + ": metadata has no 'iterator'");
      }
      ASSIGN_OR_RETURN(state.iterator, IteratorStateFromJson(*it));
      state.saved_mesh = meta.value("mesh", nlohmann::json::object());
    } else {
      ASSIGN_OR_RETURN(Parts mine, PartsOf(meta, state.model, where));
      if (n != num_params || mine.tensor != parts.tensor ||
          mine.stages != parts.stages) {
        return InvalidArgument(
            where + ": num_params " + std::to_string(n) +
            ", tensor_parallelism " + std::to_string(mine.tensor) +
            " and pipeline_parallelism " + std::to_string(mine.stages) +
            " differ from host 0's " + std::to_string(num_params) + ", " +
            std::to_string(parts.tensor) + " and " +
            std::to_string(parts.stages));
      }
    }
    RETURN_IF_ERROR(ReadShards(restored, where, parts, ranks));
  }
  for (size_t k = 0; k < ranks.size(); ++k) {
    const int64_t reached = CoveredUpTo(ranks[k]);
    if (reached < static_cast<int64_t>(ranks[k].params.size())) {
      const int r = static_cast<int>(k) % parts.tensor;
      const int stage = static_cast<int>(k) / parts.tensor;
      return InvalidArgument(
          "checkpoint step " + std::to_string(step) + ": parameters [" +
          std::to_string(reached) + ", ...) " +
          (parts.stages > 1 ? "of stage " + std::to_string(stage) + " " : "") +
          (parts.tensor > 1 ? "of tensor rank " + std::to_string(r) + " "
                            : "") +
          "are in no host's shards");
    }
  }
  AssembleParts(parts, ranks, state);
  return state;
}

Result<FullState> LoadLatestFullState(const CheckpointManager& manager,
                                      std::vector<std::string>* warnings) {
  ASSIGN_OR_RETURN(std::vector<int64_t> steps, manager.CompleteSteps());
  if (steps.empty()) return NotFound("no complete checkpoint");
  for (auto it = steps.rbegin(); it != steps.rend(); ++it) {
    Result<FullState> state = LoadFullState(manager, *it);
    if (state.ok()) return state;
    if (warnings) {
      warnings->push_back("checkpoint step " + std::to_string(*it) +
                          " skipped: " + state.status().message());
    }
  }
  return InvalidArgument(
      "no complete checkpoint could be read; the newest "
      "failed with: " +
      (warnings && !warnings->empty() ? warnings->front() : std::string("?")));
}

}  // namespace multislice::train
