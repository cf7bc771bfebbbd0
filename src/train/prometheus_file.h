// The trainer's Prometheus file (config key prometheus_metrics_file): the
// last step's figures in the text exposition format 0.0.4, rewritten by
// process 0 after every step for the node exporter's textfile collector
// (--collector.textfile.directory), which reads every *.prom file of its
// directory at each scrape. The file is replaced by a rename from
// `<path>.tmp.<pid>` in the same directory, so a scrape never sees half a
// file and the collector never reads the temporary one (it does not end in
// .prom). Samples carry no timestamps: the collector refuses them.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"

namespace multislice::train {

enum class PrometheusType { kGauge, kCounter };

// One metric family with one sample.
struct PrometheusMetric {
  std::string name;  // [a-zA-Z_:][a-zA-Z0-9_:]*
  std::string help;  // one line of text
  PrometheusType type = PrometheusType::kGauge;
  double value = 0;
};

using PrometheusLabels = std::vector<std::pair<std::string, std::string>>;

// "# HELP name help\n# TYPE name gauge\nname{k="v",...} value\n" for each
// metric in order. Help text escapes '\' and newlines, label values '\',
// '"' and newlines; values are the shortest decimal that reads back to the
// same double, NaN as "NaN" and infinities as "+Inf"/"-Inf".
std::string FormatPrometheusText(const std::vector<PrometheusMetric>& metrics,
                                 const PrometheusLabels& labels);

// One step's figures, as the Reporter has them.
struct TrainingSample {
  int64_t step = 0;
  double loss = 0, learning_rate = 0, grad_norm = 0;
  double step_seconds = 0, tokens_per_second = 0;
  double mfu = 0;      // 0: no peak measured, the metric is left out
  double goodput = 0;  // the run's so far, 0 to 1
  uint64_t step_dcn_bytes = 0;
  uint64_t dcn_bytes_total = 0;  // since this process started
};

// The multislice_train_* metrics of `sample`, labelled run="<run>".
std::string FormatTrainingMetrics(const std::string& run,
                                  const TrainingSample& sample);

// Replaces `path` with `text` atomically (above), without fsync: the file
// is rewritten at every step and only its readers' view matters. Errors
// name the file and strerror(errno).
Status WritePrometheusFile(const std::string& path, const std::string& text);

}  // namespace multislice::train
