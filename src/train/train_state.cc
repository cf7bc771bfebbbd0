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

// The fields beyond GPT-2's shape, all required once decoder_block is.
Status ModelBlockFromJson(const nlohmann::json& json, const std::string& where,
                          model::DecoderConfig& c) {
  auto missing = [&](const char* field, const char* type) {
    return InvalidArgument(where + ": metadata field '" + field +
                           "' is missing or not " + type);
  };
  const auto block = json.find("decoder_block");
  if (!block->is_string()) return missing("decoder_block", "a string");
  ASSIGN_OR_RETURN(c.block, model::ParseBlockKind(block->get<std::string>()));
  ASSIGN_OR_RETURN(int64_t v, GetInt(json, "num_kv_heads", where));
  c.num_kv_heads = static_cast<int>(std::clamp<int64_t>(v, 0, 1 << 30));
  ASSIGN_OR_RETURN(v, GetInt(json, "head_dim", where));
  c.head_dim = static_cast<int>(std::clamp<int64_t>(v, 0, 1 << 30));
  const auto act = json.find("mlp_activation");
  if (act == json.end() || !act->is_string() ||
      (*act != "gelu" && *act != "silu")) {
    return missing("mlp_activation", "\"gelu\" or \"silu\"");
  }
  c.mlp_activation =
      *act == "silu" ? model::Activation::kSilu : model::Activation::kGelu;
  for (auto [field, member] :
       {std::pair{"gated_mlp", &model::DecoderConfig::gated_mlp},
        std::pair{"tied_embedding", &model::DecoderConfig::tied_embedding},
        std::pair{"normalize_embedding_logits",
                  &model::DecoderConfig::normalize_embedding_logits}}) {
    const auto it = json.find(field);
    if (it == json.end() || !it->is_boolean()) return missing(field, "a bool");
    c.*member = it->get<bool>();
  }
  for (auto [field, member] :
       {std::pair{"rope_max_timescale",
                  &model::DecoderConfig::rope_max_timescale},
        std::pair{"norm_epsilon", &model::DecoderConfig::norm_epsilon}}) {
    const auto it = json.find(field);
    if (it == json.end() || !it->is_number()) {
      return missing(field, "a number");
    }
    c.*member = it->get<double>();
  }
  return OkStatus();
}

}  // namespace

std::string ShardBlobName(const std::string& kind, int64_t begin,
                          int tensor_rank, int tensor_size, int stage,
                          int stages, int replica, int replicas) {
  std::string name = kind;
  if (replicas > 1) name += ".r" + std::to_string(replica);
  if (stages > 1) name += ".s" + std::to_string(stage);
  if (tensor_size > 1) name += ".t" + std::to_string(tensor_rank);
  return name + "." + std::to_string(begin);
}

std::vector<Blob> ShardBlobs(const std::vector<StateShard>& shards) {
  std::vector<Blob> blobs;
  for (const StateShard& s : shards) {
    auto add = [&](const char* kind, const float* data) {
      blobs.push_back(
          FloatBlob(ShardBlobName(kind, s.begin, s.tensor_rank, s.tensor_size,
                                  s.stage, s.stages, s.replica, s.replicas),
                    data, s.count));
    };
    add("params", s.params);
    add("adam_m", s.adam_m);
    add("adam_v", s.adam_v);
    if (s.outer) {
      add("outer", s.outer);
      add("outer_momentum", s.outer_momentum);
    }
    if (s.outer_pending) add("outer_pending", s.outer_pending);
  }
  return blobs;
}

nlohmann::json StateMetadata(int64_t step, const model::DecoderConfig& model,
                             const std::vector<std::string>& axis_names,
                             const std::vector<int>& mesh_shape, int num_slices,
                             const std::vector<StateShard>& shards,
                             const IteratorState& iterator,
                             int tensor_parallelism, int pipeline_parallelism,
                             int diloco_replicas, bool diloco_pending,
                             const std::vector<int>& diloco_schedule) {
  nlohmann::json shard_list = nlohmann::json::array();
  for (const StateShard& s : shards) {
    nlohmann::json entry = {{"begin", s.begin}, {"count", s.count}};
    if (tensor_parallelism > 1) entry["tensor_rank"] = s.tensor_rank;
    if (pipeline_parallelism > 1) entry["stage"] = s.stage;
    if (diloco_replicas > 1) entry["replica"] = s.replica;
    shard_list.push_back(std::move(entry));
  }
  nlohmann::json meta = {{"format_version", kTrainStateFormatVersion},
                         {"step", step},
                         {"num_params", model::NumParameters(model)},
                         {"model", ModelToJson(model)},
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
  if (diloco_replicas > 0) {
    meta["diloco"] = {{"replicas", diloco_replicas},
                      {"pending", diloco_pending}};
    if (diloco_pending && !diloco_schedule.empty()) {
      meta["diloco"]["schedule"] = diloco_schedule;
    }
  }
  return meta;
}

nlohmann::json ModelToJson(const model::DecoderConfig& m) {
  return {{"decoder_block", model::BlockName(m.block)},
          {"vocab_size", m.vocab_size},
          {"max_seq_len", m.max_seq_len},
          {"emb_dim", m.emb_dim},
          {"num_heads", m.num_heads},
          {"num_kv_heads", m.num_kv_heads},
          {"head_dim", m.head_dim},
          {"num_layers", m.num_layers},
          {"mlp_dim", m.mlp_dim},
          {"mlp_activation",
           m.mlp_activation == model::Activation::kSilu ? "silu" : "gelu"},
          {"gated_mlp", m.gated_mlp},
          {"tied_embedding", m.tied_embedding},
          {"normalize_embedding_logits", m.normalize_embedding_logits},
          {"rope_max_timescale", m.rope_max_timescale},
          {"norm_epsilon", m.norm_epsilon}};
}

Result<model::DecoderConfig> ModelFromJson(const nlohmann::json& json) {
  const std::string where = "checkpoint model";
  if (!json.is_object()) {
    return InvalidArgument("checkpoint metadata: 'model' is not an object");
  }
  int64_t shape[6];
  const char* const kShape[] = {"vocab_size", "max_seq_len", "emb_dim",
                                "num_heads",  "num_layers",  "mlp_dim"};
  for (int i = 0; i < 6; ++i) {
    ASSIGN_OR_RETURN(shape[i], GetInt(json, kShape[i], where));
    if (shape[i] < 1 || shape[i] > (int64_t{1} << 30)) {
      return InvalidArgument(where + ": metadata field '" + kShape[i] +
                             "' is " + std::to_string(shape[i]) +
                             "; expected 1..2^30");
    }
  }
  auto as_int = [](int64_t v) { return static_cast<int>(v); };
  // A checkpoint without decoder_block is GPT-2's, written before the
  // decoder had other blocks.
  model::DecoderConfig c =
      model::GptShape(as_int(shape[0]), as_int(shape[1]), as_int(shape[2]),
                      as_int(shape[3]), as_int(shape[4]), as_int(shape[5]));
  if (!json.contains("decoder_block")) {
    RETURN_IF_ERROR(model::ValidateConfig(c));
    return c;
  }
  RETURN_IF_ERROR(ModelBlockFromJson(json, where, c));
  RETURN_IF_ERROR(model::ValidateConfig(c));
  return c;
}

namespace {

// How the checkpoint's flat buffers split the model: part stage * t + rank.
struct Parts {
  int tensor = 1, stages = 1;
  int count() const { return tensor * stages; }
};

// One part's buffer of one kind while a checkpoint is reassembled, and the
// ranges its shards covered.
struct PartBuffer {
  std::vector<float> values;
  std::map<int64_t, int64_t> covered;  // begin -> end
};

// One kind's buffers of every part ("params" of replica 1, "outer", ...).
struct KindParts {
  const char* kind = "";
  std::vector<PartBuffer> parts;
};

// The kinds of an inner state and of the outer state.
constexpr const char* kInnerKinds[] = {"params", "adam_m", "adam_v"};
constexpr const char* kOuterKinds[] = {"outer", "outer_momentum",
                                       "outer_pending"};

// The checkpoint's "diloco" object: replicas 0 when it has none.
struct Diloco {
  int replicas = 0;
  bool pending = false;
  std::vector<int> schedule;  // empty when not recorded
  bool operator==(const Diloco&) const = default;
  std::string ToString() const {
    if (replicas == 0) return "none";
    std::string text = "{replicas " + std::to_string(replicas) + ", pending " +
                       (pending ? "true" : "false");
    if (!schedule.empty()) {
      text += ", schedule " + std::to_string(schedule[0]) + "/" +
              std::to_string(schedule[1]) + "/" + std::to_string(schedule[2]);
    }
    return text + "}";
  }
};

inline constexpr int kMaxDilocoReplicas = 4096;

Result<Diloco> DilocoOf(const nlohmann::json& meta, const std::string& where) {
  Diloco d;
  auto it = meta.find("diloco");
  if (it == meta.end()) return d;
  if (!it->is_object()) {
    return InvalidArgument(where + ": metadata field 'diloco' is " +
                           it->dump() + "; expected an object");
  }
  auto replicas = it->find("replicas");
  if (replicas == it->end() || !replicas->is_number_integer() ||
      replicas->get<int64_t>() < 1 ||
      replicas->get<int64_t>() > kMaxDilocoReplicas) {
    return InvalidArgument(
        where + ": metadata field 'diloco.replicas' is " +
        (replicas == it->end() ? std::string("missing") : replicas->dump()) +
        "; expected an integer in [1, " + std::to_string(kMaxDilocoReplicas) +
        "]");
  }
  auto pending = it->find("pending");
  if (pending == it->end() || !pending->is_boolean()) {
    return InvalidArgument(
        where + ": metadata field 'diloco.pending' is " +
        (pending == it->end() ? std::string("missing") : pending->dump()) +
        "; expected true or false");
  }
  d.replicas = replicas->get<int>();
  d.pending = pending->get<bool>();
  if (auto schedule = it->find("schedule"); schedule != it->end()) {
    bool valid = schedule->is_array() && schedule->size() == 3;
    for (size_t i = 0; valid && i < 3; ++i) {
      valid = (*schedule)[i].is_number_integer() &&
              (*schedule)[i].get<int64_t>() >= 0 &&
              (*schedule)[i].get<int64_t>() <= 1000000;
      if (valid) d.schedule.push_back((*schedule)[i].get<int>());
    }
    if (!valid) {
      return InvalidArgument(
          where + ": metadata field 'diloco.schedule' is " + schedule->dump() +
          "; expected [sync period, fragments, overlap steps]: three "
          "integers in [0, 1000000]");
    }
  }
  return d;
}

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

// What the reassembly fills: every replica's inner kinds, then the outer
// kinds (outer_pending only when saved).
struct Reassembly {
  Parts parts;
  Diloco diloco;
  std::vector<std::vector<KindParts>> inner;  // [replica][kind]
  std::vector<KindParts> outer;               // empty without DiLoCo
};

// Copies blob `name` (count values) into part buffer `target` at `begin`
// and marks the range covered. False when the blob is absent.
Result<bool> CopyBlob(const RestoredState& restored, const std::string& where,
                      const std::string& name, int64_t begin, int64_t count,
                      PartBuffer& target) {
  auto blob = restored.blobs.find(name);
  if (blob == restored.blobs.end()) return false;
  if (blob->second.data.size() != static_cast<size_t>(count) * sizeof(float)) {
    return InvalidArgument(where + ": blob '" + name + "' is not " +
                           std::to_string(count) + " f32 values");
  }
  std::memcpy(target.values.data() + begin, blob->second.data.data(),
              blob->second.data.size());
  target.covered[begin] = std::max(target.covered[begin], begin + count);
  return true;
}

// Reads one host's shards into the buffers.
Status ReadShards(const RestoredState& restored, const std::string& where,
                  Reassembly& state) {
  const nlohmann::json& meta = restored.metadata;
  auto shards = meta.find("shards");
  if (shards == meta.end() || !shards->is_array()) {
    return InvalidArgument(where + ": metadata has no 'shards' list");
  }
  const Parts& parts = state.parts;
  const int replicas = std::max(state.diloco.replicas, 1);
  for (const nlohmann::json& s : *shards) {
    ASSIGN_OR_RETURN(int64_t begin, GetInt(s, "begin", where));
    ASSIGN_OR_RETURN(int64_t count, GetInt(s, "count", where));
    ASSIGN_OR_RETURN(int64_t rank,
                     GetIndex(s, "tensor_rank", parts.tensor, where));
    ASSIGN_OR_RETURN(int64_t stage, GetIndex(s, "stage", parts.stages, where));
    ASSIGN_OR_RETURN(int64_t replica, GetIndex(s, "replica", replicas, where));
    if (replicas == 1 && s.contains("replica")) {
      return InvalidArgument(
          where + ": a shard has replica " + s["replica"].dump() +
          ", but the metadata's diloco is " + state.diloco.ToString());
    }
    const auto part = static_cast<size_t>(stage * parts.tensor + rank);
    std::vector<KindParts>& inner = state.inner[static_cast<size_t>(replica)];
    const auto n = static_cast<int64_t>(inner[0].parts[part].values.size());
    if (begin < 0 || count < 0 || begin > n - count) {
      return InvalidArgument(where + ": shard [" + std::to_string(begin) +
                             ", " + std::to_string(begin + count) +
                             ") is outside the " + std::to_string(n) +
                             " parameters");
    }
    auto name = [&](const char* kind) {
      return ShardBlobName(kind, begin, static_cast<int>(rank), parts.tensor,
                           static_cast<int>(stage), parts.stages,
                           static_cast<int>(replica), replicas);
    };
    for (KindParts& k : inner) {
      ASSIGN_OR_RETURN(bool found, CopyBlob(restored, where, name(k.kind),
                                            begin, count, k.parts[part]));
      if (!found) {
        return InvalidArgument(where + ": blob '" + name(k.kind) +
                               "' is missing or not " + std::to_string(count) +
                               " f32 values");
      }
    }
    // The outer state is replica 0's; a shard without it covers none.
    if (replica != 0) continue;
    for (KindParts& k : state.outer) {
      RETURN_IF_ERROR(
          CopyBlob(restored, where, name(k.kind), begin, count, k.parts[part])
              .status());
    }
  }
  return OkStatus();
}

// The first element no shard covered, or the size when all are.
int64_t CoveredUpTo(const PartBuffer& b) {
  int64_t reached = 0;
  for (auto [begin, end] : b.covered) {
    if (begin > reached) break;
    reached = std::max(reached, end);
  }
  return reached;
}

// Host 0's split of the model, checked against the model.
Result<Parts> PartsOf(const nlohmann::json& meta,
                      const model::DecoderConfig& model,
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
      !model::ValidateTensorParallelism(model, static_cast<int>(t)).ok()) {
    return InvalidArgument(where + ": tensor_parallelism " + std::to_string(t) +
                           " does not split the model");
  }
  if (p < 1 || p > 4096 ||
      !model::ValidatePipeline(model, static_cast<int>(p)).ok()) {
    return InvalidArgument(where + ": pipeline_parallelism " +
                           std::to_string(p) + " does not split the model");
  }
  parts.tensor = static_cast<int>(t);
  parts.stages = static_cast<int>(p);
  return parts;
}

// One kind's buffers of every part, zeroed, at their sizes.
KindParts AllocateParts(const model::DecoderConfig& model, const Parts& parts,
                        const char* kind) {
  KindParts k;
  k.kind = kind;
  k.parts.resize(static_cast<size_t>(parts.count()));
  for (int i = 0; i < parts.count(); ++i) {
    k.parts[static_cast<size_t>(i)].values.assign(
        static_cast<size_t>(model::NumParameters(
            model, parts.tensor, {i / parts.tensor, parts.stages})),
        0.0f);
  }
  return k;
}

// The buffers of every replica and of the outer state.
Reassembly Allocate(const model::DecoderConfig& model, const Parts& parts,
                    const Diloco& diloco) {
  Reassembly r;
  r.parts = parts;
  r.diloco = diloco;
  r.inner.resize(static_cast<size_t>(std::max(diloco.replicas, 1)));
  for (std::vector<KindParts>& replica : r.inner) {
    for (const char* kind : kInnerKinds) {
      replica.push_back(AllocateParts(model, parts, kind));
    }
  }
  if (diloco.replicas > 0) {
    for (const char* kind : kOuterKinds) {
      if (kind == kOuterKinds[2] && !diloco.pending) continue;
      r.outer.push_back(AllocateParts(model, parts, kind));
    }
  }
  return r;
}

// ok, or the sentence naming the first element of `k` no shard covered.
// "<what> [x, ...) <of> of stage s of tensor rank r are in no host's
// shards<whose>".
Status CheckCovered(int64_t step, const Parts& parts, const KindParts& k,
                    const std::string& what, const std::string& of,
                    const std::string& whose) {
  for (size_t i = 0; i < k.parts.size(); ++i) {
    const int64_t reached = CoveredUpTo(k.parts[i]);
    if (reached < static_cast<int64_t>(k.parts[i].values.size())) {
      const int r = static_cast<int>(i) % parts.tensor;
      const int stage = static_cast<int>(i) / parts.tensor;
      return InvalidArgument(
          "checkpoint step " + std::to_string(step) + ": " + what + " [" +
          std::to_string(reached) + ", ...) " + of +
          (parts.stages > 1 ? "of stage " + std::to_string(stage) + " " : "") +
          (parts.tensor > 1 ? "of tensor rank " + std::to_string(r) + " "
                            : "") +
          "are in no host's shards" + whose);
    }
  }
  return OkStatus();
}

// The whole model's buffer of one kind from its parts, which it frees.
std::vector<float> Assemble(const model::DecoderConfig& model,
                            const Parts& parts, KindParts& k) {
  if (parts.count() == 1) return std::move(k.parts[0].values);
  std::vector<float> whole(static_cast<size_t>(model::NumParameters(model)),
                           0.0f);
  for (int i = 0; i < parts.count(); ++i) {
    PartBuffer& b = k.parts[static_cast<size_t>(i)];
    model::InsertTensorShard(model, parts.tensor, i % parts.tensor,
                             b.values.data(), whole.data(),
                             {i / parts.tensor, parts.stages});
    b = PartBuffer();
  }
  return whole;
}

// Checks that every element is covered, then puts every buffer together.
Status Finish(Reassembly& r, FullState& state) {
  const int replicas = static_cast<int>(r.inner.size());
  for (int i = 0; i < replicas; ++i) {
    const std::string of =
        replicas > 1 ? "of DiLoCo replica " + std::to_string(i) + " " : "";
    // A shard has all three kinds or fails: one coverage says all.
    RETURN_IF_ERROR(CheckCovered(state.step, r.parts,
                                 r.inner[static_cast<size_t>(i)][0],
                                 "parameters", of, ""));
  }
  for (const KindParts& k : r.outer) {
    RETURN_IF_ERROR(CheckCovered(state.step, r.parts, k,
                                 "DiLoCo " + std::string(k.kind), "",
                                 " of replica 0"));
  }
  state.diloco_replicas = r.diloco.replicas;
  state.diloco_schedule = r.diloco.schedule;
  state.more_replicas.resize(static_cast<size_t>(replicas - 1));
  for (int i = 0; i < replicas; ++i) {
    std::vector<KindParts>& kinds = r.inner[static_cast<size_t>(i)];
    std::vector<float>* targets[3] = {&state.params, &state.adam_m,
                                      &state.adam_v};
    if (i > 0) {
      InnerState& more = state.more_replicas[static_cast<size_t>(i - 1)];
      targets[0] = &more.params;
      targets[1] = &more.adam_m;
      targets[2] = &more.adam_v;
    }
    for (size_t k = 0; k < kinds.size(); ++k) {
      *targets[k] = Assemble(state.model, r.parts, kinds[k]);
    }
  }
  std::vector<float>* outer_targets[3] = {&state.outer, &state.outer_momentum,
                                          &state.outer_pending};
  for (size_t k = 0; k < r.outer.size(); ++k) {
    *outer_targets[k] = Assemble(state.model, r.parts, r.outer[k]);
  }
  return OkStatus();
}

}  // namespace

Result<FullState> LoadFullState(const CheckpointManager& manager,
                                int64_t step) {
  ASSIGN_OR_RETURN(int hosts, manager.HostCount(step));
  FullState state;
  state.step = step;
  int64_t num_params = -1;
  Reassembly reassembly;
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
    ASSIGN_OR_RETURN(Diloco diloco, DilocoOf(meta, where));
    if (host == 0) {
      ASSIGN_OR_RETURN(state.model, ModelFromJson(meta.contains("model")
                                                      ? meta["model"]
                                                      : nlohmann::json()));
      num_params = n;
      if (n != model::NumParameters(state.model)) {
        return InvalidArgument(
            where + ": num_params " + std::to_string(n) +
            " does not match the model's " +
            std::to_string(model::NumParameters(state.model)));
      }
      ASSIGN_OR_RETURN(Parts parts, PartsOf(meta, state.model, where));
      reassembly = Allocate(state.model, parts, diloco);
      auto it = meta.find("iterator");
      if (it == meta.end()) {
        return InvalidArgument(where + ": metadata has no 'iterator'");
      }
      ASSIGN_OR_RETURN(state.iterator, IteratorStateFromJson(*it));
      state.saved_mesh = meta.value("mesh", nlohmann::json::object());
    } else {
      const Parts& parts = reassembly.parts;
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
      if (!(diloco == reassembly.diloco)) {
        return InvalidArgument(where + ": diloco " + diloco.ToString() +
                               " differs from host 0's " +
                               reassembly.diloco.ToString());
      }
    }
    RETURN_IF_ERROR(ReadShards(restored, where, reassembly));
  }
  RETURN_IF_ERROR(Finish(reassembly, state));
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
