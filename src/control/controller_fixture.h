// Test support: a controller started in this process on a temporary data
// directory, an API client holding its token, and FakeAgent hosts; the
// fixture the controller's API tests derive from.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "common/temp_dir.h"
#include "control/control_testing.h"
#include "control/controller.h"
#include "control/fake_agent.h"
#include "control/http.h"

namespace multislice::control::testing {

class ControllerFixture : public ::testing::Test {
 protected:
  explicit ControllerFixture(std::string token,
                             std::string dir_prefix = "multislice-test-")
      : token_(std::move(token)), dir_(dir_prefix) {}

  // Starts the controller with `options` (its data directory and token
  // set here) and a client of it.
  void StartController(ControllerOptions options = {}) {
    ASSERT_TRUE(dir_.ok());
    options.data_dir = dir_.path() + "/data";
    options.token = token_;
    Result<std::unique_ptr<Controller>> c = Controller::Start(options);
    ASSERT_TRUE(c.ok()) << c.status().message();
    controller_ = std::move(*c);
    url_ = "http://127.0.0.1:" + std::to_string(controller_->port());
    client_ = std::make_unique<ApiClient>(
        *ApiClient::Create(url_, token_, std::chrono::seconds(10)));
  }
  void TearDown() override {
    agents_.clear();  // agents first: they call the controller
    controller_.reset();
  }

  // One more host of `type` in us-test1-a, once it has registered.
  FakeAgent& AddAgent(const std::string& type = "cpu-2") {
    agents_.push_back(std::make_unique<FakeAgent>(url_, token_, type));
    FakeAgent& a = *agents_.back();
    EXPECT_TRUE(WaitFor([&] { return !a.host_id().empty(); }));
    return a;
  }

  const std::string token_;
  TempDir dir_;
  std::unique_ptr<Controller> controller_;
  std::string url_;
  std::unique_ptr<ApiClient> client_;
  std::vector<std::unique_ptr<FakeAgent>> agents_;
};

}  // namespace multislice::control::testing
