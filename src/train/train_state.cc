#include "train/train_state.h"

#include <algorithm>
#include <cstring>
#include <map>

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

std::vector<Blob> ShardBlobs(const std::vector<StateShard>& shards) {
  std::vector<Blob> blobs;
  for (const StateShard& s : shards) {
    const std::string at = "." + std::to_string(s.begin);
    blobs.push_back(FloatBlob("params" + at, s.params, s.count));
    blobs.push_back(FloatBlob("adam_m" + at, s.adam_m, s.count));
    blobs.push_back(FloatBlob("adam_v" + at, s.adam_v, s.count));
  }
  return blobs;
}

nlohmann::json StateMetadata(int64_t step, const model::gpt::GptConfig& model,
                             const std::vector<std::string>& axis_names,
                             const std::vector<int>& mesh_shape, int num_slices,
                             const std::vector<StateShard>& shards,
                             const IteratorState& iterator) {
  nlohmann::json shard_list = nlohmann::json::array();
  for (const StateShard& s : shards) {
    shard_list.push_back({{"begin", s.begin}, {"count", s.count}});
  }
  return {{"format_version", kTrainStateFormatVersion},
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

Result<FullState> LoadFullState(const CheckpointManager& manager,
                                int64_t step) {
  ASSIGN_OR_RETURN(int hosts, manager.HostCount(step));
  FullState state;
  state.step = step;
  int64_t num_params = -1;
  // Covered ranges, to prove every element was restored.
  std::map<int64_t, int64_t> covered;  // begin -> end
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
      state.params.assign(static_cast<size_t>(n), 0.0f);
      state.adam_m.assign(static_cast<size_t>(n), 0.0f);
      state.adam_v.assign(static_cast<size_t>(n), 0.0f);
      auto it = meta.find("iterator");
      if (it == meta.end()) {
        return InvalidArgument(where + ": metadata has no 'iterator'");
      }
      ASSIGN_OR_RETURN(state.iterator, IteratorStateFromJson(*it));
      state.saved_mesh = meta.value("mesh", nlohmann::json::object());
    } else if (n != num_params) {
      return InvalidArgument(where + ": num_params " + std::to_string(n) +
                             " differs from host 0's " +
                             std::to_string(num_params));
    }
    auto shards = meta.find("shards");
    if (shards == meta.end() || !shards->is_array()) {
      return InvalidArgument(where + ": metadata has no 'shards' list");
    }
    for (const nlohmann::json& s : *shards) {
      ASSIGN_OR_RETURN(int64_t begin, GetInt(s, "begin", where));
      ASSIGN_OR_RETURN(int64_t count, GetInt(s, "count", where));
      if (begin < 0 || count < 0 || begin + count > num_params) {
        return InvalidArgument(where + ": shard [" + std::to_string(begin) +
                               ", " + std::to_string(begin + count) +
                               ") is outside the " +
                               std::to_string(num_params) + " parameters");
      }
      const std::string at = "." + std::to_string(begin);
      for (auto [name, target] : {std::pair{"params", &state.params},
                                  std::pair{"adam_m", &state.adam_m},
                                  std::pair{"adam_v", &state.adam_v}}) {
        auto blob = restored.blobs.find(name + at);
        if (blob == restored.blobs.end() ||
            blob->second.data.size() !=
                static_cast<size_t>(count) * sizeof(float)) {
          return InvalidArgument(where + ": blob '" + name + at +
                                 "' is missing or not " +
                                 std::to_string(count) + " f32 values");
        }
        std::memcpy(target->data() + begin, blob->second.data.data(),
                    blob->second.data.size());
      }
      covered[begin] = std::max(covered[begin], begin + count);
    }
  }
  int64_t reached = 0;
  for (auto [begin, end] : covered) {
    if (begin > reached) break;
    reached = std::max(reached, end);
  }
  if (reached < num_params) {
    return InvalidArgument("checkpoint step " + std::to_string(step) +
                           ": parameters [" + std::to_string(reached) +
                           ", ...) are in no host's shards");
  }
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
