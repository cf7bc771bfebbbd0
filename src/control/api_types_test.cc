#include "control/api_types.h"

#include "gtest/gtest.h"

namespace multislice::control {
namespace {

using nlohmann::json;

TEST(ApiTypesTest, ResourceIds) {
  EXPECT_TRUE(ValidResourceId("my-qr_1.2~3+4%5"));
  EXPECT_FALSE(ValidResourceId(""));
  EXPECT_FALSE(ValidResourceId("a/b"));
  EXPECT_FALSE(ValidResourceId("a b"));
  EXPECT_FALSE(ValidResourceId(std::string(2000, 'a')));
}

TEST(ApiTypesTest, MalformedJsonNamesLineAndColumn) {
  Result<json> ok = ParseJsonText("{\"a\": [1, 2]}");
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ((*ok)["a"][1], 2);
  // Line 3, the '}' at column 1 where a value was expected.
  Result<json> bad = ParseJsonText("{\n  \"a\": 1,\n}");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("line 3, column 1:"), std::string::npos)
      << bad.status().message();
  Result<json> truncated = ParseJsonText("{\"a\": ");
  ASSERT_FALSE(truncated.ok());
  EXPECT_NE(truncated.status().message().find("line 1"), std::string::npos);
}

TEST(ApiTypesTest, DurationsAndTimes) {
  EXPECT_EQ(*ParseDurationMs("3600s"), 3600000);
  EXPECT_EQ(*ParseDurationMs("1.5s"), 1500);
  EXPECT_FALSE(ParseDurationMs("1h").ok());
  EXPECT_FALSE(ParseDurationMs("-1s").ok());
  EXPECT_FALSE(ParseDurationMs("s").ok());
  // 2024-05-01T10:00:00Z = 1714557600 s since the epoch.
  EXPECT_EQ(*ParseTimestampMs("2024-05-01T10:00:00Z"), 1714557600000);
  EXPECT_EQ(*ParseTimestampMs("2024-05-01T10:00:00.25Z"), 1714557600250);
  EXPECT_EQ(*ParseTimestampMs("2024-05-01T12:00:00+02:00"), 1714557600000);
  EXPECT_FALSE(ParseTimestampMs("2024-05-01 10:00:00").ok());
  EXPECT_FALSE(ParseTimestampMs("2024-13-01T10:00:00Z").ok());
  EXPECT_EQ(FormatTimestamp(1714557600250), "2024-05-01T10:00:00.250Z");
}

TEST(ApiTypesTest, CamelCaseKeepsMetadataKeys) {
  json in = {
      {"node_spec",
       {{{"multi_node_params", {{"node_count", 2}}},
         {"node",
          {{"metadata", {{"startup-script", "x"}, {"my_key", "y"}}}}}}}}};
  Result<json> out = ToCamelCase(in);
  ASSERT_TRUE(out.ok());
  EXPECT_EQ((*out)["nodeSpec"][0]["multiNodeParams"]["nodeCount"], 2);
  EXPECT_EQ((*out)["nodeSpec"][0]["node"]["metadata"]["my_key"], "y");
  EXPECT_EQ((*out)["nodeSpec"][0]["node"]["metadata"]["startup-script"], "x");
  json both = {{"node_spec", 1}, {"nodeSpec", 2}};
  EXPECT_FALSE(ToCamelCase(both).ok());
}

json Body(int count) {
  return {{"tpu",
           {{"node_spec",
             {{{"multi_node_params", {{"node_count", count}}},
               {"node", {{"accelerator_type", "cpu-2"}}}}}}}}};
}

TEST(ApiTypesTest, ParsesNodesTiersAndPolicies) {
  Result<QueuedResourceSpec> spec = ParseQueuedResource(Body(3), "qr", 1000);
  ASSERT_TRUE(spec.ok()) << spec.status().message();
  EXPECT_EQ(spec->node_ids, (std::vector<std::string>{"qr-0", "qr-1", "qr-2"}));
  EXPECT_EQ(spec->tier, Tier::kOnDemand);
  json body = Body(2);
  body["tpu"]["node_spec"][0]["multi_node_params"]["node_id_prefix"] = "p";
  body["spot"] = json::object();
  body["queueing_policy"] = {{"valid_until_duration", "10s"},
                             {"valid_after_time", "1970-01-01T00:00:05Z"}};
  spec = ParseQueuedResource(body, "qr", 1000);
  ASSERT_TRUE(spec.ok()) << spec.status().message();
  EXPECT_EQ(spec->node_ids, (std::vector<std::string>{"p-0", "p-1"}));
  EXPECT_EQ(spec->tier, Tier::kSpot);
  EXPECT_EQ(spec->valid_until_ms, 11000);
  EXPECT_EQ(spec->valid_after_ms, 5000);
  EXPECT_TRUE(spec->body["queueingPolicy"].contains("validUntilDuration"));
  // A single node by id.
  json single = {
      {"tpu",
       {{"node_spec",
         {{{"node_id", "solo"}, {"node", {{"accelerator_type", "v4-16"}}}}}}}},
      {"guaranteed", {{"reserved", true}}}};
  spec = ParseQueuedResource(single, "qr", 0);
  ASSERT_TRUE(spec.ok());
  EXPECT_EQ(spec->node_ids, std::vector<std::string>{"solo"});
  EXPECT_EQ(spec->tier, Tier::kReserved);
  // Node count bounds.
  EXPECT_TRUE(ParseQueuedResource(Body(256), "qr", 0).ok());
  EXPECT_FALSE(ParseQueuedResource(Body(257), "qr", 0).ok());
  EXPECT_FALSE(ParseQueuedResource(Body(1), "qr", 0).ok());
}

TEST(ApiTypesTest, RecordsRoundTripThroughStorage) {
  QueuedResourceRecord r;
  r.name = "projects/p/locations/z/queuedResources/qr";
  r.project = "p";
  r.zone = "z";
  r.id = "qr";
  r.seq = 7;
  r.spec = *ParseQueuedResource(Body(2), "qr", 0);
  r.spec.valid_until_ms = 99;
  r.state = QrState::kProvisioning;
  r.holds_quota = true;
  r.chips_per_slice = 2;  // cpu-2
  r.attempt = 3;
  r.stage = "stop";
  r.nodes = {{"qr-0", "REPAIRING", "TIMEOUT", {}, false},
             {"qr-1", "RESTARTING", "HEALTHY", {"host-2"}, true}};
  r.retired_hosts = {"host-1"};
  r.waiting_ops = {"op"};
  Result<QueuedResourceRecord> back =
      QueuedResourceRecord::FromStorage(r.ToStorage());
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(back->ToStorage(), r.ToStorage());
  json api = back->ToApi();
  EXPECT_EQ(api["state"]["state"], "PROVISIONING");
  EXPECT_EQ(api["nodes"][1]["hosts"][0], "host-2");
  EXPECT_EQ(api["quotaHeldChips"], 4);
}

TEST(ApiTypesTest, StateHistoryIsBoundedDedupedAndStored) {
  QueuedResourceRecord r;
  r.state = QrState::kAccepted;
  EXPECT_TRUE(r.RecordStateChange(1000));
  EXPECT_FALSE(r.RecordStateChange(2000));  // same state and initiator
  r.state_initiator = "SERVICE";
  EXPECT_TRUE(r.RecordStateChange(3000));  // same state, new initiator
  ASSERT_EQ(r.state_history.size(), 2u);
  EXPECT_EQ(r.state_history[0].state, "ACCEPTED");
  EXPECT_EQ(r.state_history[0].time_ms, 1000);
  EXPECT_EQ(r.state_history[1].initiator, "SERVICE");
  for (int i = 0; i < 200; ++i) {
    r.state = i % 2 ? QrState::kActive : QrState::kProvisioning;
    r.RecordStateChange(10000 + i);
  }
  ASSERT_EQ(r.state_history.size(), kMaxStateHistory);
  EXPECT_EQ(r.state_history.back().time_ms, 10199);  // the newest are kept
  EXPECT_EQ(r.state_history.back().state, "ACTIVE");

  json api = r.ToApi();
  ASSERT_EQ(api["stateHistory"].size(), kMaxStateHistory);
  EXPECT_EQ(api["stateHistory"].back()["time"], "1970-01-01T00:00:10.199Z");
  EXPECT_EQ(api["stateHistory"].back()["initiator"], "SERVICE");
}

TEST(ApiTypesTest, RecordsWithoutStateHistoryStillLoad) {
  Result<QueuedResourceSpec> spec =
      ParseQueuedResource(json::parse(R"({"tpu": {"node_spec": [{"node_id": "n",
        "node": {"accelerator_type": "cpu-1"}}]}})"),
                          "qr", 0);
  ASSERT_TRUE(spec.ok()) << spec.status().message();
  QueuedResourceRecord r;
  r.name = "projects/p/locations/z/queuedResources/qr";
  r.id = "qr";
  r.spec = *spec;
  r.state = QrState::kActive;
  r.RecordStateChange(5);
  json stored = r.ToStorage();
  Result<QueuedResourceRecord> back = QueuedResourceRecord::FromStorage(stored);
  ASSERT_TRUE(back.ok()) << back.status().message();
  ASSERT_EQ(back->state_history.size(), 1u);
  EXPECT_EQ(back->state_history[0].state, "ACTIVE");
  EXPECT_EQ(back->state_history[0].time_ms, 5);
  stored.erase("stateHistory");  // written before the field existed
  back = QueuedResourceRecord::FromStorage(stored);
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_TRUE(back->state_history.empty());
}

}  // namespace
}  // namespace multislice::control
