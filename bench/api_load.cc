// Load on the queued-resource API: N get/list requests from C concurrent
// clients (default 1,000 from 50), each client one keep-alive connection;
// prints p50, p99 and max latency. Without --url it starts a controller in
// this process on a loopback port, seeded with --seed queued resources.
//
// Example:
//   api_load --requests 1000 --clients 50
//   api_load --url http://127.0.0.1:8470 --token-file runs/ctl/token
#include <httplib.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "common/temp_dir.h"
#include "control/controller.h"
#include "control/http.h"

namespace {

using multislice::TempDir;
namespace control = multislice::control;

int Usage() {
  std::fprintf(stderr,
               "usage: api_load [--requests N] [--clients C] [--seed S] "
               "[--url URL --token-file FILE] [--no-keep-alive] "
               "[--max-per-address N (0: no connection gate)]\n");
  return 2;
}

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t i = static_cast<size_t>(p * (v.size() - 1) + 0.5);
  return v[std::min(i, v.size() - 1)];
}

}  // namespace

int main(int argc, char** argv) {
  int requests = 1000, clients = 50, seed = 20;
  bool keep_alive = true;
  int max_per_address = -1;  // -1: as many as the server has threads
  std::string url, token_file;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> const char* { return i + 1 < argc ? argv[++i] : ""; };
    if (a == "--requests") {
      requests = std::atoi(next());
    } else if (a == "--clients") {
      clients = std::atoi(next());
    } else if (a == "--seed") {
      seed = std::atoi(next());
    } else if (a == "--url") {
      url = next();
    } else if (a == "--token-file") {
      token_file = next();
    } else if (a == "--no-keep-alive") {
      keep_alive = false;
    } else if (a == "--max-per-address") {
      max_per_address = std::atoi(next());
    } else {
      return Usage();
    }
  }
  if (requests < 1 || clients < 1 || seed < 0 ||
      url.empty() != token_file.empty()) {
    return Usage();
  }
  TempDir dir("api-load-");
  std::unique_ptr<control::Controller> controller;
  std::string token = "api-load-token";
  if (url.empty()) {
    control::ControllerOptions options;
    options.data_dir = dir.path();
    options.token = token;
    // Every client of this load comes from one address.
    options.max_connections_per_address =
        max_per_address < 0 ? options.http_threads : max_per_address;
    auto c = control::Controller::Start(options);
    if (!c.ok()) {
      std::fprintf(stderr, "api_load: %s\n", c.status().message().c_str());
      return 1;
    }
    controller = std::move(*c);
    url = "http://127.0.0.1:" + std::to_string(controller->port());
  } else {
    auto t = control::ReadToken(token_file);
    if (!t.ok()) {
      std::fprintf(stderr, "api_load: %s\n", t.status().message().c_str());
      return 2;
    }
    token = *t;
  }
  const std::string parent = "/v2alpha1/projects/load/locations/load-a";
  auto admin =
      *control::ApiClient::Create(url, token, std::chrono::seconds(10));
  for (int i = 0; i < seed; ++i) {
    nlohmann::json body = {{"tpu",
                            {{"node_spec",
                              {{{"multi_node_params", {{"node_count", 2}}},
                                {"node", {{"accelerator_type", "v4-8"}}}}}}}}};
    auto r = admin.Call("POST",
                        parent + "/queuedResources?queued_resource_id=load-" +
                            std::to_string(i),
                        &body);
    if (!r.ok() || (r->status != 200 && r->status != 409)) {
      std::fprintf(stderr, "api_load: seeding failed\n");
      return 1;
    }
  }
  std::vector<std::vector<double>> latencies(clients);
  std::atomic<int> next_request{0}, failures{0};
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::thread> threads;
  for (int c = 0; c < clients; ++c) {
    threads.emplace_back([&, c] {
      httplib::Client client(url);
      client.set_keep_alive(keep_alive);
      client.set_tcp_nodelay(true);
      client.set_connection_timeout(10, 0);
      client.set_read_timeout(10, 0);
      httplib::Headers headers = {{"Authorization", "Bearer " + token}};
      int i;
      while ((i = next_request.fetch_add(1)) < requests) {
        const std::string path = i % 2 == 0
                                     ? parent + "/queuedResources/load-" +
                                           std::to_string(seed ? i % seed : 0)
                                     : parent + "/queuedResources?pageSize=10";
        const auto t0 = std::chrono::steady_clock::now();
        auto res = client.Get(path, headers);
        const auto t1 = std::chrono::steady_clock::now();
        if (!res ||
            (res->status != 200 && !(seed == 0 && res->status == 404))) {
          failures.fetch_add(1);
        }
        latencies[c].push_back(
            std::chrono::duration<double, std::milli>(t1 - t0).count());
      }
    });
  }
  for (auto& t : threads) t.join();
  const double wall_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  std::vector<double> all;
  for (const auto& l : latencies) all.insert(all.end(), l.begin(), l.end());
  std::printf(
      "api_load: %d get/list requests from %d concurrent clients (%s) in "
      "%.2f s (%.0f req/s), %d failed\n"
      "latency ms: p50 %.2f  p90 %.2f  p99 %.2f  max %.2f\n",
      requests, clients, keep_alive ? "keep-alive" : "a connection each",
      wall_s, requests / wall_s, failures.load(), Percentile(all, 0.5),
      Percentile(all, 0.9), Percentile(all, 0.99),
      *std::max_element(all.begin(), all.end()));
  if (controller) controller->Stop();
  return failures.load() == 0 ? 0 : 1;
}
