// The controller's Prometheus metrics (metrics.h): the exposition writer,
// the labelled families, the request hooks and the state's numbers.
#include "control/metrics.h"

#include <charconv>
#include <chrono>
#include <cmath>
#include <optional>

#include "control/control_state.h"
#include "control/routes.h"
#include "control/validation.h"

namespace multislice::control {
namespace {

using Clock = std::chrono::steady_clock;

// The longest route label, in bytes (ours are under 80).
constexpr size_t kMaxRouteLabelBytes = 128;

// Doubles below this hold every integer exactly (2^53).
constexpr double kExactIntegers = 9007199254740992.0;

// QrState's values run from kCreating (0) to kDeleting, the last.
constexpr int kNumQrStates = static_cast<int>(QrState::kDeleting) + 1;

// The host states of /internal/v1/capacity.
constexpr const char* kHostStates[] = {"FREE", "USED", "LOST"};

// `text` with each byte that starts no well-formed UTF-8 sequence replaced
// by U+FFFD.
std::string ValidUtf8(std::string_view text) {
  std::string out;
  size_t bad = 0;
  while (!IsValidUtf8(text, &bad)) {
    out.append(text.substr(0, bad));
    out.append("\xEF\xBF\xBD");
    text.remove_prefix(bad + 1);
  }
  out.append(text);
  return out;
}

// Backslash and newline escaped (HELP text); also the double quote when
// `quote` (label values).
std::string Escape(std::string_view text, bool quote) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '"' && quote) {
      out += "\\\"";
    } else {
      out.push_back(c);
    }
  }
  return out;
}

// The series of `labels` in `series`, or the overflow series (every label
// "other") once the family holds kMaxSeriesPerFamily - 1 others.
template <typename T>
T& SeriesOf(std::map<LabelValues, T>& series, const LabelValues& labels) {
  auto it = series.find(labels);
  if (it != series.end()) return it->second;
  if (series.size() + 1 < kMaxSeriesPerFamily) return series[labels];
  return series[LabelValues(labels.size(), "other")];
}

std::vector<std::string> With(std::vector<std::string> list, std::string last) {
  list.push_back(std::move(last));
  return list;
}

// When the request the calling HTTP thread serves was routed; unset
// before routing and after its answer.
thread_local std::optional<Clock::time_point> t_routed;

}  // namespace

std::string EscapeLabelValue(std::string_view value) {
  return Escape(ValidUtf8(value), /*quote=*/true);
}

std::string FormatSampleValue(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  char text[32];
  std::to_chars_result r;
  if (value == std::trunc(value) && std::fabs(value) < kExactIntegers) {
    r = std::to_chars(text, text + sizeof(text), static_cast<int64_t>(value));
  } else {  // the shortest form that reads back as the same double
    r = std::to_chars(text, text + sizeof(text), value);
  }
  return std::string(text, r.ptr);
}

void ExpositionWriter::Family(std::string_view name, std::string_view type,
                              std::string_view help) {
  text_.append("# HELP ").append(name).append(" ");
  text_.append(Escape(help, /*quote=*/false)).append("\n");
  text_.append("# TYPE ").append(name).append(" ").append(type).append("\n");
}

void ExpositionWriter::Sample(std::string_view name,
                              const std::vector<std::string>& names,
                              const LabelValues& values, double value) {
  text_.append(name);
  for (size_t i = 0; i < names.size() && i < values.size(); ++i) {
    text_.append(i == 0 ? "{" : ",").append(names[i]).append("=\"");
    text_.append(EscapeLabelValue(values[i])).append("\"");
  }
  if (!names.empty()) text_.append("}");
  text_.append(" ").append(FormatSampleValue(value)).append("\n");
}

void CounterFamily::Add(const LabelValues& labels, double delta) {
  std::lock_guard<std::mutex> lock(mu_);
  SeriesOf(series_, labels) += delta;
}

void CounterFamily::Write(ExpositionWriter& out) const {
  std::map<LabelValues, double> copy;
  {
    std::lock_guard<std::mutex> lock(mu_);
    copy = series_;
  }
  out.Family(name_, "counter", help_);
  for (const auto& [labels, total] : copy) {
    out.Sample(name_, label_names_, labels, total);
  }
}

HistogramFamily::HistogramFamily(std::string name, std::string help,
                                 std::vector<std::string> label_names,
                                 std::vector<double> upper_bounds)
    : name_(std::move(name)),
      help_(std::move(help)),
      label_names_(std::move(label_names)),
      upper_bounds_(std::move(upper_bounds)) {}

void HistogramFamily::Observe(const LabelValues& labels, double value) {
  // The first bound not below the value (le: value <= bound); +Inf after.
  size_t bucket = 0;
  while (bucket < upper_bounds_.size() && value > upper_bounds_[bucket]) {
    ++bucket;
  }
  std::lock_guard<std::mutex> lock(mu_);
  Series& s = SeriesOf(series_, labels);
  if (s.buckets.empty()) s.buckets.assign(upper_bounds_.size() + 1, 0);
  ++s.buckets[bucket];
  s.sum += value;
  ++s.count;
}

void HistogramFamily::Write(ExpositionWriter& out) const {
  std::map<LabelValues, Series> copy;
  {
    std::lock_guard<std::mutex> lock(mu_);
    copy = series_;
  }
  out.Family(name_, "histogram", help_);
  const std::vector<std::string> bucket_names = With(label_names_, "le");
  for (const auto& [labels, s] : copy) {
    uint64_t cumulative = 0;
    for (size_t i = 0; i < s.buckets.size(); ++i) {
      cumulative += s.buckets[i];
      const std::string le = i < upper_bounds_.size()
                                 ? FormatSampleValue(upper_bounds_[i])
                                 : "+Inf";
      out.Sample(name_ + "_bucket", bucket_names, With(labels, le),
                 static_cast<double>(cumulative));
    }
    out.Sample(name_ + "_sum", label_names_, labels, s.sum);
    out.Sample(name_ + "_count", label_names_, labels,
               static_cast<double>(s.count));
  }
}

std::string RouteLabel(const httplib::Request& req) {
  const std::smatch& m = req.matches;
  if (m.empty()) return "other";
  // The whole match is the path; groups are replaced, the pattern's
  // literal text between them kept. A group inside another is skipped.
  std::string route;
  size_t at = 0;
  for (size_t i = 1; i < m.size(); ++i) {
    if (!m[i].matched) continue;
    const size_t begin = static_cast<size_t>(m.position(i));
    if (begin < at) continue;
    route.append(req.path, at, begin - at).append("*");
    at = begin + static_cast<size_t>(m.length(i));
  }
  route.append(req.path, at, std::string::npos);
  if (route.size() > kMaxRouteLabelBytes) return "other";
  return route;
}

std::string MethodLabel(std::string_view method) {
  for (const char* known :
       {"GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS"}) {
    if (method == known) return known;
  }
  return "other";
}

std::string StatusClassLabel(int status) {
  if (status < 100 || status > 599) return "other";
  return std::to_string(status / 100) + "xx";
}

RequestMetrics::RequestMetrics()
    : duration_("multislice_http_request_duration_seconds",
                "Seconds from routing a request to its answer written, by "
                "listener, route, method and status class.",
                {"listener", "route", "method", "status_class"},
                std::vector<double>(std::begin(kRequestLatencyBoundsSeconds),
                                    std::end(kRequestLatencyBoundsSeconds))),
      unrouted_("multislice_http_unrouted_requests_total",
                "Requests answered before routing (malformed request line "
                "or headers, URI too long), by listener and status code.",
                {"listener", "code"}) {}

void RequestMetrics::Instrument(httplib::Server& server,
                                const std::string& listener) {
  server.set_pre_routing_handler(
      [](const httplib::Request&, httplib::Response&) {
        t_routed = Clock::now();
        return httplib::Server::HandlerResponse::Unhandled;
      });
  server.set_logger([this, listener](const httplib::Request& req,
                                     const httplib::Response& res) {
    if (!t_routed) {
      const bool http = res.status >= 100 && res.status <= 599;
      unrouted_.Add({listener, http ? std::to_string(res.status) : "other"});
      return;
    }
    const std::chrono::duration<double> elapsed = Clock::now() - *t_routed;
    t_routed.reset();
    Record(listener, req, res.status, elapsed.count());
  });
}

void RequestMetrics::Record(const std::string& listener,
                            const httplib::Request& req, int status,
                            double seconds) {
  duration_.Observe({listener, RouteLabel(req), MethodLabel(req.method),
                     StatusClassLabel(status)},
                    seconds);
}

void RequestMetrics::Write(ExpositionWriter& out) const {
  duration_.Write(out);
  unrouted_.Write(out);
}

namespace {

// The numbers of a scrape, copied under the state's lock.
struct StateNumbers {
  int64_t queued_resources[kNumQrStates][kNumTiers] = {};
  int64_t hosts[3] = {};  // by kHostStates
  struct Heartbeat {
    std::string host, hostname;
    double age_seconds;
  };
  std::vector<Heartbeat> heartbeats;
  ControlState::Counts counts;
};

StateNumbers CopyNumbers(ControlState& state) {
  StateNumbers n;
  std::lock_guard<std::mutex> lock(state.mu);
  for (const auto& [name, r] : state.records) {
    ++n.queued_resources[static_cast<int>(r.state)]
                        [static_cast<int>(r.spec.tier)];
  }
  const std::map<std::string, std::string> owners = state.HostOwners();
  const int64_t now = SteadyMs();
  for (const auto& [id, h] : state.hosts) {
    ++n.hosts[h.lost ? 2 : (owners.count(id) ? 1 : 0)];
    n.heartbeats.push_back(
        {id, h.hostname, static_cast<double>(now - h.last_heartbeat) / 1000});
  }
  n.counts = state.counts;
  return n;
}

void WriteStateNumbers(const StateNumbers& n, ExpositionWriter& out) {
  out.Family("multislice_queued_resources", "gauge",
             "Queued resources by state and tier (every state and tier, "
             "zeros included).");
  for (int s = 0; s < kNumQrStates; ++s) {
    for (int t = 0; t < kNumTiers; ++t) {
      out.Sample(
          "multislice_queued_resources", {"state", "tier"},
          {StateName(static_cast<QrState>(s)), TierName(static_cast<Tier>(t))},
          static_cast<double>(n.queued_resources[s][t]));
    }
  }
  out.Family("multislice_hosts", "gauge",
             "Registered hosts by state: FREE, USED (held by a queued "
             "resource), LOST.");
  for (int s = 0; s < 3; ++s) {
    out.Sample("multislice_hosts", {"state"}, {kHostStates[s]},
               static_cast<double>(n.hosts[s]));
  }
  out.Family("multislice_host_heartbeat_age_seconds", "gauge",
             "Seconds since each host's last heartbeat (since this "
             "controller started, for a host it restored).");
  for (const StateNumbers::Heartbeat& h : n.heartbeats) {
    out.Sample("multislice_host_heartbeat_age_seconds", {"host", "hostname"},
               {h.host, h.hostname}, h.age_seconds);
  }
  const std::pair<const char*, const char*> counters[] = {
      {"multislice_repairs_started_total",
       "Slices sent to repair (a node became REPAIRING) since start."},
      {"multislice_repairs_completed_total",
       "Repaired slices (a REPAIRING node READY again) since start."},
      {"multislice_hosts_lost_total", "Hosts declared lost since start."}};
  const int64_t values[] = {n.counts.repairs_started,
                            n.counts.repairs_completed, n.counts.hosts_lost};
  for (size_t i = 0; i < std::size(counters); ++i) {
    out.Family(counters[i].first, "counter", counters[i].second);
    out.Sample(counters[i].first, {}, {}, static_cast<double>(values[i]));
  }
}

}  // namespace

std::string ControllerMetrics::Text() {
  ExpositionWriter out;
  WriteStateNumbers(CopyNumbers(state_), out);
  requests_.Write(out);
  return out.text();
}

void ControllerMetrics::Mount(httplib::Server& server,
                              const std::string& token) {
  Handler scrape = [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(Text(), kExpositionContentType);
  };
  server.Get("/metrics", token.empty() ? scrape : WithBearer(token, scrape));
}

}  // namespace multislice::control
