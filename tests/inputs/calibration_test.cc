#include "fsdplab/sim/calibration.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <string>

#include "fsdplab/sim/cluster.h"
#include "fsdplab/sim/nccl_tests.h"

namespace fsdplab::sim {
namespace {

const std::string kDir = std::string(FSDPLAB_TEST_DATA_DIR) + "/nccl-tests/";

// time = (W-1)*alpha + (W-1)/W * bytes / (bw * 1e3).
double Ring(double alpha_us, double bw_GBps, int w, double bytes) {
  return (w - 1) * alpha_us + (w - 1.0) / w * bytes / (bw_GBps * 1e3);
}

// An nccl-tests table generated from one alpha-beta line.
std::string GeneratedTable(double alpha_us, double bw_GBps, int w) {
  std::string t =
      "# Collective test starting: all_gather_perf\n"
      "#  size  count  type  redop  root  time  algbw  busbw  #wrong  time  algbw  "
      "busbw  #wrong\n";
  t += "0 0 float none -1 0.90 0.00 0.00 0 0.90 0.00 0.00 0\n";  // size 0: skipped by the fit
  for (double bytes = 1024; bytes <= 1024.0 * 1024 * 1024; bytes *= 2) {
    double us = Ring(alpha_us, bw_GBps, w, bytes);
    t += fmt::format("{:.0f} {:.0f} float none -1 {:.17g} 1 1 0 {:.17g} 1 1 0\n", bytes,
                     bytes / 4 / w, us, us);
  }
  return t;
}

TEST(Calibration, RecoversAKnownLineExactly) {
  // alpha 5 us, 150 GB/s, 8 ranks: one segment, the same two numbers back.
  StatusOr<NcclTestsResult> r = ParseNcclTests(GeneratedTable(5.0, 150.0, 8), "gen.txt");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->ranks, 8);  // 1024 B = 8 ranks x 32 elements x 4 B
  StatusOr<CollectiveFit> fit = FitNcclTests(*r, TierKind::kIntra, FitOptions{});
  ASSERT_TRUE(fit.ok()) << fit.status().ToString();
  ASSERT_EQ(fit->segments.size(), 1u);
  EXPECT_NEAR(fit->segments[0].latency_us, 5.0, 1e-9);
  EXPECT_NEAR(fit->segments[0].bandwidth_GBps, 150.0, 1e-7);
  EXPECT_EQ(fit->segments[0].min_bytes, 0u);
  EXPECT_EQ(fit->segments[0].max_bytes, 1024u * 1024 * 1024);
  EXPECT_EQ(fit->points.size(), 21u);  // 2^10 .. 2^30; the size-0 row is skipped
  EXPECT_LT(fit->max_error_pct, 1e-9);
}

TEST(Calibration, RecoversTwoRegimesAndPutsTheBreakInBetween) {
  // Below 8 MiB: alpha 4 us, 50 GB/s; from 8 MiB: alpha 20 us, 300 GB/s (W = 8).
  std::vector<SizeTime> pts;
  for (Bytes b = 1024; b <= (Bytes{1} << 30); b *= 2) {
    bool big = b >= (Bytes{8} << 20);
    pts.push_back({b, Ring(big ? 20.0 : 4.0, big ? 300.0 : 50.0, 8, static_cast<double>(b))});
  }
  StatusOr<std::vector<Segment>> segs = FitSegments(pts, 8, FitOptions{});
  ASSERT_TRUE(segs.ok()) << segs.status().ToString();
  ASSERT_EQ(segs->size(), 2u);  // a third segment would not lower the (zero) error
  EXPECT_NEAR((*segs)[0].latency_us, 4.0, 1e-9);
  EXPECT_NEAR((*segs)[0].bandwidth_GBps, 50.0, 1e-7);
  EXPECT_NEAR((*segs)[1].latency_us, 20.0, 1e-7);
  EXPECT_NEAR((*segs)[1].bandwidth_GBps, 300.0, 1e-6);
  // The lines cross where 28 + 7/8 b/5e4 = 140 + 7/8 b/3e5, i.e. at b = 7,680,000 B, which
  // lies between the measured 4 MiB and 8 MiB: the boundary is there.
  EXPECT_NEAR(static_cast<double>((*segs)[0].max_bytes), 7680000.0, 1.0);
  EXPECT_EQ((*segs)[1].min_bytes, (*segs)[0].max_bytes);
  EXPECT_TRUE(ValidateSegments(*segs).ok());
}

TEST(Calibration, NoisyRowsStillGetAPartition) {
  // A noisy host reduce-scatter (times scattered 0.6x..1.6x around 60 us + b/1 GB/s): the k with
  // the smallest maximum error is not the k with the smallest RMS error, so no k is within the
  // 0.5-point tolerance of both. This used to fail with "no partition found"; now the smallest k
  // within the tolerance of the best maximum error is used, and that is never worse than one line.
  const std::vector<SizeTime> pts = {
      {262144, 352.56},      {524288, 776.34},      {1048576, 1530.54},   {2097152, 1878.56},
      {4194304, 3151.14},    {8388608, 11601.75},   {16777216, 18080.36}, {33554432, 52664.71},
      {67108864, 100227.66}, {134217728, 172112.67}};
  StatusOr<std::vector<Segment>> segs = FitSegments(pts, 2, FitOptions{});
  ASSERT_TRUE(segs.ok()) << segs.status().ToString();
  EXPECT_TRUE(ValidateSegments(*segs).ok());
  FitOptions one;
  one.max_segments = 1;
  StatusOr<std::vector<Segment>> line = FitSegments(pts, 2, one);
  ASSERT_TRUE(line.ok()) << line.status().ToString();
  auto max_error = [&](const std::vector<Segment>& s) {
    double worst = 0;
    for (const SizeTime& p : pts) {
      worst = std::max(worst, std::fabs(PredictCollectiveUs(s, p.bytes, 2) / p.time_us - 1));
    }
    return worst;
  };
  EXPECT_LE(max_error(*segs), max_error(*line) + 0.005);
}

// On the real 8xH100 all-gather (NCCL ring, 128 B .. 8 GiB) one line is far off near the
// protocol switch while 4 segments follow the curve. Measured with this code (out-of-place):
// one line: max |error| 19.47%; 4 segments: max |error| 5.53%.
TEST(Calibration, PiecewiseBeatsOneLineOnRealH100Data) {
  StatusOr<NcclTestsResult> r = ReadNcclTestsFile(kDir + "ag_8xH100_together-ring.txt");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  FitOptions one;
  one.max_segments = 1;
  StatusOr<CollectiveFit> line = FitNcclTests(*r, TierKind::kIntra, one);
  StatusOr<CollectiveFit> pw = FitNcclTests(*r, TierKind::kIntra, FitOptions{});
  ASSERT_TRUE(line.ok() && pw.ok());
  EXPECT_EQ(pw->points.size(), 27u);
  EXPECT_GT(line->max_error_pct, 19.0);
  EXPECT_LT(pw->max_error_pct, 6.0);
  EXPECT_LT(pw->max_error_pct, line->max_error_pct / 2);
  EXPECT_TRUE(ValidateSegments(pw->segments).ok());
}

TEST(Calibration, PiecewiseOnEveryRealFile) {
  // Every real output calibrates with at most 4 segments to within 13% at every size. Measured
  // max |error|: ag 8xH100 5.53%, rs 8xH100 12.76% (noisy latency-bound rows: 41.94 us at 128 B
  // against 34-36 us around it), ag 8xA100 5.61%, rs 8xA100 5.91%, ag 16xH100 4.12%.
  for (const char* name :
       {"ag_8xH100_together-ring.txt", "rs_8xH100_together-ring.txt",
        "ag_8xA100-40GB_superbench-oldformat.txt", "rs_8xA100-40GB_superbench-oldformat.txt",
        "ag_16xH100_2node_gke-a3mega-tcpxo_cluster-toolkit.txt"}) {
    StatusOr<NcclTestsResult> r = ReadNcclTestsFile(kDir + name);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    StatusOr<TierKind> tier = InferTier(*r, std::nullopt, 8);
    ASSERT_TRUE(tier.ok());
    StatusOr<CollectiveFit> fit = FitNcclTests(*r, *tier, FitOptions{});
    ASSERT_TRUE(fit.ok()) << name << ": " << fit.status().ToString();
    EXPECT_LE(fit->segments.size(), 4u) << name;
    EXPECT_LT(fit->max_error_pct, 13.0) << name;
    for (const Segment& s : fit->segments) {
      EXPECT_GE(s.latency_us, 0) << name;
      EXPECT_GT(s.bandwidth_GBps, 0) << name;
    }
  }
}

TEST(Calibration, PredictUsesTheRingFormulaOfTheRightSegment) {
  std::vector<Segment> segs = {{0, 1000000, 10.0, 100.0}, {1000000, 8000000, 20.0, 200.0}};
  // 8,000,000 B over 8 ranks is past the last max: the last segment,
  // 7*20 + 7/8 * 8e6 / 2e5 = 140 + 35 = 175 us.
  EXPECT_DOUBLE_EQ(PredictCollectiveUs(segs, 8000000, 8), 175.0);
  // 800,000 B: the first segment, 7*10 + 7/8 * 8e5 / 1e5 = 70 + 7 = 77 us.
  EXPECT_DOUBLE_EQ(PredictCollectiveUs(segs, 800000, 8), 77.0);
  // Exactly 1,000,000 B starts the second segment: 7*20 + 7/8 * 1e6 / 2e5 = 144.375 us.
  EXPECT_DOUBLE_EQ(PredictCollectiveUs(segs, 1000000, 8), 144.375);
  // Another world size uses the same line: W = 2, 1e6 B: 20 + 1/2 * 1e6 / 2e5 = 22.5 us.
  EXPECT_DOUBLE_EQ(PredictCollectiveUs(segs, 1000000, 2), 22.5);
  EXPECT_EQ(PredictCollectiveUs(segs, 0, 8), 0.0);        // nothing to move
  EXPECT_EQ(PredictCollectiveUs(segs, 1000000, 1), 0.0);  // one rank
  EXPECT_EQ(PredictCollectiveUs({}, 1000000, 8), 0.0);
}

TEST(Calibration, ValidateSegmentsNamesTheProblem) {
  EXPECT_FALSE(ValidateSegments({}).ok());
  Status s = ValidateSegments({{0, 100, 1.0, 10.0}, {200, 300, 1.0, 10.0}});
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("segments[1]"), std::string::npos) << s.message();
  s = ValidateSegments({{0, 100, -1.0, 10.0}});
  EXPECT_NE(s.message().find("latency_us"), std::string::npos) << s.message();
  s = ValidateSegments({{5, 100, 1.0, 10.0}});
  EXPECT_NE(s.message().find("start at min_bytes 0"), std::string::npos) << s.message();
}

TEST(Calibration, TierFromHostsFlagOrSize) {
  NcclTestsResult one_host;
  one_host.source = "a";
  one_host.ranks = 8;
  one_host.devices = {{0, "h0", 0}, {1, "h0", 1}};
  NcclTestsResult two_hosts = one_host;
  two_hosts.devices = {{0, "h0", 0}, {1, "h1", 0}};
  NcclTestsResult none;
  none.ranks = 16;
  EXPECT_EQ(*InferTier(one_host, std::nullopt, 8), TierKind::kIntra);
  EXPECT_EQ(*InferTier(two_hosts, std::nullopt, 8), TierKind::kInter);
  EXPECT_EQ(*InferTier(none, std::nullopt, 8), TierKind::kInter);   // 16 ranks > 8 per node
  EXPECT_EQ(*InferTier(none, std::nullopt, 16), TierKind::kIntra);  // fits one 16-GPU node
  EXPECT_EQ(*InferTier(none, TierKind::kIntra, 8), TierKind::kIntra);
  EXPECT_FALSE(InferTier(two_hosts, TierKind::kIntra, 8).ok());  // contradicts the hosts
}

TEST(Calibration, ClusterFileSchemaAndRoundTrip) {
  StatusOr<NcclTestsResult> ag = ReadNcclTestsFile(kDir + "ag_8xH100_together-ring.txt");
  StatusOr<NcclTestsResult> rs = ReadNcclTestsFile(kDir + "rs_8xH100_together-ring.txt");
  ASSERT_TRUE(ag.ok() && rs.ok());
  CalibratedCluster cluster;
  cluster.world_size = 8;
  cluster.gpus_per_node = 8;
  StatusOr<CollectiveFit> f1 = FitNcclTests(*ag, TierKind::kIntra, FitOptions{});
  StatusOr<CollectiveFit> f2 = FitNcclTests(*rs, TierKind::kIntra, FitOptions{});
  ASSERT_TRUE(f1.ok() && f2.ok());
  cluster.fits = {*f1, *f2};
  std::string text = CalibratedClusterJson(cluster);
  nlohmann::json j = nlohmann::json::parse(text);
  EXPECT_EQ(j["world_size"], 8);
  EXPECT_EQ(j["gpus_per_node"], 8);
  EXPECT_EQ(j["compute_scale"], 1.0);
  // The intra line: latency of the smallest-size segment, bandwidth of the largest-size one.
  EXPECT_DOUBLE_EQ(j["intra"]["latency_us"].get<double>(), f1->segments.front().latency_us);
  EXPECT_DOUBLE_EQ(j["intra"]["bandwidth_GBps"].get<double>(), f1->segments.back().bandwidth_GBps);
  // Not measured: the simulator's defaults.
  EXPECT_EQ(j["inter"]["bandwidth_GBps"], 45.0);
  EXPECT_EQ(j["inter"]["latency_us"], 20.0);
  ASSERT_TRUE(j["calibration"]["all_gather"]["intra"].is_array());
  EXPECT_EQ(j["calibration"]["all_gather"]["intra"][0]["min_bytes"], 0);
  EXPECT_FALSE(j["calibration"]["all_gather"].contains("inter"));
  StatusOr<std::vector<Segment>> back =
      ReadCalibrationSegments(text, CollectiveKind::kReduceScatter, TierKind::kIntra);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(*back, f2->segments);
  // A null max_bytes on the last segment means unbounded.
  StatusOr<std::vector<Segment>> unbounded = ReadCalibrationSegments(
      R"({"calibration": {"all_gather": {"inter": [
          {"min_bytes": 0, "max_bytes": 65536, "latency_us": 8, "bandwidth_GBps": 5},
          {"min_bytes": 65536, "max_bytes": null, "latency_us": 12, "bandwidth_GBps": 40}]}}})",
      CollectiveKind::kAllGather, TierKind::kInter);
  ASSERT_TRUE(unbounded.ok()) << unbounded.status().ToString();
  EXPECT_EQ(unbounded->size(), 2u);
}

// The simulator reads back what calibrate writes, contention included; without a measurement
// the key is absent and the simulator's cluster has none.
TEST(Calibration, ClusterFileCommContentionReadsBack) {
  CalibratedCluster cluster;
  cluster.world_size = 2;
  cluster.gpus_per_node = 2;
  StatusOr<Cluster> plain = ParseClusterJson(CalibratedClusterJson(cluster));
  ASSERT_TRUE(plain.ok()) << plain.status().ToString();
  EXPECT_FALSE(plain->comm_contention.has_value());

  cluster.comm_contention = CommContention{0.48, 0.41};
  std::string text = CalibratedClusterJson(cluster);
  nlohmann::json j = nlohmann::json::parse(text);
  EXPECT_DOUBLE_EQ(j["comm_contention"]["all_gather"].get<double>(), 0.48);
  EXPECT_DOUBLE_EQ(j["comm_contention"]["reduce_scatter"].get<double>(), 0.41);
  StatusOr<Cluster> back = ParseClusterJson(text);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  ASSERT_TRUE(back->comm_contention.has_value());
  EXPECT_EQ(*back->comm_contention, *cluster.comm_contention);
  EXPECT_EQ(back->world_size, 2);
}

TEST(Calibration, RejectsWhatCannotBeFitted) {
  EXPECT_FALSE(FitSegments({{1024, 10.0}, {2048, 11.0}}, 1, FitOptions{}).ok());  // one rank
  EXPECT_FALSE(FitSegments({{0, 1.0}, {1024, 10.0}}, 8, FitOptions{}).ok());      // one size left
  EXPECT_FALSE(FitSegments({{1024, 0.0}, {2048, 11.0}}, 8, FitOptions{}).ok());   // zero time
}

}  // namespace
}  // namespace fsdplab::sim
