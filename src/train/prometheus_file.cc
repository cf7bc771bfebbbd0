#include "train/prometheus_file.h"

#include <charconv>
#include <cmath>

#include "train/metrics.h"

namespace multislice::train {
namespace {

// The exposition format's escapes: help text escapes '\' and newlines,
// label values also '"'.
std::string Escape(const std::string& text, bool quotes) {
  std::string out;
  for (char c : text) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '"' && quotes) {
      out += "\\\"";
    } else {
      out += c;
    }
  }
  return out;
}

std::string FormatValue(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  char text[32];
  const auto result = std::to_chars(text, text + sizeof text, v);
  return std::string(text, result.ptr);
}

std::string FormatLabels(const PrometheusLabels& labels) {
  if (labels.empty()) return "";
  std::string out = "{";
  for (size_t i = 0; i < labels.size(); ++i) {
    out += (i ? "," : "") + labels[i].first + "=\"" +
           Escape(labels[i].second, true) + "\"";
  }
  return out + "}";
}

}  // namespace

std::string FormatPrometheusText(const std::vector<PrometheusMetric>& metrics,
                                 const PrometheusLabels& labels) {
  const std::string label_text = FormatLabels(labels);
  std::string out;
  for (const PrometheusMetric& m : metrics) {
    out += "# HELP " + m.name + " " + Escape(m.help, false) + "\n";
    out += "# TYPE " + m.name + " " +
           (m.type == PrometheusType::kCounter ? "counter" : "gauge") + "\n";
    out += m.name + label_text + " " + FormatValue(m.value) + "\n";
  }
  return out;
}

std::string FormatTrainingMetrics(const std::string& run,
                                  const TrainingSample& s) {
  using T = PrometheusType;
  std::vector<PrometheusMetric> metrics = {
      {"multislice_train_step", "The last step trained.", T::kGauge,
       static_cast<double>(s.step)},
      {"multislice_train_loss", "Training loss of the last step.", T::kGauge,
       s.loss},
      {"multislice_train_learning_rate", "Learning rate of the last step.",
       T::kGauge, s.learning_rate},
      {"multislice_train_grad_norm",
       "Global gradient norm of the last step, before clipping.", T::kGauge,
       s.grad_norm},
      {"multislice_train_step_seconds", "Wall seconds of the last step.",
       T::kGauge, s.step_seconds},
      {"multislice_train_tokens_per_second",
       "Tokens trained per second in the last step.", T::kGauge,
       s.tokens_per_second},
  };
  if (s.mfu > 0) {
    metrics.push_back({"multislice_train_mfu_ratio",
                       "Model FLOPs utilisation of the last step against the "
                       "measured matmul peak, 0 to 1.",
                       T::kGauge, s.mfu});
  }
  metrics.push_back({"multislice_train_goodput_ratio",
                     "Productive seconds over wall seconds since the run's "
                     "first start, 0 to 1.",
                     T::kGauge, s.goodput});
  metrics.push_back({"multislice_train_step_dcn_bytes",
                     "Bytes process 0 sent over DCN in the last step.",
                     T::kGauge, static_cast<double>(s.step_dcn_bytes)});
  metrics.push_back({"multislice_train_dcn_bytes_total",
                     "Bytes process 0 sent over DCN in its steps since it "
                     "started.",
                     T::kCounter, static_cast<double>(s.dcn_bytes_total)});
  return FormatPrometheusText(metrics, {{"run", run}});
}

Status WritePrometheusFile(const std::string& path, const std::string& text) {
  return WriteFileAtomically(path, text, FileSync::kRenameOnly)
      .WithContext("cannot write the Prometheus file");
}

}  // namespace multislice::train
