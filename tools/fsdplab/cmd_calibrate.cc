// fsdplab calibrate: fit the collective cost model to nccl-tests output, write a cluster file.
#include <fmt/format.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <tuple>
#include <utility>

#include "cli_common.h"
#include "commands.h"
#include "fsdplab/core/file_util.h"
#include "fsdplab/sim/calibration.h"
#include "fsdplab/sim/nccl_tests.h"

namespace fsdplab::cli {
namespace {

constexpr std::string_view kUsage =
    "fsdplab calibrate FILE... [--tier intra|inter] [--ranks N] [--gpus-per-node N] "
    "[--segments K] [--contention BENCH.json] [-o cluster.json] [--json]";
constexpr std::string_view kDescription =
    "Reads all_gather_perf / reduce_scatter_perf output of nccl-tests (the text table or the JSON\n"
    "file of nccl-tests 2.19+), fits the ring alpha-beta model piecewise over message size, "
    "prints\n"
    "measured vs fitted time per size with the error, and writes a cluster file for\n"
    "`fsdplab simulate --cluster`. The collective, the number of ranks and the tier come from the\n"
    "file when it says them (device list, `Collective test starting`, file name); the flags give\n"
    "them when it does not. --contention adds the communication contention measured by\n"
    "`fsdplab bench-gather --op concurrent -J BENCH.json` (how much slower an all-gather and a\n"
    "reduce-scatter run while both are in progress) to the cluster file; given alone, it writes\n"
    "a cluster file with the default link lines and that contention.";

// Devices per host, the largest over all outputs; nullopt when no output lists devices.
std::optional<int> GpusPerNodeFromDevices(const std::vector<sim::NcclTestsResult>& results) {
  std::optional<int> best;
  for (const sim::NcclTestsResult& r : results) {
    std::map<std::string, int> per_host;
    for (const sim::NcclDevice& d : r.devices) ++per_host[d.hostname];
    for (const auto& [host, n] : per_host) best = std::max(best.value_or(0), n);
  }
  return best;
}

// The contention measured by `fsdplab bench-gather --op concurrent -J FILE`.
struct MeasuredContention {
  sim::CommContention factors;
  std::optional<int> world_size;
  std::string statistic;           // how the file summarised its rows (bench-gather: time-weighted)
  std::vector<std::string> notes;  // values clamped to 0
};

// Reads the bench-gather JSON (format "fsdplab.bench_gather", op "concurrent"); errors name the
// file and the field.
StatusOr<MeasuredContention> ReadContentionFile(const std::string& path) {
  using nlohmann::json;
  FSDP_ASSIGN_OR_RETURN(std::string text, ReadFile(path));
  json doc = json::parse(text, nullptr, /*allow_exceptions=*/false);
  auto bad = [&](std::string_view what) {
    return InvalidInput(
        fmt::format("{}: {} (expected the -J output of `fsdplab bench-gather --op "
                    "concurrent`)",
                    path, what));
  };
  if (doc.is_discarded()) return bad("not valid JSON");
  if (!doc.is_object()) return bad("expected a JSON object");
  auto string_field = [&](std::string_view key) -> std::optional<std::string> {
    auto it = doc.find(std::string(key));
    if (it == doc.end() || !it->is_string()) return std::nullopt;
    return it->get<std::string>();
  };
  if (std::optional<std::string> f = string_field("format"); f != "fsdplab.bench_gather") {
    return bad(fmt::format("format: '{}', not fsdplab.bench_gather", f.value_or("(missing)")));
  }
  if (auto it = doc.find("version"); it != doc.end() && *it != 1) {
    return bad(fmt::format("version: {} (this fsdplab reads version 1)", it->dump()));
  }
  if (std::optional<std::string> op = string_field("op"); op != "concurrent") {
    return bad(fmt::format("op: '{}', not concurrent (only --op concurrent measures contention)",
                           op.value_or("(missing)")));
  }
  MeasuredContention m;
  if (auto it = doc.find("world_size"); it != doc.end()) {
    if (!it->is_number_integer() || it->get<std::int64_t>() < 1 ||
        it->get<std::int64_t>() > std::numeric_limits<int>::max()) {
      return bad(fmt::format("world_size: expected a positive integer, got {}", it->dump()));
    }
    m.world_size = static_cast<int>(it->get<std::int64_t>());
  }
  // Results that were wrong say nothing about the time correct ones take.
  if (auto rows = doc.find("rows"); rows != doc.end() && rows->is_array()) {
    for (std::size_t i = 0; i < rows->size(); ++i) {
      const json& row = (*rows)[i];
      if (row.is_object() && row.contains("wrong") && row["wrong"].is_number() &&
          row["wrong"].get<double>() > 0) {
        return bad(fmt::format("rows[{}].wrong: {} elements differ from the expected values", i,
                               row["wrong"].dump()));
      }
    }
  }
  auto cc = doc.find("comm_contention");
  if (cc == doc.end()) return bad("comm_contention: missing");
  if (!cc->is_object()) return bad("comm_contention: expected an object");
  if (auto st = cc->find("statistic"); st != cc->end() && st->is_string()) {
    m.statistic = st->get<std::string>();
  }
  for (auto [key, target] : {std::pair{"all_gather", &m.factors.all_gather},
                             std::pair{"reduce_scatter", &m.factors.reduce_scatter}}) {
    auto v = cc->find(key);
    if (v == cc->end()) return bad(fmt::format("comm_contention.{}: missing", key));
    if (!v->is_number()) {
      return bad(fmt::format("comm_contention.{}: expected a number, got {}", key, v->dump()));
    }
    double d = v->get<double>();
    if (!std::isfinite(d)) return bad(fmt::format("comm_contention.{}: not finite", key));
    // A collective that ran alone and together at the same speed measures a slowdown around 0,
    // and timing noise puts half of such measurements below it. Running beside another
    // collective cannot make one faster, so a negative value is noise: the simulator gets 0.
    if (d < 0) {
      m.notes.push_back(fmt::format(
          "{}: comm_contention.{} {:.4g} is negative (timing noise: running beside the other "
          "collective cannot speed it up); using 0",
          path, key, d));
      d = 0;
    }
    *target = d;
  }
  return m;
}

Status Run(const Args& args) {
  const std::optional<std::string> contention_file = args.Get("--contention");
  if (args.positionals().empty() && !contention_file) {
    return UsageError("give at least one nccl-tests output file (or --contention FILE)");
  }
  sim::NcclTestsOptions parse_opts;
  if (auto v = args.Get("--ranks")) {
    FSDP_ASSIGN_OR_RETURN(std::int64_t n, ParseInt(*v, "--ranks"));
    if (n < 2) return UsageError("--ranks: a collective needs at least 2 ranks");
    parse_opts.ranks = static_cast<int>(n);
  }
  if (auto v = args.Get("--collective")) {
    std::optional<CollectiveKind> kind = ParseCollectiveKind(*v);
    if (!kind) return UsageError(fmt::format("--collective: unknown collective '{}'", *v));
    parse_opts.collective = kind;
  }
  std::optional<sim::TierKind> tier_flag;
  if (auto v = args.Get("--tier")) {
    tier_flag = sim::ParseTierKind(*v);
    if (!tier_flag) return UsageError(fmt::format("--tier: expected intra or inter, got '{}'", *v));
  }
  sim::FitOptions fit_opts;
  fit_opts.in_place = args.Has("--in-place");
  if (auto v = args.Get("--segments")) {
    FSDP_ASSIGN_OR_RETURN(std::int64_t k, ParseInt(*v, "--segments"));
    if (k < 1 || k > 16) return UsageError("--segments: expected 1 to 16");
    fit_opts.max_segments = static_cast<int>(k);
  }
  double compute_scale = 1.0;
  if (auto v = args.Get("--compute-scale")) {
    FSDP_ASSIGN_OR_RETURN(compute_scale, ParseDouble(*v, "--compute-scale"));
    if (!(compute_scale > 0)) return UsageError("--compute-scale: must be positive");
  }

  std::vector<sim::NcclTestsResult> results;
  for (const std::string& path : args.positionals()) {
    FSDP_ASSIGN_OR_RETURN(sim::NcclTestsResult r, sim::ReadNcclTestsFile(path, parse_opts));
    if (!r.collective) {
      return InvalidInput(fmt::format(
          "{}: cannot tell which collective this is; give --collective all_gather|reduce_scatter",
          path));
    }
    results.push_back(std::move(r));
  }
  std::optional<int> gpn_from_devices = GpusPerNodeFromDevices(results);
  int gpus_per_node = gpn_from_devices.value_or(8);
  if (auto v = args.Get("--gpus-per-node")) {
    FSDP_ASSIGN_OR_RETURN(std::int64_t g, ParseInt(*v, "--gpus-per-node"));
    if (g < 1) return UsageError("--gpus-per-node: must be positive");
    gpus_per_node = static_cast<int>(g);
  }

  // Group outputs by (collective, tier, ranks); fit each group.
  using Key = std::tuple<CollectiveKind, sim::TierKind, int>;
  std::map<Key, std::vector<const sim::NcclTestsResult*>> groups;
  for (const sim::NcclTestsResult& r : results) {
    FSDP_ASSIGN_OR_RETURN(sim::TierKind tier, sim::InferTier(r, tier_flag, gpus_per_node));
    groups[{*r.collective, tier, r.ranks}].push_back(&r);
  }
  std::set<std::pair<CollectiveKind, sim::TierKind>> seen;
  sim::CalibratedCluster cluster;
  cluster.gpus_per_node = gpus_per_node;
  cluster.compute_scale = compute_scale;
  cluster.world_size = 0;
  std::string text;
  nlohmann::ordered_json fits_json = nlohmann::ordered_json::array();
  for (const auto& [key, group] : groups) {
    auto [kind, tier, ranks] = key;
    if (!seen.insert({kind, tier}).second) {
      return InvalidInput(
          fmt::format("{} {}: outputs with different numbers of ranks; calibrate them separately",
                      CollectiveKindName(kind), sim::TierKindName(tier)));
    }
    FSDP_ASSIGN_OR_RETURN(sim::CollectiveFit fit, sim::FitNcclTests(group, tier, fit_opts));
    sim::FitOptions one = fit_opts;
    one.max_segments = 1;
    FSDP_ASSIGN_OR_RETURN(sim::CollectiveFit line, sim::FitNcclTests(group, tier, one));
    text += sim::FormatFit(fit);
    text += fmt::format("  (one line over all sizes: max |error| {:.2f}%, median {:.2f}%)\n\n",
                        line.max_error_pct, line.median_error_pct);
    nlohmann::ordered_json fj = nlohmann::ordered_json::parse(sim::FitToJson(fit));
    fj["single_line_max_error_pct"] = line.max_error_pct;
    fits_json.push_back(std::move(fj));
    cluster.world_size = std::max(cluster.world_size, ranks);
    cluster.fits.push_back(std::move(fit));
  }
  nlohmann::ordered_json contention_json;
  if (contention_file) {
    FSDP_ASSIGN_OR_RETURN(MeasuredContention m, ReadContentionFile(*contention_file));
    if (m.world_size) {
      if (groups.empty()) {
        cluster.world_size = *m.world_size;
      } else if (*m.world_size != cluster.world_size) {
        return InvalidInput(fmt::format(
            "{}: world_size {} but the nccl-tests outputs measured {} ranks (the cluster's "
            "world_size); measure the contention on the same number of ranks",
            *contention_file, *m.world_size, cluster.world_size));
      }
    } else if (groups.empty()) {
      return InvalidInput(
          fmt::format("{}: world_size: missing, and no nccl-tests output gives the number of ranks",
                      *contention_file));
    }
    cluster.comm_contention = m.factors;
    std::string line = fmt::format(
        "comm contention from {}{}: all-gather x{:.3g}, reduce-scatter x{:.3g} while both run\n",
        *contention_file, m.statistic.empty() ? "" : fmt::format(" ({})", m.statistic),
        1 + m.factors.all_gather, 1 + m.factors.reduce_scatter);
    for (const std::string& n : m.notes) line += fmt::format("  note: {}\n", n);
    text += line + "\n";
    contention_json = {{"source", *contention_file},
                       {"statistic", m.statistic},
                       {"all_gather", m.factors.all_gather},
                       {"reduce_scatter", m.factors.reduce_scatter},
                       {"notes", m.notes}};
  }
  std::string cluster_json = sim::CalibratedClusterJson(cluster);
  if (auto out = args.Get("-o")) FSDP_RETURN_IF_ERROR(WriteFileAtomic(*out, cluster_json));

  if (args.Has("--json")) {
    nlohmann::ordered_json doc;
    doc["fits"] = std::move(fits_json);
    if (contention_file) doc["comm_contention"] = std::move(contention_json);
    doc["cluster"] = nlohmann::ordered_json::parse(cluster_json);
    fmt::print("{}\n", doc.dump(2));
  } else {
    fmt::print("{}", text);
    if (auto out = args.Get("-o")) {
      fmt::print("cluster file written to {}\n", *out);
    } else {
      fmt::print("cluster file (write it with -o FILE):\n{}", cluster_json);
    }
  }
  return Status::Ok();
}

}  // namespace

int RunCalibrate(const Argv& argv) {
  Args args(argv);
  args.Declare("--tier", ArgKind::kValue,
               "intra (all ranks on one node) or inter (ranks span nodes); default: from the "
               "device list's hostnames, else from --gpus-per-node",
               "TIER");
  args.Declare("--ranks", ArgKind::kValue, "number of ranks when the output does not show it", "N");
  args.Declare("--collective", ArgKind::kValue,
               "all_gather or reduce_scatter when neither the output nor its name says it", "C");
  args.Declare("--gpus-per-node", ArgKind::kValue,
               "GPUs per node (default: from the device list, else 8)", "N");
  args.Declare("--segments", ArgKind::kValue, "at most K segments per fit (default 4)", "K");
  args.Declare("--in-place", ArgKind::kSwitch, "fit the in-place times (default out-of-place)");
  args.Declare("--compute-scale", ArgKind::kValue, "compute_scale of the cluster file (1.0)", "X");
  args.Declare("--contention", ArgKind::kValue,
               "the -J output of `fsdplab bench-gather --op concurrent`: its comm_contention "
               "(all-gather and reduce-scatter slowdown while both run) goes to the cluster file",
               "FILE");
  args.Declare("-o", ArgKind::kValue, "write the cluster file to FILE", "FILE");
  args.Declare("--json", ArgKind::kSwitch, "print the fits and the cluster as JSON");
  if (Status s = args.Parse(); !s.ok()) return Fail("calibrate", s);
  if (args.help()) return PrintHelp(kUsage, kDescription, args);
  if (Status s = Run(args); !s.ok()) return Fail("calibrate", s);
  return 0;
}

}  // namespace fsdplab::cli
