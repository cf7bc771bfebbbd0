#include "runtime/hang_digest.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace multislice::runtime {
namespace {

// A device that issued `signatures` (1-based sequence numbers), through
// DeviceProgress itself, with the collectives from `pending_from` on (0:
// none) still in flight.
DeviceHangState Device(int device, const std::vector<std::string>& signatures,
                       uint64_t pending_from = 0, int program = 0) {
  DeviceProgress progress(device);
  for (size_t i = 0; i < signatures.size(); ++i) {
    const uint64_t seq = i + 1;
    progress.Issued(seq, signatures[i]);
    if (pending_from == 0 || seq < pending_from) progress.Finished(seq);
  }
  if (pending_from > 0) progress.PhaseStarted(pending_from, "dcn all-reduce");
  return {progress.Snapshot(), program};
}

WorkerHangReport Worker(int process, std::vector<DeviceHangState> devices) {
  return {process, "worker " + std::to_string(process), "host", devices};
}

const std::vector<std::string> kNames = {"worker 0", "worker 1", "worker 2",
                                         "worker 3"};
const std::vector<std::string> kProgram = {
    "all_gather[fsdp]", "grads", "loss-and-norm", "all_gather[fsdp]", "grads"};

std::vector<int> Culprits(const HangDigest& d) {
  std::vector<int> out;
  for (const HangCulprit& c : d.culprits) out.push_back(c.process);
  return out;
}

TEST(HangDigestTest, SignaturesDropTheSequenceNumber) {
  EXPECT_EQ(SignatureOf("all_reduce[data,fsdp]#12 loss"),
            "all_reduce[data,fsdp] loss");
  EXPECT_EQ(SignatureOf("barrier[data]#7"), "barrier[data]");
  EXPECT_EQ(SignatureOf("plain"), "plain");
}

TEST(HangDigestTest, AWorkerThatDoesNotReportIsTheCulprit) {
  // Workers 0 and 2 wait in #5 (worker 0 on worker 2, which waits on the
  // stopped worker 1): the culprit is 1, not the peer 0 waited on.
  const HangDigest d = AnalyzeHang({Worker(0, {Device(0, kProgram, 5)}),
                                    Worker(2, {Device(2, kProgram, 5)})},
                                   {0, 1, 2}, kNames, 5, 3);
  EXPECT_EQ(d.cause, "hang");
  EXPECT_EQ(Culprits(d), std::vector<int>{1});
  EXPECT_EQ(d.silent, std::vector<int>{1});
  EXPECT_EQ(d.waited_in, "grads");
  EXPECT_FALSE(d.mismatch);
}

TEST(HangDigestTest, DifferentSequencesAreAProgramMismatchAtTheFirstOne) {
  std::vector<std::string> skipped = kProgram;
  skipped.erase(skipped.begin() + 2);  // worker 2 skipped #3
  const HangDigest d = AnalyzeHang(
      {Worker(0, {Device(0, kProgram, 3)}), Worker(1, {Device(1, kProgram, 3)}),
       Worker(2, {Device(2, skipped, 4)})},
      {0, 1, 2}, kNames, 5, 3);
  EXPECT_EQ(d.cause, "program mismatch");
  ASSERT_TRUE(d.mismatch);
  EXPECT_EQ(d.mismatch->sequence, 3u);
  EXPECT_EQ(d.mismatch->expected, "loss-and-norm");
  EXPECT_EQ(d.mismatch->issued, "all_gather[fsdp]");
  EXPECT_FALSE(d.mismatch->at_or_before);
  EXPECT_EQ(Culprits(d), std::vector<int>{2});
}

TEST(HangDigestTest, DevicesOfDifferentStagesAreNotCompared) {
  const std::vector<std::string> other = {"send", "recv", "send"};
  const HangDigest d = AnalyzeHang(
      {Worker(0, {Device(0, kProgram, 5, 0), Device(1, other, 3, 1)})}, {0},
      kNames, 5, 3);
  EXPECT_FALSE(d.mismatch);
  EXPECT_EQ(d.cause, "hang");
}

TEST(HangDigestTest, AWorkerStillComputingIsBehindTheOthers) {
  const std::vector<std::string> behind(kProgram.begin(), kProgram.end() - 1);
  const HangDigest d = AnalyzeHang(
      {Worker(0, {Device(0, kProgram, 5)}), Worker(1, {Device(1, kProgram, 5)}),
       Worker(3, {Device(3, behind)})},
      {0, 1, 3}, kNames, 5, 3);
  EXPECT_EQ(d.cause, "hang");
  EXPECT_EQ(Culprits(d), std::vector<int>{3});
  EXPECT_NE(d.culprits[0].reason.find("has not issued collective #5"),
            std::string::npos)
      << d.culprits[0].reason;
}

TEST(HangDigestTest, NoCulpritWhenEveryoneWaitsInTheSameCollective) {
  const HangDigest d = AnalyzeHang({Worker(0, {Device(0, kProgram, 5)}),
                                    Worker(1, {Device(1, kProgram, 5)})},
                                   {0, 1}, kNames, 5, 3);
  EXPECT_TRUE(d.culprits.empty());
  EXPECT_NE(FormatHangDigest(d).find("no culprit found"), std::string::npos);
}

TEST(HangDigestTest, ReportsAndDigestsSurviveJson) {
  const WorkerHangReport w = Worker(1, {Device(4, kProgram, 4)});
  Result<WorkerHangReport> back = ParseWorkerHangReport(ToJson(w).dump());
  ASSERT_TRUE(back.ok()) << back.status().message();
  ASSERT_EQ(back->devices.size(), 1u);
  EXPECT_EQ(back->devices[0].progress.hash, w.devices[0].progress.hash);
  EXPECT_EQ(back->devices[0].progress.pending->what, "all_gather[fsdp]");

  std::vector<std::string> skipped = kProgram;
  skipped.erase(skipped.begin() + 2);
  HangDigest d = AnalyzeHang(
      {Worker(0, {Device(0, kProgram, 3)}), Worker(2, {Device(2, skipped, 4)})},
      {0, 1, 2}, kNames, 5, 3);
  d.file = "/run/hang_digest.json";
  Result<HangDigest> again = ParseHangDigest(ToJson(d).dump());
  ASSERT_TRUE(again.ok()) << again.status().message();
  EXPECT_EQ(ToJson(*again), ToJson(d));
  EXPECT_EQ(FormatHangDigest(*again), FormatHangDigest(d));
}

TEST(HangDigestTest, AReportThatIsNotOneIsRefused) {
  for (
      const std::string text :
      {"", "{", "[]", R"({"process": 1})",
       R"({"process": 1, "name": "w", "host": "h", "devices": [{"device": 0}]})",
       R"({"process": "1", "name": "w", "host": "h", "devices": []})"}) {
    EXPECT_FALSE(ParseWorkerHangReport(text).ok()) << text;
    EXPECT_FALSE(ParseHangDigest(text).ok()) << text;
  }
}

}  // namespace
}  // namespace multislice::runtime
