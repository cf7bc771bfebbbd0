// The controller's API under libFuzzer (issue 12): each input becomes one
// HTTP request (fuzz::RequestFromBytes: method, route, path segments,
// query, body) sent over loopback to a controller started once for the
// process, with one fake cpu-2 agent so that valid creates get
// provisioned. Any answer of 500 or more, a request with no answer (a
// wedged controller), or an error answer that is not a google.rpc.Status
// aborts, and libFuzzer saves the input as a crash.
//
// Optional and clang only (CMake option MULTISLICE_LIBFUZZER, OFF by
// default), in a build directory of its own:
//
//   CC=clang CXX=clang++ cmake -S . -B build-fuzz -G Ninja \
//       -DMULTISLICE_LIBFUZZER=ON &&
//   ninja -C build-fuzz api_fuzz_libfuzzer &&
//   build-fuzz/bin/api_fuzz_libfuzzer -max_total_time=600
//
// Useful flags: a corpus directory as the last argument (kept between
// runs; seed it with a few inputs in the format of fuzz::RequestFromBytes,
// e.g. "\x01\x00\x00proj\nus-test1-a\nqr\n\n{...a create body...}"),
// -max_len=65536 to let inputs grow past libFuzzer's default of 4096
// bytes, -timeout=15 (an answer takes at most fuzz::kAnswerTimeout).
// Replay one saved input: build-fuzz/bin/api_fuzz_libfuzzer crash-<sha1>.
// The controller's threads are the process's, so the input that made it
// crash (ASan report) may be an earlier one than libFuzzer names; run with
// MULTISLICE_API_FUZZ_LOG=1 to print every request before it is sent.
//
// The same build also gives the bounded corpus under ASan:
// ninja -C build-fuzz api_fuzz_test && build-fuzz/bin/api_fuzz_test.
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>

#include "common/temp_dir.h"
#include "control/api_fuzz.h"
#include "control/controller.h"
#include "control/fake_agent.h"

namespace {

using multislice::control::Controller;
using multislice::control::ControllerOptions;
namespace fuzz = multislice::control::fuzz;

const char kToken[] = "api-fuzz-libfuzzer-token";

struct Target {
  multislice::TempDir dir{"api-fuzz-"};
  std::unique_ptr<Controller> controller;
  std::unique_ptr<multislice::control::testing::FakeAgent> agent;
  fuzz::CorpusOptions options;
  bool log = std::getenv("MULTISLICE_API_FUZZ_LOG") != nullptr;
};

// The controller, started on the first input and kept for the process.
Target& TheTarget() {
  static Target* target = [] {
    auto* t = new Target;
    ControllerOptions options;
    options.data_dir = t->dir.path() + "/data";
    options.token = kToken;
    auto started = Controller::Start(options);
    if (!started.ok()) {
      std::fprintf(stderr, "api_fuzz_libfuzzer: %s\n",
                   started.status().message().c_str());
      std::abort();
    }
    t->controller = std::move(*started);
    const std::string url =
        "http://127.0.0.1:" + std::to_string(t->controller->port());
    t->agent = std::make_unique<multislice::control::testing::FakeAgent>(
        url, kToken, "cpu-2");
    for (int i = 0; i < 500 && t->agent->host_id().empty(); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    t->options.hosts = {{t->agent->host_id(), t->agent->credential()}};
    const fuzz::FuzzRequest create =
        fuzz::MakeRequest("existing QR", "POST",
                          "/v2alpha1/projects/proj/locations/us-test1-a/"
                          "queuedResources?queued_resource_id=fz-existing",
                          fuzz::SimpleBody());
    fuzz::Send(t->controller->port(), kToken, create);
    return t;
  }();
  return *target;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Target& target = TheTarget();
  const fuzz::FuzzRequest request = fuzz::RequestFromBytes(
      std::string_view(reinterpret_cast<const char*>(data), size),
      target.options);
  const std::string bytes = fuzz::Serialize(request, kToken);
  if (target.log) {
    std::fprintf(stderr, "request: %s\n", fuzz::Printable(bytes, 2000).c_str());
  }
  const fuzz::FuzzAnswer answer =
      fuzz::SendBytes(target.controller->port(), bytes);
  const std::string problem = fuzz::CheckApiAnswer(request, answer);
  if (!problem.empty()) {
    std::fprintf(
        stderr, "api_fuzz_libfuzzer: %s\n  request: %s\n  answer: %s\n",
        problem.c_str(), fuzz::Printable(bytes, 2000).c_str(),
        fuzz::Printable(answer.headers + "\r\n\r\n" + answer.body, 2000)
            .c_str());
    std::abort();
  }
  return 0;
}
