// The controller's Prometheus metrics (docs/control.md, "Metrics"): the
// text exposition format 0.0.4, the counters and histograms that the HTTP
// threads update, the bounded labels of an answered request, and the
// gauges of the controller's state, read at each scrape.
//
// Every byte a client or an agent chose is hostile here: a label value is
// made valid UTF-8 (Prometheus drops a whole scrape over one bad byte) and
// escaped; a request is labelled with the route that answered it (its path
// with every matched group replaced by '*'), never with its raw path; and a
// family holds at most kMaxSeriesPerFamily series, the rest sharing one
// whose labels are all "other".
//
// Thread-safety: CounterFamily, HistogramFamily and RequestMetrics lock
// around each update and each Write(), so any thread may update them while
// a scrape writes them; an ExpositionWriter belongs to one scrape.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "control/http.h"

namespace multislice::control {

class ControlState;  // control_state.h

using LabelValues = std::vector<std::string>;

// The most series one family holds; beyond, observations go to the series
// whose every label value is "other".
inline constexpr size_t kMaxSeriesPerFamily = 256;

// The content type of a scrape's answer.
inline constexpr char kExpositionContentType[] =
    "text/plain; version=0.0.4; charset=utf-8";

// `value` as a label value between the quotes: bytes that are not UTF-8
// become U+FFFD, then backslash, double quote and newline are escaped.
std::string EscapeLabelValue(std::string_view value);
// A sample's value: integers without a fraction, "+Inf", "-Inf", "NaN",
// other numbers with the digits that read back to the same double.
std::string FormatSampleValue(double value);

// One scrape's text: each family's # HELP and # TYPE, then its samples.
class ExpositionWriter {
 public:
  // `type`: "counter", "gauge" or "histogram".
  void Family(std::string_view name, std::string_view type,
              std::string_view help);
  // name{label_names[i]="label_values[i]",...} value (the two the same
  // length).
  void Sample(std::string_view name, const std::vector<std::string>& names,
              const LabelValues& values, double value);
  const std::string& text() const { return text_; }

 private:
  std::string text_;
};

// A counter with labels: a total per combination of label values.
class CounterFamily {
 public:
  CounterFamily(std::string name, std::string help,
                std::vector<std::string> label_names)
      : name_(std::move(name)),
        help_(std::move(help)),
        label_names_(std::move(label_names)) {}

  // Adds `delta` (>= 0) to the series of `labels` (one per label name).
  void Add(const LabelValues& labels, double delta = 1);
  void Write(ExpositionWriter& out) const;

 private:
  const std::string name_, help_;
  const std::vector<std::string> label_names_;
  mutable std::mutex mu_;
  std::map<LabelValues, double> series_;  // guarded by mu_
};

// A histogram with labels: per series, the count of observations at most
// each upper bound (cumulative, as written: _bucket{le="..."}), their
// _count and _sum.
class HistogramFamily {
 public:
  // `upper_bounds`: finite and increasing; "+Inf" is added.
  HistogramFamily(std::string name, std::string help,
                  std::vector<std::string> label_names,
                  std::vector<double> upper_bounds);

  void Observe(const LabelValues& labels, double value);
  void Write(ExpositionWriter& out) const;

 private:
  struct Series {
    std::vector<uint64_t> buckets;  // per bound, not cumulative; last +Inf
    double sum = 0;
    uint64_t count = 0;
  };
  const std::string name_, help_;
  const std::vector<std::string> label_names_;
  const std::vector<double> upper_bounds_;
  mutable std::mutex mu_;
  std::map<LabelValues, Series> series_;  // guarded by mu_
};

// The labels of an answered request, each from a small fixed set. The
// route that answered: the path with every group its pattern matched
// replaced by '*' (e.g. "/*/projects/*/locations/*/queuedResources"), or
// "other" when no route matched (a 404, a body too large).
std::string RouteLabel(const httplib::Request& req);
// GET, HEAD, POST, PUT, DELETE, PATCH or OPTIONS; "other" for any other.
std::string MethodLabel(std::string_view method);
// "2xx" for 200 to 299, and so on; "other" outside 100 to 599.
std::string StatusClassLabel(int status);

// Upper bounds of the request latency histogram, in seconds.
inline constexpr double kRequestLatencyBoundsSeconds[] = {
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
    0.1,    0.25,  0.5,    1,     2.5,  5,     10};

// The API's requests: multislice_http_request_duration_seconds (a
// histogram by listener, route, method and status class) and
// multislice_http_unrouted_requests_total (those answered before routing,
// whose latency is not known: a malformed request line or headers, a URI
// too long).
class RequestMetrics {
 public:
  RequestMetrics();

  // Times every request `server` answers (from routing until its answer
  // is written) as `listener` ("api", "agent", "metrics"): sets the
  // server's pre-routing handler and logger, which must be unset. Before
  // the server listens.
  void Instrument(httplib::Server& server, const std::string& listener);
  // One answered request, as Instrument's logger records it.
  void Record(const std::string& listener, const httplib::Request& req,
              int status, double seconds);
  void Write(ExpositionWriter& out) const;

 private:
  HistogramFamily duration_;
  CounterFamily unrouted_;
};

// What /metrics answers: the state's gauges and counters (queued resources
// by state and tier, hosts by state, heartbeat ages, repairs, lost hosts)
// and the requests.
class ControllerMetrics {
 public:
  explicit ControllerMetrics(ControlState& state) : state_(state) {}

  RequestMetrics& requests() { return requests_; }
  // The exposition. Holds state.mu only to copy the numbers.
  std::string Text();
  // GET /metrics on `server`, behind the bearer check of `token` (none
  // when empty: the separate metrics listener).
  void Mount(httplib::Server& server, const std::string& token);

 private:
  ControlState& state_;
  RequestMetrics requests_;
};

}  // namespace multislice::control
