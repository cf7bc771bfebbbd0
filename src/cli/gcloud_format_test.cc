// gcloud's --format and --filter against outputs written out by hand from
// gcloud's documented behaviour (gcloud topic formats, filters,
// projections).
#include "cli/gcloud_format.h"

#include <gtest/gtest.h>

namespace multislice::cli {
namespace {

using nlohmann::json;

const KeyAliases kAliases = {{"zone", "name.segment(3)"},
                             {"node_count", "nodes.len()"},
                             {"state", "state.state"}};

json Qr(const std::string& id, const std::string& state, int nodes) {
  json qr = {
      {"name", "projects/p/locations/us-central1-a/queuedResources/" + id},
      {"state", {{"state", state}, {"stateInitiator", "USER"}}},
      {"tpu",
       {{"nodeSpec",
         {{{"node", {{"acceleratorType", "v5litepod-16"}}},
           {"parent", "projects/p/locations/us-central1-a"}}}}}},
      {"nodes", json::array()}};
  for (int i = 0; i < nodes; ++i) {
    qr["nodes"].push_back({{"nodeId", id + "-" + std::to_string(i)}});
  }
  return qr;
}

constexpr const char* kQrTable =
    "table(name.basename():label=NAME, zone:label=ZONE, "
    "node_count:label=NODE_COUNT, "
    "tpu.nodeSpec[0].node.acceleratorType:label=ACCELERATOR_TYPE, "
    "state.state:label=STATE)";

std::string List(const std::string& format, const json& items) {
  Result<OutputFormat> f = ParseFormat(format, kQrTable);
  EXPECT_TRUE(f.ok()) << f.status().message();
  return f.ok() ? FormatList(*f, items, kAliases) : "";
}

TEST(GcloudFormatTest, YamlAsGcloudPrintsADescribe) {
  const json qr = {
      {"name", "projects/p/locations/z/queuedResources/q"},
      {"state", {{"state", "ACTIVE"}}},
      {"createTime", "2026-01-02T03:04:05Z"},
      {"attempt", 1},
      {"spot", json::object()},
      {"tags", json::array()},
      {"nodes",
       {{{"nodeId", "q-0"}, {"hosts", {"host-1", "host-2"}}},
        {{"nodeId", "q-1"}, {"hosts", {"host-3"}}}}},
      {"metadata", {{"startup-script", "#!/bin/bash\necho hi\n"}}},
      {"odd",
       {"yes", "", "a: b", "#x", "123", "'q", "it's", " pad", "-", "x\ty"}}};
  EXPECT_EQ(ToYaml(qr),
            "attempt: 1\n"
            "createTime: '2026-01-02T03:04:05Z'\n"
            "metadata:\n"
            "  startup-script: |\n"
            "    #!/bin/bash\n"
            "    echo hi\n"
            "name: projects/p/locations/z/queuedResources/q\n"
            "nodes:\n"
            "- hosts:\n"
            "  - host-1\n"
            "  - host-2\n"
            "  nodeId: q-0\n"
            "- hosts:\n"
            "  - host-3\n"
            "  nodeId: q-1\n"
            "odd:\n"
            "- 'yes'\n"
            "- ''\n"
            "- 'a: b'\n"
            "- '#x'\n"
            "- '123'\n"
            "- '''q'\n"
            "- it's\n"
            "- ' pad'\n"
            "- '-'\n"
            "- \"x\\ty\"\n"
            "spot: {}\n"
            "state:\n"
            "  state: ACTIVE\n"
            "tags: []\n");
  EXPECT_EQ(ToYaml({{"s", "no newline\nat the end"}}),
            "s: |-\n  no newline\n  at the end\n");
}

TEST(GcloudFormatTest, DefaultTableAndItsColumns) {
  const json items = {Qr("que-res-id", "ACTIVE", 4), Qr("b", "FAILED", 2)};
  EXPECT_EQ(
      List("table", items),
      "NAME        ZONE           NODE_COUNT  ACCELERATOR_TYPE  STATE\n"
      "que-res-id  us-central1-a  4           v5litepod-16      ACTIVE\n"
      "b           us-central1-a  2           v5litepod-16      FAILED\n");
  EXPECT_EQ(List("table(name.basename(), state.state, tpu.nodeSpec[0].node."
                 "acceleratorType)",
                 items),
            "NAME        STATE   ACCELERATOR_TYPE\n"
            "que-res-id  ACTIVE  v5litepod-16\n"
            "b           FAILED  v5litepod-16\n");
  EXPECT_EQ(List("table[no-heading](name.basename())", items),
            "que-res-id\nb\n");
  EXPECT_EQ(List("table", json::array()), "");  // gcloud prints nothing
}

TEST(GcloudFormatTest, ValueCsvJsonYamlAndProjections) {
  const json items = {Qr("a", "ACTIVE", 2)};
  EXPECT_EQ(List("value(name.basename(),state.state,nodes.nodeId)", items),
            "a\tACTIVE\ta-0;a-1\n");
  EXPECT_EQ(List("value(name.segment(-1), name.segment(1), nodes[-1].nodeId,"
                 " nodes.len(), missing.key)",
                 items),
            "a\tp\ta-1\t2\t\n");
  EXPECT_EQ(List("csv(name.basename():label=id,zone)", items),
            "id,zone\na,us-central1-a\n");
  EXPECT_EQ(List("json(state.state, name.basename())", items),
            "[\n  {\n    \"name.basename()\": \"a\",\n    \"state\": {\n"
            "      \"state\": \"ACTIVE\"\n    }\n  }\n]\n");
  EXPECT_EQ(List("yaml(state.state)", items), "---\nstate:\n  state: ACTIVE\n");
  EXPECT_EQ(List("none", items), "");
  Result<OutputFormat> flat = ParseFormat("flattened");
  ASSERT_TRUE(flat.ok());
  EXPECT_EQ(FormatOne(*flat, {{"a", {{"b", 1}}}, {"list", {"x", "y"}}}, {}),
            "a.b:     1\nlist[0]: x\nlist[1]: y\n");
  // snake_case keys find camelCase fields.
  EXPECT_EQ(List("value(tpu.node_spec[0].node.accelerator_type)", items),
            "v5litepod-16\n");
  Result<OutputFormat> yaml = ParseFormat("yaml");
  ASSERT_TRUE(yaml.ok());
  EXPECT_EQ(FormatOne(*yaml, {{"state", {{"state", "ACTIVE"}}}}, {}),
            "state:\n  state: ACTIVE\n");
}

TEST(GcloudFormatTest, BadFormatsNameTheFlag) {
  for (const char* bad : {"xml", "table(", "table(a:colour=red)",
                          "value(name.upper())", "table[box]", "value"}) {
    Result<OutputFormat> f = ParseFormat(bad);
    ASSERT_FALSE(f.ok()) << bad;
    EXPECT_EQ(f.status().message().rfind("--format: '", 0), 0u)
        << f.status().message();
  }
  EXPECT_EQ(ParseFormat("value(name.upper())").status().message(),
            "--format: 'value(name.upper())' has 'name.upper()': unknown "
            "transform 'upper()': expected basename(), segment(I) or len()");
}

std::vector<std::string> Matching(const std::string& filter,
                                  const json& items) {
  Result<ResourceFilter> f = ParseFilter(filter, kAliases);
  EXPECT_TRUE(f.ok()) << filter << ": " << f.status().message();
  std::vector<std::string> names;
  if (!f.ok()) return names;
  for (const json& item : items) {
    if (f->matches(item)) {
      names.push_back(
          ValueOfKey(item, "name.basename()", {}).get<std::string>());
    }
  }
  return names;
}

TEST(GcloudFormatTest, FiltersAsGcloudReadsThem) {
  const json items = {Qr("my-qr", "ACTIVE", 2), Qr("my-qr-2", "FAILED", 3),
                      Qr("other", "ACTIVE", 2)};
  using V = std::vector<std::string>;
  // The seed's --filter=${QR_ID}: a bare word found in any value.
  EXPECT_EQ(Matching("my-qr", items), (V{"my-qr", "my-qr-2"}));
  EXPECT_EQ(Matching("MY-QR-2", items), (V{"my-qr-2"}));
  EXPECT_EQ(Matching("*/other", items), (V{"other"}));
  EXPECT_EQ(Matching("name=my-qr", items), (V{"my-qr"}));
  EXPECT_EQ(Matching("name:my-qr", items), (V{"my-qr", "my-qr-2"}));
  EXPECT_EQ(Matching("name=my-*", items), (V{"my-qr", "my-qr-2"}));
  EXPECT_EQ(Matching("state=ACTIVE", items), (V{"my-qr", "other"}));
  EXPECT_EQ(Matching("state.state!=ACTIVE", items), (V{"my-qr-2"}));
  EXPECT_EQ(Matching("-state=ACTIVE", items), (V{"my-qr-2"}));
  EXPECT_EQ(Matching("NOT state=ACTIVE OR node_count>2", items),
            (V{"my-qr-2"}));
  EXPECT_EQ(Matching("zone=us-central1-a AND node_count<3", items),
            (V{"my-qr", "other"}));
  EXPECT_EQ(Matching("(name:other OR name=my-qr) state:act*", items),
            (V{"my-qr", "other"}));
  EXPECT_EQ(Matching("name~^projects/.*/my-qr-[0-9]$", items), (V{"my-qr-2"}));
  EXPECT_EQ(Matching("nodes.nodeId=other-1", items), (V{"other"}));
  EXPECT_EQ(Matching("name:\"my-qr-2\"", items), (V{"my-qr-2"}));
  EXPECT_EQ(Matching("tpu:*", items).size(), 3u);
  EXPECT_EQ(Matching("waitingReason:*", items).size(), 0u);
  EXPECT_EQ(Matching("", items).size(), 3u);
}

TEST(GcloudFormatTest, BadFiltersAndUnknownKeys) {
  for (const char* bad :
       {"(state=ACTIVE", "name=", "name~(", "a AND", "name=\"x"}) {
    Result<ResourceFilter> f = ParseFilter(bad, kAliases);
    ASSERT_FALSE(f.ok()) << bad;
    EXPECT_EQ(f.status().message().rfind("--filter: '", 0), 0u)
        << f.status().message();
  }
  const json items = {Qr("a", "ACTIVE", 2)};
  Result<ResourceFilter> colour = ParseFilter("colour=red", kAliases);
  ASSERT_TRUE(colour.ok());
  EXPECT_EQ(CheckFilterKeys(*colour, items, kAliases, {"tier"}).message(),
            "--filter: unknown key 'colour': expected one of name, "
            "node_count, nodes, state, tier, tpu, zone");
  Result<ResourceFilter> known =
      ParseFilter("zone:us tier=spot tpu.nodeSpec:* my-word", kAliases);
  ASSERT_TRUE(known.ok());
  EXPECT_TRUE(CheckFilterKeys(*known, items, kAliases, {"tier"}).ok());
}

}  // namespace
}  // namespace multislice::cli
