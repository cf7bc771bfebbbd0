#include "train/diloco.h"

#include <algorithm>
#include <string>

namespace multislice::train {
namespace {

std::string RangeText(int64_t begin, int64_t end) {
  return "[" + std::to_string(begin) + ", " + std::to_string(end) + ")";
}

// The rules of diloco.h's header for `options` on a shard of `count`
// values, with the config keys the options come from.
Status ValidateOptions(const OuterOptimizerOptions& options,
                       const FragmentRanges& fragments, int64_t count) {
  const int h = options.sync_period;
  const int f = static_cast<int>(fragments.size());
  if (h < 1) {
    return InvalidArgument("diloco_sync_period " + std::to_string(h) +
                           ": expected at least 1");
  }
  if (h % f != 0) {
    return InvalidArgument(
        "diloco_sync_period " + std::to_string(h) +
        " must be divisible by num_diloco_fragments (" + std::to_string(f) +
        "): each fragment syncs once per period, every period / fragments "
        "steps");
  }
  const int g = h / f;
  if (options.overlap_steps < 0 || options.overlap_steps >= g) {
    return InvalidArgument(
        "num_communication_overlapping_steps " +
        std::to_string(options.overlap_steps) + ": expected 0 to " +
        std::to_string(g - 1) +
        " (below diloco_sync_period / num_diloco_fragments, so that a "
        "fragment lands before the next one starts)");
  }
  if (!(options.alpha >= 0.0 && options.alpha <= 1.0)) {
    return InvalidArgument("communication_overlapping_alpha " +
                           std::to_string(options.alpha) + ": expected 0 to 1");
  }
  std::vector<uint8_t> covered(static_cast<size_t>(count), 0);
  for (int i = 0; i < f; ++i) {
    for (const auto& [begin, end] : fragments[i]) {
      if (begin < 0 || end > count || begin > end) {
        return InvalidArgument("DiLoCo fragment " + std::to_string(i) +
                               ": range " + RangeText(begin, end) +
                               " is not inside the shard " +
                               RangeText(0, count));
      }
      for (int64_t p = begin; p < end; ++p) {
        if (covered[p]++ != 0) {
          return InvalidArgument("DiLoCo fragments: shard position " +
                                 std::to_string(p) +
                                 " is in more than one fragment");
        }
      }
    }
  }
  const auto missing = std::find(covered.begin(), covered.end(), 0);
  if (missing != covered.end()) {
    return InvalidArgument("DiLoCo fragments: shard position " +
                           std::to_string(missing - covered.begin()) +
                           " is in no fragment");
  }
  return OkStatus();
}

int64_t FragmentSize(const std::vector<std::pair<int64_t, int64_t>>& ranges) {
  int64_t n = 0;
  for (const auto& [begin, end] : ranges) n += end - begin;
  return n;
}

}  // namespace

OuterOptimizer::OuterOptimizer(const OuterOptimizerOptions& options,
                               const float* params, int64_t count)
    : options_(options),
      fragments_(options.fragments.empty()
                     ? FragmentRanges{{{int64_t{0}, count}}}
                     : options.fragments),
      outer_(params, params + count),
      momentum_(static_cast<size_t>(count), 0.0f) {
  invalid_ = ValidateOptions(options_, fragments_, count);
  if (!invalid_.ok()) return;
  fragment_step_ =
      options_.sync_period / static_cast<int64_t>(fragments_.size());
  if (options_.overlap_steps > 0) pending_.assign(outer_.size(), 0.0f);
  int64_t largest = 0;
  for (const auto& ranges : fragments_) {
    largest = std::max(largest, FragmentSize(ranges));
  }
  wire_.assign(static_cast<size_t>(largest), 0.0f);
  if (options_.resendable) sent_.assign(wire_.size(), 0.0f);
}

OuterOptimizer::~OuterOptimizer() { (void)handle_.Wait(); }

int OuterOptimizer::FragmentStartingAt(int64_t step) const {
  // t % H == ((f + 1) g) % H with g = H / F: t a multiple q g of g, and
  // f + 1 == q modulo F.
  if (step < 1 || step % fragment_step_ != 0) return -1;
  const auto f = static_cast<int64_t>(fragments_.size());
  return static_cast<int>((step / fragment_step_ - 1) % f);
}

Status OuterOptimizer::AfterInnerStep(runtime::DeviceCollectives& coll,
                                      int64_t step, float* inner) {
  RETURN_IF_ERROR(invalid_);
  if (in_flight_.has_value()) {
    if (in_flight_->land_step < step) {
      return FailedPrecondition(
          "DiLoCo: the sync of fragment " +
          std::to_string(in_flight_->fragment) + " was due to land at step " +
          std::to_string(in_flight_->land_step) + ", but the next step is " +
          std::to_string(step));
    }
    if (in_flight_->land_step == step) RETURN_IF_ERROR(Land(coll, inner));
  }
  const int fragment = FragmentStartingAt(step);
  if (fragment < 0 || last_start_ == step) return OkStatus();
  if (in_flight_.has_value()) {
    return FailedPrecondition("DiLoCo: fragment " + std::to_string(fragment) +
                              " is due to start at step " +
                              std::to_string(step) + " while fragment " +
                              std::to_string(in_flight_->fragment) +
                              " is still in flight");
  }
  RETURN_IF_ERROR(Start(coll, fragment, inner));
  last_start_ = step;
  in_flight_ = InFlight{fragment, step + options_.overlap_steps, false};
  if (options_.overlap_steps == 0) return Land(coll, inner);
  return OkStatus();
}

Status OuterOptimizer::Start(runtime::DeviceCollectives& coll, int fragment,
                             const float* inner) {
  size_t n = 0;
  for (const auto& [begin, end] : fragments_[fragment]) {
    for (int64_t i = begin; i < end; ++i) wire_[n++] = outer_[i] - inner[i];
  }
  synced_values_ += static_cast<int64_t>(n);
  synced_wire_bytes_ += static_cast<int64_t>(WireBytes(options_.wire, n));
  if (options_.resendable) {
    std::copy(wire_.begin(), wire_.begin() + n, sent_.begin());
    sent_count_ = n;
  }
  // No values here means none at this shard position on any replica: the
  // whole group skips this all-reduce.
  if (n == 0) {
    handle_ = {};
    return OkStatus();
  }
  Launch(coll, n, fragment);
  return OkStatus();
}

void OuterOptimizer::Launch(runtime::DeviceCollectives& coll, size_t n,
                            int fragment) {
  const std::string label = "diloco/fragment" + std::to_string(fragment);
  if (options_.wire == runtime::WireType::kF32) {
    handle_ =
        coll.AllReduce(options_.replica_axes, wire_.data(), wire_.data(), n,
                       runtime::DType::kF32, runtime::ReduceOp::kSum, label);
  } else {
    handle_ = coll.CompressedAllReduce(options_.replica_axes, wire_.data(),
                                       wire_.data(), n, options_.wire, label);
  }
}

Status OuterOptimizer::Resend(runtime::DeviceCollectives& coll) {
  if (!in_flight_.has_value() || in_flight_->reduced) return OkStatus();
  if (!options_.resendable) {
    return FailedPrecondition(
        "DiLoCo: the pseudo-gradient in flight was not kept for a resend");
  }
  (void)handle_.Wait();  // the failed one: nothing may still write wire_
  handle_ = {};
  if (sent_count_ == 0) return OkStatus();
  std::copy(sent_.begin(), sent_.begin() + sent_count_, wire_.begin());
  Launch(coll, sent_count_, in_flight_->fragment);
  return OkStatus();
}

Status OuterOptimizer::Settle() {
  RETURN_IF_ERROR(invalid_);
  if (!in_flight_.has_value() || in_flight_->reduced) return OkStatus();
  RETURN_IF_ERROR(handle_.Wait());
  handle_ = {};
  in_flight_->reduced = true;
  if (pending_.empty()) return OkStatus();
  size_t k = 0;
  for (const auto& [begin, end] : fragments_[in_flight_->fragment]) {
    std::copy(wire_.begin() + k, wire_.begin() + k + (end - begin),
              pending_.begin() + begin);
    k += end - begin;
  }
  return OkStatus();
}

Status OuterOptimizer::Land(runtime::DeviceCollectives& coll, float* inner) {
  if (!in_flight_->reduced) {
    RETURN_IF_ERROR(handle_.Wait());
    handle_ = {};
  }
  const std::vector<std::pair<int64_t, int64_t>>& ranges =
      fragments_[in_flight_->fragment];
  if (!ranges.empty()) {
    ASSIGN_OR_RETURN(const runtime::AxisGroup* group,
                     coll.Group(options_.replica_axes));
    const float inv = 1.0f / static_cast<float>(group->size);
    const auto lr = static_cast<float>(options_.learning_rate);
    const auto mu = static_cast<float>(options_.momentum);
    const auto keep = static_cast<float>(options_.alpha);
    const auto take = static_cast<float>(1.0 - options_.alpha);
    size_t k = 0;
    for (const auto& [begin, end] : ranges) {
      for (int64_t i = begin; i < end; ++i) {
        const float delta = wire_[k++] * inv;
        momentum_[i] = mu * momentum_[i] + delta;
        outer_[i] -= lr * (delta + mu * momentum_[i]);
        // alpha = 0 copies, so that the replicas hold the same bits even
        // where inner is not finite.
        inner[i] = options_.alpha == 0.0 ? outer_[i]
                                         : keep * inner[i] + take * outer_[i];
      }
      if (!pending_.empty()) {
        std::fill(pending_.begin() + begin, pending_.begin() + end, 0.0f);
      }
    }
  }
  in_flight_.reset();
  return OkStatus();
}

void OuterOptimizer::Resume(int64_t step) {
  in_flight_.reset();
  handle_ = {};
  if (!invalid_.ok() || options_.overlap_steps == 0 || step < 1) return;
  // Only the last start can still be in flight (tau < g).
  const int64_t start = step / fragment_step_ * fragment_step_;
  if (start < 1 || start + options_.overlap_steps <= step) return;
  const int fragment = FragmentStartingAt(start);
  size_t k = 0;
  for (const auto& [begin, end] : fragments_[fragment]) {
    for (int64_t i = begin; i < end; ++i) wire_[k++] = pending_[i];
  }
  in_flight_ = InFlight{fragment, start + options_.overlap_steps, true};
}

Result<FragmentRanges> LayerFragments(const model::DecoderConfig& model,
                                      int tensor_size,
                                      model::PipelineStage stage,
                                      int fragments) {
  const int layers = model.num_layers;
  if (fragments < 1 || fragments > layers) {
    return InvalidArgument("num_diloco_fragments " + std::to_string(fragments) +
                           ": expected 1 to num_layers (" +
                           std::to_string(layers) +
                           "), each fragment holding whole layers");
  }
  FragmentRanges out(static_cast<size_t>(fragments));
  for (const model::ParamTensor& t :
       model::ParameterLayout(model, tensor_size, stage)) {
    int f = 0;  // wte (either stage's copy) and wpe
    if (t.name.rfind("lnf.", 0) == 0 || t.name == "lm_head") {
      f = fragments - 1;
    } else if (t.name[0] == 'h') {
      const int layer = std::stoi(t.name.substr(1));
      // The last f with f L / F <= layer: fragment f's layers.
      while (f + 1 < fragments &&
             static_cast<int64_t>(f + 1) * layers / fragments <= layer) {
        ++f;
      }
    }
    auto& ranges = out[static_cast<size_t>(f)];
    if (!ranges.empty() && ranges.back().second == t.offset) {
      ranges.back().second = t.offset + t.size;
    } else {
      ranges.push_back({t.offset, t.offset + t.size});
    }
  }
  return out;
}

FragmentRanges ShardFragments(const FragmentRanges& fragments, int64_t begin,
                              int64_t count) {
  FragmentRanges out(fragments.size());
  const int64_t end = begin + count;
  for (size_t f = 0; f < fragments.size(); ++f) {
    for (const auto& [b, e] : fragments[f]) {
      const int64_t lo = std::max(b, begin), hi = std::min(e, end);
      if (lo < hi) out[f].push_back({lo - begin, hi - begin});
    }
  }
  return out;
}

}  // namespace multislice::train
