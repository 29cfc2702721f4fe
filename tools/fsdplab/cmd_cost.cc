// fsdplab cost: the time of one collective at given sizes under a cluster file, and which tier and
// curve segment (or line) gave it.
//
//   fsdplab cost --cluster c.json --collective all_gather --world-size 16 --bytes 1M,64M,1G
#include <fmt/format.h>

#include <string>
#include <vector>

#include "cli_common.h"
#include "commands.h"
#include "fsdplab/sim/cluster.h"
#include "fsdplab/sim/cost_table.h"

namespace fsdplab::cli {
namespace {

constexpr std::string_view kUsage =
    "fsdplab cost --cluster FILE --collective all_gather|reduce_scatter|all_reduce "
    "[--world-size W] --bytes SIZE[,SIZE...] [--json]";
constexpr std::string_view kDescription =
    "Prints the simulator's time of one collective over W ranks for each size (the full,\n"
    "unsharded buffer: the all-gather output, the reduce-scatter input), its algbw = size / time\n"
    "and busbw = algbw x (W-1)/W (x 2(W-1)/W for all_reduce), and where the time came from: the\n"
    "tier (intra, inter, or inter+intra for the hierarchical model), the calibrated curve and its\n"
    "segment (latency below the smallest measured size, asymptotic bandwidth beyond the largest),\n"
    "or the tier line it fell back to, and the band around the time: the range the calibration's\n"
    "own cross-validated error allows (low .. high; the time itself where the model has no band:\n"
    "tier lines, old cluster files). Sizes take suffixes K M G (powers of 1024).";

std::vector<std::string> SplitCommas(const std::string& s) {
  std::vector<std::string> out;
  std::size_t pos = 0;
  while (pos <= s.size()) {
    std::size_t comma = s.find(',', pos);
    if (comma == std::string::npos) comma = s.size();
    if (comma > pos) out.push_back(s.substr(pos, comma - pos));
    pos = comma + 1;
  }
  return out;
}

Status Run(const Args& args) {
  if (!args.positionals().empty()) {
    return UsageError(fmt::format("unexpected argument '{}'", args.positionals().front()));
  }
  std::optional<std::string> file = args.Get("--cluster");
  if (!file)
    return UsageError("--cluster FILE is required (a cluster file: `fsdplab calibrate -o`)");
  std::optional<std::string> kind_text = args.Get("--collective");
  if (!kind_text) {
    return UsageError("--collective is required (all_gather, reduce_scatter or all_reduce)");
  }
  std::optional<CollectiveKind> kind = ParseCollectiveKind(*kind_text);
  if (!kind) {
    return UsageError(fmt::format(
        "--collective: unknown collective '{}' (all_gather, reduce_scatter, all_reduce)",
        *kind_text));
  }
  std::optional<std::string> bytes_text = args.Get("--bytes");
  if (!bytes_text) return UsageError("--bytes is required, e.g. --bytes 1M,64M,1G");
  std::vector<Bytes> sizes;
  for (const std::string& part : SplitCommas(*bytes_text)) {
    FSDP_ASSIGN_OR_RETURN(std::uint64_t b, ParseSize(part, "--bytes"));
    sizes.push_back(b);
  }
  if (sizes.empty()) return UsageError("--bytes: no size given");
  FSDP_ASSIGN_OR_RETURN(sim::Cluster cluster, sim::ReadClusterFile(*file));
  int world = cluster.world_size;
  if (auto v = args.Get("--world-size")) {
    FSDP_ASSIGN_OR_RETURN(std::int64_t w, ParseInt(*v, "--world-size"));
    if (w < 1 || w > (1 << 24)) return UsageError("--world-size: must be in 1..16777216");
    world = static_cast<int>(w);
  }
  const std::vector<sim::CostRow> rows = sim::CostTable(cluster, *kind, sizes, world);
  if (args.Has("--json")) {
    fmt::print("{}\n", sim::CostTableJson(cluster, *kind, world, rows, *file));
    return Status::Ok();
  }
  std::string text = fmt::format("{} over {} ranks ({} per node), cluster {}\n",
                                 CollectiveKindName(*kind), world, cluster.gpus_per_node, *file);
  text += fmt::format("  {:>14}  {:>12}  {:>23}  {:>11}  {:>11}  {:<11}  {}\n", "size (B)",
                      "time us", "band us", "algbw GB/s", "busbw GB/s", "tier", "from");
  for (const sim::CostRow& r : rows) {
    const sim::CollectiveCost& c = r.cost;
    text += fmt::format("  {:>14}  {:>12.2f}  {:>23}  {:>11.2f}  {:>11.2f}  {:<11}  {}: {}\n",
                        r.bytes, c.time_us, fmt::format("{:.2f} .. {:.2f}", c.low_us, c.high_us),
                        r.algbw_GBps, r.busbw_GBps, c.tier, c.source, c.detail);
  }
  if (!cluster.notes.empty()) {
    text += "notes (from the cluster file):\n";
    for (const std::string& n : cluster.notes) text += fmt::format("  {}\n", n);
  }
  fmt::print("{}", text);
  return Status::Ok();
}

}  // namespace

int RunCost(const Argv& argv) {
  Args args(argv);
  args.Declare("--cluster", ArgKind::kValue, "the cluster file (`fsdplab calibrate -o FILE`)",
               "FILE");
  args.Declare("--collective", ArgKind::kValue, "all_gather, reduce_scatter or all_reduce", "C");
  args.Declare("--world-size", ArgKind::kValue, "ranks (default: the cluster file's world_size)",
               "W");
  args.Declare("--bytes", ArgKind::kValue, "sizes, comma-separated, suffixes K M G: 1M,64M,1G",
               "SIZES");
  args.Declare("--json", ArgKind::kSwitch, "print JSON instead of the table");
  if (Status s = args.Parse(); !s.ok()) return Fail("cost", s);
  if (args.help()) return PrintHelp(kUsage, kDescription, args);
  if (Status s = Run(args); !s.ok()) return Fail("cost", s);
  return 0;
}

}  // namespace fsdplab::cli
