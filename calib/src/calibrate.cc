#include "fsdplab/calib/calibrate.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>
#include <utility>

#include "fsdplab/calib/bench_gather_format.h"

namespace fsdplab::calib {
namespace {

// Devices per host, the largest over all outputs; nullopt when no output lists devices.
std::optional<int> GpusPerNodeFromDevices(const std::vector<NcclTestsResult>& results) {
  std::optional<int> best;
  for (const NcclTestsResult& r : results) {
    std::map<std::string, int> per_host;
    for (const NcclDevice& d : r.devices) ++per_host[d.hostname];
    for (const auto& [host, n] : per_host) best = std::max(best.value_or(0), n);
  }
  return best;
}

}  // namespace

StatusOr<Calibration> Calibrate(const CalibrateInputs& in) {
  std::vector<NcclTestsResult> results;
  std::vector<std::string> notes;
  for (const std::string& path : in.files) {
    FSDP_ASSIGN_OR_RETURN(std::vector<NcclTestsResult> blocks,
                          ReadNcclTestsBlocks(path, in.parse, &notes));
    for (NcclTestsResult& b : blocks) results.push_back(std::move(b));
  }
  const int gpus_per_node = in.gpus_per_node.value_or(GpusPerNodeFromDevices(results).value_or(8));

  // Group blocks by (collective, tier); fit each group.
  using Key = std::pair<CollectiveKind, TierKind>;
  std::map<Key, std::vector<const NcclTestsResult*>> groups;
  for (const NcclTestsResult& r : results) {
    FSDP_ASSIGN_OR_RETURN(TierKind tier, InferTier(r, in.tier, gpus_per_node));
    std::vector<const NcclTestsResult*>& g = groups[{*r.collective, tier}];
    if (!g.empty() && g.front()->ranks != r.ranks) {
      return InvalidInput(fmt::format(
          "{} {}: {} has {} ranks but {} has {}; one tier's curve is measured at one size of "
          "world: pick one block with --block N, or calibrate the files separately (or give "
          "--tier if one of them spans nodes)",
          CollectiveKindName(*r.collective), TierKindName(tier), g.front()->source,
          g.front()->ranks, r.source, r.ranks));
    }
    g.push_back(&r);
  }
  Calibration out;
  CalibratedCluster& cluster = out.cluster;
  cluster.gpus_per_node = gpus_per_node;
  cluster.compute_scale = in.compute_scale;
  cluster.world_size = 0;
  std::string& text = out.text;
  nlohmann::ordered_json fits_json = nlohmann::ordered_json::array();
  for (const auto& [key, group] : groups) {
    FSDP_ASSIGN_OR_RETURN(CollectiveFit fit, FitNcclTests(group, key.second, in.fit));
    text += FormatFit(fit) + "\n";
    fits_json.push_back(nlohmann::ordered_json::parse(FitToJson(fit)));
    cluster.world_size = std::max(cluster.world_size, fit.world_size);
    cluster.fits.push_back(std::move(fit));
  }
  nlohmann::ordered_json contention_json;
  if (in.contention_file) {
    FSDP_ASSIGN_OR_RETURN(MeasuredContention m, ReadContentionFile(*in.contention_file));
    if (m.world_size) {
      if (groups.empty()) {
        cluster.world_size = *m.world_size;
      } else if (*m.world_size != cluster.world_size) {
        return InvalidInput(fmt::format(
            "{}: world_size {} but the nccl-tests outputs measured {} ranks (the cluster's "
            "world_size); measure the contention on the same number of ranks",
            *in.contention_file, *m.world_size, cluster.world_size));
      }
    } else if (groups.empty()) {
      return InvalidInput(
          fmt::format("{}: world_size: missing, and no nccl-tests output gives the number of ranks",
                      *in.contention_file));
    }
    cluster.comm_contention = m.factors;
    std::string line = fmt::format(
        "comm contention from {}{}: all-gather x{:.3g}, reduce-scatter x{:.3g} while both run\n",
        *in.contention_file, m.statistic.empty() ? "" : fmt::format(" ({})", m.statistic),
        1 + m.factors.all_gather, 1 + m.factors.reduce_scatter);
    for (const std::string& n : m.notes) line += fmt::format("  note: {}\n", n);
    if (m.stream_wake) {
      cluster.stream_wake = m.stream_wake;
      line += fmt::format("stream wake-up from {}: {}\n", *in.contention_file,
                          DescribeStreamWake(*m.stream_wake));
    }
    text += line + "\n";
    contention_json = {{"source", *in.contention_file},
                       {"statistic", m.statistic},
                       {"all_gather", m.factors.all_gather},
                       {"reduce_scatter", m.factors.reduce_scatter},
                       {"notes", m.notes}};
  }
  if (cluster.world_size == 0) cluster.world_size = 8;
  out.cluster_json = CalibratedClusterJson(cluster);
  const DerivedTiers tiers = DeriveTierLines(cluster);
  if (!cluster.fits.empty()) {
    text += "notes:\n";
    for (const std::string& n : notes) text += fmt::format("  {}\n", n);
    for (const std::string& n : tiers.notes) text += fmt::format("  {}\n", n);
    text += "\n";
  }
  nlohmann::ordered_json doc;
  doc["fits"] = std::move(fits_json);
  doc["notes"] = notes;
  if (in.contention_file) doc["comm_contention"] = std::move(contention_json);
  doc["cluster"] = nlohmann::ordered_json::parse(out.cluster_json);
  out.doc = std::move(doc);
  return out;
}

}  // namespace fsdplab::calib
