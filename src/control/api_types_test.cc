#include "control/api_types.h"

#include <functional>

#include "control/validation.h"
#include "gtest/gtest.h"

namespace multislice::control {
namespace {

using nlohmann::json;

TEST(ApiTypesTest, ResourceIds) {
  // The Cloud TPU API's rule: RFC 1035 labels (validation_test has more).
  EXPECT_TRUE(ValidResourceId("my-qr-1"));
  EXPECT_TRUE(ValidResourceId(std::string(63, 'a')));
  EXPECT_FALSE(ValidResourceId(std::string(64, 'a')));
  for (const char* bad :
       {"", "a/b", "a b", ".", "..", "-x", "%", "my-qr_1.2~3+4%5", "Qr"}) {
    EXPECT_FALSE(ValidResourceId(bad)) << bad;
  }
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

TEST(ApiTypesTest, DeepNestingIsRefusedBeforeATreeIsBuilt) {
  // 32 KB of brackets used to overflow the stack in ToCamelCase.
  const std::string deep(16000, '[');
  Result<json> r = ParseJsonText(deep + std::string(16000, ']'));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(r.status().message(),
            "malformed JSON at line 1, column 65: arrays and objects are "
            "nested more than 64 deep");
  // Truncated as well: the depth is found first.
  EXPECT_FALSE(ParseJsonText("{\"a\": " + deep).ok());
  const std::string at_limit =
      std::string(kMaxJsonDepth, '[') + std::string(kMaxJsonDepth, ']');
  EXPECT_TRUE(ParseJsonText(at_limit).ok());
  // A tree built in code is checked too, without recursion.
  json root = json::array();
  json* leaf = &root;
  for (int i = 0; i < 20000; ++i) {
    leaf->push_back(json::array());
    leaf = &leaf->back();
  }
  Result<json> camel = ToCamelCase(root);
  ASSERT_FALSE(camel.ok());
  EXPECT_NE(camel.status().message().find("nested more than 64 deep"),
            std::string::npos);
}

TEST(ApiTypesTest, InvalidUtf8AndInfiniteNumbersAre400s) {
  Result<json> utf8 = ParseJsonText("{\n  \"a\": \"x\xC3\"}");
  ASSERT_FALSE(utf8.ok());
  EXPECT_EQ(utf8.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(utf8.status().message().rfind(
                "malformed JSON at line 2, column 10: invalid UTF-8", 0),
            0u)
      << utf8.status().message();
  // 1e999999 is past a double: nlohmann throws out_of_range for it.
  Result<json> inf = ParseJsonText(R"({"tpu": {"x": [1, 1e999999]}})");
  ASSERT_FALSE(inf.ok());
  EXPECT_EQ(inf.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(inf.status().message(),
            "tpu.x[1]: the number '1e999999' at line 1, column 19 is out of "
            "range (numbers must be finite)");
  Result<json> top = ParseJsonText("-1e400");
  ASSERT_FALSE(top.ok());
  EXPECT_EQ(top.status().message().rfind("body: the number '-1e400'", 0), 0u);
  Result<json> nested = ParseJsonText(R"({"a": {"b": 2e400}})");
  ASSERT_FALSE(nested.ok());
  EXPECT_EQ(nested.status().message().rfind("a.b: ", 0), 0u);
  // Tiny numbers are not errors (they round to zero).
  ASSERT_TRUE(ParseJsonText("[1e-99999]").ok());
  // A string escape that is not a character (a lone surrogate).
  Result<json> surrogate = ParseJsonText(R"(["\ud800"])");
  ASSERT_FALSE(surrogate.ok());
  EXPECT_EQ(surrogate.status().message().rfind("malformed JSON at line 1", 0),
            0u);
}

TEST(ApiTypesTest, TimesAreStrictRfc3339) {
  EXPECT_EQ(*ParseTimestampMs("2024-02-29T00:00:00Z"), 1709164800000);
  EXPECT_EQ(*ParseTimestampMs("2000-02-29T23:59:59Z"), 951868799000);
  EXPECT_EQ(*ParseTimestampMs("0001-01-01T00:00:00Z"), -62135596800000);
  EXPECT_EQ(*ParseTimestampMs("2024-05-01t10:00:00.123456789z"), 1714557600123);
  EXPECT_EQ(*ParseTimestampMs("2024-05-01T10:00:00.5-00:30"), 1714559400500);
  struct Case {
    const char* text;
    const char* reason;  // in the message; "" for a syntax error
  };
  const Case bad[] = {
      {"2024-02-30T00:00:00Z", "day 30 does not exist in 2024-02"},
      {"2023-02-29T00:00:00Z", "day 29 does not exist in 2023-02"},
      {"1900-02-29T00:00:00Z", "day 29 does not exist in 1900-02"},
      {"2024-04-31T00:00:00Z", "day 31 does not exist in 2024-04"},
      {"2024-01-00T00:00:00Z", "day 0 does not exist"},
      {"2024-13-01T00:00:00Z", "month 13 is not 01..12"},
      {"2024-00-01T00:00:00Z", "month 0 is not 01..12"},
      {"0000-01-01T00:00:00Z", "year 0000"},
      {"2024-05-01T24:00:00Z", "hour 24"},
      {"2024-05-01T10:60:00Z", "minute 60"},
      {"2024-05-01T00:00:60Z", "second 60"},
      {"2024-05-01T10:00:00+24:00", "offset"},
      {"2024-05-01T10:00:00+02:60", "offset"},
      {"2024-05-01T10:00:00.Z", "1 to 9 digits"},
      {"2024-05-01T10:00:00.1234567891Z", "1 to 9 digits"},
      {"2024-05-01T10:00:00", "Z or an offset"},
      {"2024-05-01T10:00:00+0200", "Z or an offset"},
      {"2024-05-01T10:00:00ZZ", "Z or an offset"},
      {"2024-05-01 10:00:00Z", ""},
      {" 024-05-01T10:00:00Z", ""},
      {"+024-05-01T10:00:00Z", ""},
      {"2024-5-01T10:00:00Z", ""},
      {"2024-05-01T1:00:00Z", ""},
      {"", ""},
  };
  for (const Case& c : bad) {
    Result<int64_t> t = ParseTimestampMs(c.text);
    ASSERT_FALSE(t.ok()) << c.text;
    EXPECT_EQ(t.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(t.status().message().find("is not an RFC 3339 time"),
              std::string::npos);
    EXPECT_NE(t.status().message().find(c.reason), std::string::npos)
        << t.status().message();
  }
}

TEST(ApiTypesTest, DurationsAreBounded) {
  EXPECT_EQ(*ParseDurationMs("0.5s"), 500);
  EXPECT_EQ(*ParseDurationMs(".25s"), 250);
  EXPECT_EQ(*ParseDurationMs("1.0005s"), 1001);
  EXPECT_EQ(*ParseDurationMs("315576000000s"), 315576000000000);
  for (const char* bad :
       {"315576000001s", "9999999999999s", "1.s", ".s", "1e3s", "+1s", " 1s",
        "1 s", "1.1234567891s", "1..5s", "inf s", "nans", "1S"}) {
    EXPECT_FALSE(ParseDurationMs(bad).ok()) << bad;
  }
  EXPECT_NE(ParseDurationMs("315576000001s")
                .status()
                .message()
                .find("longer than 315576000000s"),
            std::string::npos);
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

// A body edit and the start of the message it must produce.
struct BadBody {
  std::function<void(json&)> edit;
  std::string message;
};

TEST(ApiTypesTest, EveryFieldIsTypeCheckedAndBounded) {
  auto node = [](json& b) -> json& { return b["tpu"]["node_spec"][0]["node"]; };
  const std::string n = "tpu.node_spec[0].node";
  const std::vector<BadBody> cases = {
      {[&](json& b) { node(b)["description"] = 5; },
       n + ".description: expected a string, got a number"},
      {[&](json& b) { node(b)["description"] = json::object(); },
       n + ".description: expected a string, got an object"},
      {[&](json& b) { node(b)["runtime_version"] = true; },
       n + ".runtime_version: expected a string, got a boolean"},
      {[&](json& b) { node(b)["accelerator_type"] = nullptr; },
       n + ".accelerator_type: expected a string, got null"},
      {[&](json& b) {
         node(b)["network_config"] = {{"can_ip_forward", "yes"}};
       },
       n + ".network_config.can_ip_forward: expected true or false, got a "
           "string"},
      {[&](json& b) {
         node(b)["network_config"] = {{"queue_count", 1000}};
       },
       n + ".network_config.queue_count: 1000 is outside 0..64"},
      {[&](json& b) {
         node(b)["network_config"] = {{"queue_count", "2"}};
       },
       n + ".network_config.queue_count: expected an integer, got a string"},
      {[&](json& b) { node(b)["network_config"] = json::array(); },
       n + ".network_config: expected an object, got a list"},
      {[&](json& b) { node(b)["tags"] = "a"; },
       n + ".tags: expected a list, got a string"},
      {[&](json& b) { node(b)["tags"] = {1}; },
       n + ".tags[0]: expected a string"},
      {[&](json& b) {
         node(b)["service_account"] = {{"scope", "x"}};
       },
       n + ".service_account.scope: expected a list, got a string"},
      {[&](json& b) {
         node(b)["service_account"] = {{"email", 1}};
       },
       n + ".service_account.email: expected a string"},
      {[&](json& b) {
         node(b)["scheduling_config"] = {{"spot", "true"}};
       },
       n + ".scheduling_config.spot: expected true or false, got a string"},
      {[&](json& b) {
         node(b)["data_disks"] = {{{"mode", "WRITE_MANY"}}};
       },
       n + ".data_disks[0].mode: 'WRITE_MANY' is not READ_WRITE or READ_ONLY"},
      {[&](json& b) { node(b)["data_disks"] = {5}; },
       n + ".data_disks[0]: expected an object, got a number"},
      {[&](json& b) {
         node(b)["shielded_instance_config"] = {{"enable_secure_boot", 1}};
       },
       n + ".shielded_instance_config.enable_secure_boot: expected true or "
           "false"},
      {[&](json& b) {
         node(b)["accelerator_config"] = {{"topology", 2}};
       },
       n + ".accelerator_config.topology: expected a string"},
      {[&](json& b) {
         node(b)["labels"] = {{"k", 1}};
       },
       n + ".labels[\"k\"]: expected a string"},
      {[&](json& b) { node(b)["metadata"] = "x"; },
       n + ".metadata: expected an object of strings, got a string"},
      {[](json& b) {
         b["tpu"]["node_spec"][0]["multi_node_params"]["node_count"] = 2.0;
       },
       "tpu.node_spec[0].multi_node_params.node_count: expected an integer, "
       "got a number with a fraction or exponent"},
      {[](json& b) {
         b["tpu"]["node_spec"][0]["multi_node_params"]["node_count"] =
             18446744073709551615ull;
       },
       "tpu.node_spec[0].multi_node_params.node_count: 18446744073709551615 "
       "is outside 2..256"},
      {[](json& b) {
         b["tpu"]["node_spec"][0]["multi_node_params"]["node_count"] = -3;
       },
       "tpu.node_spec[0].multi_node_params.node_count: -3 is outside 2..256"},
      {[](json& b) { b["tpu"]["node_spec"][0]["parent"] = 1; },
       "tpu.node_spec[0].parent: expected a string"},
      {[](json& b) { b["tpu"]["node_spec"] = json::object(); },
       "tpu.node_spec: expected a list, got an object"},
      {[](json& b) {
         b["guaranteed"] = {{"min_duration", 5}};
       },
       "guaranteed.min_duration: expected a string, got a number"},
      {[](json& b) {
         b["guaranteed"] = {{"min_duration", "-5s"}};
       },
       "guaranteed.min_duration: '-5s' is not a duration"},
      {[](json& b) {
         b["guaranteed"] = {{"reserved", "yes"}};
       },
       "guaranteed.reserved: expected true or false"},
      {[](json& b) { b["spot"] = true; },
       "spot: expected an object, got a boolean"},
      {[](json& b) { b["reservation_name"] = 7; },
       "reservation_name: expected a string"},
      {[](json& b) {
         b["queueing_policy"] = {{"valid_until_time", 7}};
       },
       "queueing_policy.valid_until_time: expected a string, got a number"},
      {[](json& b) {
         b["queueing_policy"] = {{"valid_after_time", "2024-02-30T00:00:00Z"}};
       },
       "queueing_policy.valid_after_time: '2024-02-30T00:00:00Z' is not an "
       "RFC 3339 time"},
      {[](json& b) {
         b["queueing_policy"] = {{"valid_until_duration", "99999999999999s"}};
       },
       "queueing_policy.valid_until_duration: '99999999999999s' is not a "
       "duration"},
  };
  for (const BadBody& c : cases) {
    json body = Body(2);
    c.edit(body);
    Result<QueuedResourceSpec> spec = ParseQueuedResource(body, "qr", 0);
    ASSERT_FALSE(spec.ok()) << c.message;
    EXPECT_EQ(spec.status().code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(spec.status().message().rfind(c.message, 0), 0u)
        << "expected '" << c.message << "' in: " << spec.status().message();
  }
  // The same fields, well typed, are accepted.
  json body = Body(2);
  json& nd = body["tpu"]["node_spec"][0]["node"];
  nd["description"] = "a queued resource";
  nd["network_config"] = {{"can_ip_forward", true}, {"queue_count", 4}};
  nd["service_account"] = {{"email", "a@b"}, {"scope", {"s"}}};
  nd["scheduling_config"] = {{"spot", false}};
  nd["data_disks"] = {{{"source_disk", "d"}, {"mode", "READ_ONLY"}}};
  nd["shielded_instance_config"] = {{"enable_secure_boot", true}};
  nd["accelerator_config"] = {{"type", "V4"}, {"topology", "2x2x1"}};
  body["guaranteed"] = {{"min_duration", "60s"}};
  Result<QueuedResourceSpec> spec = ParseQueuedResource(body, "qr", 0);
  ASSERT_TRUE(spec.ok()) << spec.status().message();
}

TEST(ApiTypesTest, NodeIdsFollowTheApiRule) {
  auto single = [](const std::string& node_id) {
    return json{{"tpu",
                 {{"node_spec",
                   {{{"node_id", node_id},
                     {"node", {{"accelerator_type", "cpu-1"}}}}}}}}};
  };
  for (const char* bad : {"Solo", ".", "..", "-x", "a%2e", "a_b", "x-"}) {
    Result<QueuedResourceSpec> spec = ParseQueuedResource(single(bad), "q", 0);
    ASSERT_FALSE(spec.ok()) << bad;
    EXPECT_EQ(spec.status().message().rfind("tpu.node_spec[0].node_id: '", 0),
              0u)
        << spec.status().message();
  }
  EXPECT_TRUE(ParseQueuedResource(single(std::string(63, 'n')), "q", 0).ok());
  json multi = Body(2);
  multi["tpu"]["node_spec"][0]["multi_node_params"]["node_id_prefix"] = "..";
  Result<QueuedResourceSpec> spec = ParseQueuedResource(multi, "q", 0);
  ASSERT_FALSE(spec.ok());
  EXPECT_EQ(spec.status().message().rfind(
                "tpu.node_spec[0].multi_node_params.node_id_prefix: '..'", 0),
            0u);
  // The prefix defaults to the id; "-0".."-9" must still fit in 63.
  const std::string id62(62, 'q');
  spec = ParseQueuedResource(Body(2), id62, 0);
  ASSERT_FALSE(spec.ok());
  EXPECT_NE(spec.status().message().find("longer than 63 characters"),
            std::string::npos)
      << spec.status().message();
  EXPECT_TRUE(ParseQueuedResource(Body(10), std::string(61, 'q'), 0).ok());
  EXPECT_FALSE(ParseQueuedResource(Body(11), std::string(61, 'q'), 0).ok());
}

TEST(ApiTypesTest, MessagesQuotingUserKeysStayValidUtf8) {
  // A long key of two-byte characters used to be cut at byte 64, in the
  // middle of a character: dumping that message threw (a 500).
  std::string key = "a";
  for (int i = 0; i < 600; ++i) key += "\xC3\xA9";
  json body = Body(2);
  body["tpu"]["node_spec"][0]["node"]["labels"] = {{key, 1}};
  Result<QueuedResourceSpec> spec = ParseQueuedResource(body, "qr", 0);
  ASSERT_FALSE(spec.ok());
  EXPECT_NO_THROW(json(spec.status().message()).dump());
  EXPECT_LT(spec.status().message().size(), 400u);
}

TEST(ApiTypesTest, StoredRecordsOfOlderRulesStillLoad) {
  // Written by a version that accepted ids such as "My_QR" and any JSON
  // type for description: FromStorage must not refuse the whole store.
  QueuedResourceRecord r;
  r.name = "projects/p/locations/z/queuedResources/My_QR";
  r.id = "My_QR";
  r.spec.body = json::parse(R"({"tpu": {"nodeSpec": [{"multiNodeParams":
      {"nodeCount": 2}, "node": {"acceleratorType": "cpu-1",
      "description": 5}}]}, "queueingPolicy":
      {"validAfterTime": "2024-02-30T00:00:00Z"}})");
  r.spec.valid_after_ms = 77;
  Result<QueuedResourceRecord> back =
      QueuedResourceRecord::FromStorage(r.ToStorage());
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(back->spec.node_ids,
            (std::vector<std::string>{"My_QR-0", "My_QR-1"}));
  EXPECT_EQ(back->spec.valid_after_ms, 77);
  // The same body is refused as a request.
  EXPECT_FALSE(ParseQueuedResource(r.spec.body, "My_QR", 0).ok());
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
  r.nodes = {{"qr-0", "REPAIRING", "TIMEOUT", {}, false, nullptr, 0},
             {"qr-1",
              "RESTARTING",
              "HEALTHY",
              {"host-2"},
              true,
              {{"ssh-keys", "root:ssh-ed25519 AAAA root"}},
              2}};
  r.node_updates = {{"op-2", "qr-1", 2, 12345}};
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
  // A patched node's metadata and generation, and the update under way.
  EXPECT_EQ(back->NodeMetadata(back->nodes[1])["ssh-keys"],
            "root:ssh-ed25519 AAAA root");
  EXPECT_EQ(back->nodes[1].metadata_generation, 2);
  EXPECT_TRUE(back->nodes[0].metadata.is_null());
  ASSERT_EQ(back->node_updates.size(), 1u);
  EXPECT_EQ(back->node_updates[0].op, "op-2");
  EXPECT_EQ(back->node_updates[0].deadline_ms, 12345);
}

TEST(ApiTypesTest, AMultisliceAnswerHasOneNodeSpecPerNode) {
  // gcloud's queued-resources ssh --node and list's NODE_COUNT read the
  // answer's nodeSpec: one per node, each with its nodeId, as Google's.
  for (const std::string api : {"v2alpha1", "v2"}) {
    const json params = {{"nodeCount", 3}, {"nodeIdPrefix", "tpu"}};
    json body = {
        {"tpu",
         {{"nodeSpec",
           {{{api == "v2" ? "multisliceParams" : "multiNodeParams", params},
             {"node",
              {{"acceleratorType", "cpu-2"}, {"metadata", {{"a", "b"}}}}}}}}}}};
    Result<QueuedResourceSpec> spec = ParseQueuedResource(body, "qr", 0, api);
    ASSERT_TRUE(spec.ok()) << spec.status().message();
    QueuedResourceRecord r;
    r.spec = *spec;
    for (const std::string& id : spec->node_ids) {
      NodeRecord n;
      n.node_id = id;
      r.nodes.push_back(n);
    }
    const json out = r.ToApi(api)["tpu"]["nodeSpec"];
    ASSERT_EQ(out.size(), 3u) << out.dump();
    for (int i = 0; i < 3; ++i) {
      EXPECT_EQ(out[i]["nodeId"], "tpu-" + std::to_string(i));
      EXPECT_FALSE(out[i].contains("multiNodeParams"));
      EXPECT_FALSE(out[i].contains("multisliceParams"));
      EXPECT_EQ(out[i]["node"]["metadata"]["a"], "b");
    }
    // Node ids are decimal, distinct per node, stable.
    EXPECT_NE(r.NodeNumericId(0), r.NodeNumericId(1));
    EXPECT_EQ(r.NodeNumericId(2), r.NodeNumericId(2));
  }
}

TEST(ApiTypesTest, GcloudAlphasCreateBodyIsAccepted) {
  // What `gcloud alpha compute tpus queued-resources create` (528) sends.
  const json body = json::parse(R"({"provisioningModel": "STANDARD",
    "tpu": {"nodeSpec": [{"node": {"acceleratorType": "cpu-2",
      "autocheckpointEnabled": false, "metadata": {},
      "networkConfig": {"enableExternalIps": true, "network": "default"},
      "runtimeVersion": "v2-alpha-tpuv5-lite", "serviceAccount": {}},
      "nodeId": "tpu-x", "parent": "projects/p/locations/z"}]}})");
  Result<QueuedResourceSpec> spec =
      ParseQueuedResource(body, "qr", 0, "v2alpha1");
  ASSERT_TRUE(spec.ok()) << spec.status().message();
  EXPECT_EQ(spec->tier, Tier::kOnDemand);
  // provisioning_model and reservation_name choose tiers.
  json spot = body;
  spot["provisioningModel"] = "SPOT";
  EXPECT_EQ(ParseQueuedResource(spot, "qr", 0, "v2alpha1")->tier, Tier::kSpot);
  json reserved = body;
  reserved.erase("provisioningModel");
  reserved["reservationName"] = "projects/p/locations/z/reservations/-";
  EXPECT_EQ(ParseQueuedResource(reserved, "qr", 0, "v2alpha1")->tier,
            Tier::kReserved);
  reserved["tpu"]["nodeSpec"][0]["node"].erase("autocheckpointEnabled");
  Result<QueuedResourceSpec> v2_reserved =
      ParseQueuedResource(reserved, "qr", 0, "v2");
  ASSERT_TRUE(v2_reserved.ok()) << v2_reserved.status().message();
  EXPECT_EQ(v2_reserved->tier, Tier::kReserved);
  // Refusals name the field.
  auto refusal = [](json b, const std::string& api) {
    return ParseQueuedResource(b, "qr", 0, api).status().message();
  };
  json flex = body;
  flex["provisioningModel"] = "FLEX_START";
  EXPECT_NE(refusal(flex, "v2alpha1")
                .find("provisioning_model: FLEX_START is "
                      "not implemented"),
            std::string::npos);
  json bad = body;
  bad["provisioningModel"] = "CHEAP";
  EXPECT_NE(refusal(bad, "v2alpha1")
                .find("provisioning_model: 'CHEAP' is not "
                      "one of"),
            std::string::npos);
  json contradicts = spot;
  contradicts["guaranteed"] = json::object();
  EXPECT_NE(refusal(contradicts, "v2alpha1").find("contradicts"),
            std::string::npos);
  json checkpoint = body;
  checkpoint["tpu"]["nodeSpec"][0]["node"]["autocheckpointEnabled"] = true;
  EXPECT_NE(refusal(checkpoint, "v2alpha1")
                .find("tpu.node_spec[0].node.autocheckpoint_enabled: true is "
                      "not implemented"),
            std::string::npos);
  json run = body;
  run["runDuration"] = {{"maxRunDuration", "3600s"}};
  EXPECT_NE(refusal(run, "v2alpha1")
                .find("run_duration: a run duration is "
                      "not implemented"),
            std::string::npos);
  EXPECT_EQ(refusal(body, "v2"),
            "provisioning_model: not a field of the v2 QueuedResource (it is "
            "v2alpha1's: use the /v2alpha1/ API)");
  json v2 = body;
  v2.erase("provisioningModel");
  EXPECT_NE(refusal(v2, "v2").find(
                "tpu.node_spec[0].node.autocheckpoint_enabled: not a field "
                "of the v2 API"),
            std::string::npos);
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
