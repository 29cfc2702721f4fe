// fsdplab calibrate: fit the collective cost model to nccl-tests output, write a cluster file.
#include <fmt/format.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <utility>

#include "cli_common.h"
#include "commands.h"
#include "fsdplab/calib/bench_gather_format.h"
#include "fsdplab/calib/calibrate.h"
#include "fsdplab/calib/calibration.h"
#include "fsdplab/calib/nccl_tests.h"
#include "fsdplab/calib/plot.h"
#include "fsdplab/core/file_util.h"

namespace fsdplab::cli {
namespace {

constexpr std::string_view kUsage =
    "fsdplab calibrate FILE... [--collective C] [--block N] [--tier intra|inter] [--ranks N] "
    "[--gpus-per-node N] [--in-place] [--contention BENCH.json] [-o cluster.json] "
    "[--plot FILE.svg] [--json]";
constexpr std::string_view kDescription =
    "Reads nccl-tests output (all_gather_perf, reduce_scatter_perf, all_reduce_perf: a log of one\n"
    "test or of a script that ran several, mpirun/srun-tagged lines, the JSON file of\n"
    "nccl-tests 2.19+) and `fsdplab bench-gather`'s output (table, --json or --nccl-out). Each\n"
    "collective's blocks are fitted separately, merged across files by collective and tier, with\n"
    "a continuous cost curve: knots at measured sizes, as many as predict best when each size is\n"
    "left out and predicted from the others (cross-validation); time falls with size only where\n"
    "the log shows a protocol's regime change; beyond the largest size it grows at the measured\n"
    "asymptotic bandwidth. A single size gives a curve exact there, with a warning on how other\n"
    "sizes are extrapolated. Prints measured, fitted and left-out-and-predicted time per size,\n"
    "beside one alpha-beta line, the nodes and from which size the collective is bandwidth-bound,\n"
    "the cross-validated error per size range (the band the cluster file carries; `fsdplab cost`\n"
    "and `simulate --band` use it), warns about noisy data and sweeps too narrow to\n"
    "extrapolate, and writes a cluster file for `fsdplab simulate --cluster` and `fsdplab cost`.\n"
    "The collective, the number of ranks and the tier come from the file when it says them\n"
    "(`Collective test starting`, the binary's name, the device list, the file name); the flags\n"
    "give them when it does not, and --collective picks one collective out of a log of several\n"
    "(a collective the log lacks is an error, never another one). --contention adds the\n"
    "communication contention measured by\n"
    "`fsdplab bench-gather --op concurrent -J BENCH.json` (how much slower an all-gather and a\n"
    "reduce-scatter run while both are in progress) to the cluster file; given alone, it writes\n"
    "a cluster file with the default link lines and that contention.";

Status Run(const Args& args) {
  const std::optional<std::string> contention_file = args.Get("--contention");
  if (args.positionals().empty() && !contention_file) {
    return UsageError("give at least one nccl-tests output file (or --contention FILE)");
  }
  calib::NcclTestsOptions parse_opts;
  if (auto v = args.Get("--ranks")) {
    FSDP_ASSIGN_OR_RETURN(std::int64_t n, ParseInt(*v, "--ranks"));
    if (n < 2) return UsageError("--ranks: a collective needs at least 2 ranks");
    parse_opts.ranks = static_cast<int>(n);
  }
  if (auto v = args.Get("--collective")) {
    std::optional<CollectiveKind> kind = ParseCollectiveKind(*v);
    if (!kind) {
      return UsageError(fmt::format(
          "--collective: unknown collective '{}' (all_gather, reduce_scatter, all_reduce)", *v));
    }
    parse_opts.collective = kind;
  }
  if (auto v = args.Get("--block")) {
    FSDP_ASSIGN_OR_RETURN(std::int64_t n, ParseInt(*v, "--block"));
    if (n < 1) return UsageError("--block: blocks are numbered from 1");
    parse_opts.block = static_cast<int>(n);
  }
  std::optional<calib::TierKind> tier_flag;
  if (auto v = args.Get("--tier")) {
    tier_flag = calib::ParseTierKind(*v);
    if (!tier_flag) return UsageError(fmt::format("--tier: expected intra or inter, got '{}'", *v));
  }
  calib::FitOptions fit_opts;
  fit_opts.in_place = args.Has("--in-place");
  double compute_scale = 1.0;
  if (auto v = args.Get("--compute-scale")) {
    FSDP_ASSIGN_OR_RETURN(compute_scale, ParseDouble(*v, "--compute-scale"));
    if (!(compute_scale > 0)) return UsageError("--compute-scale: must be positive");
  }

  calib::CalibrateInputs in{args.positionals(), parse_opts,   tier_flag,      fit_opts,
                            compute_scale,      std::nullopt, contention_file};
  if (auto v = args.Get("--gpus-per-node")) {
    FSDP_ASSIGN_OR_RETURN(std::int64_t g, ParseInt(*v, "--gpus-per-node"));
    if (g < 1) return UsageError("--gpus-per-node: must be positive");
    in.gpus_per_node = static_cast<int>(g);
  }
  FSDP_ASSIGN_OR_RETURN(calib::Calibration cal, calib::Calibrate(in));
  const calib::CalibratedCluster& cluster = cal.cluster;
  const std::string& cluster_json = cal.cluster_json;
  const std::string& text = cal.text;
  if (auto plot = args.Get("--plot")) {
    if (cluster.fits.empty()) return UsageError("--plot: no nccl-tests output to plot");
    FSDP_RETURN_IF_ERROR(WriteFileAtomic(*plot, calib::FitPlotSvg(cluster.fits)));
  }
  if (auto out = args.Get("-o")) FSDP_RETURN_IF_ERROR(WriteFileAtomic(*out, cluster_json));

  if (args.Has("--json")) {
    fmt::print("{}\n", cal.doc.dump(2));
  } else {
    fmt::print("{}", text);
    if (auto plot = args.Get("--plot")) fmt::print("plot written to {}\n", *plot);
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
               "all_gather, reduce_scatter or all_reduce: names the collective of an output that "
               "does not say it, and picks its blocks out of a log of several",
               "C");
  args.Declare("--block", ArgKind::kValue,
               "use only the N-th result block of each file (1-based), for logs whose blocks do "
               "not say which collective they are",
               "N");
  args.Declare("--gpus-per-node", ArgKind::kValue,
               "GPUs per node (default: from the device list, else 8)", "N");
  args.Declare("--in-place", ArgKind::kSwitch, "fit the in-place times (default out-of-place)");
  args.Declare("--compute-scale", ArgKind::kValue, "compute_scale of the cluster file (1.0)", "X");
  args.Declare("--contention", ArgKind::kValue,
               "the -J output of `fsdplab bench-gather --op concurrent`: its comm_contention "
               "(all-gather and reduce-scatter slowdown while both run) goes to the cluster file",
               "FILE");
  args.Declare("-o", ArgKind::kValue, "write the cluster file to FILE", "FILE");
  args.Declare("--plot", ArgKind::kValue,
               "draw measured vs fitted time per collective on log-log axes to FILE.svg", "FILE");
  args.Declare("--json", ArgKind::kSwitch, "print the fits and the cluster as JSON");
  if (Status s = args.Parse(); !s.ok()) return Fail("calibrate", s);
  if (args.help()) return PrintHelp(kUsage, kDescription, args);
  if (Status s = Run(args); !s.ok()) return Fail("calibrate", s);
  return 0;
}

}  // namespace fsdplab::cli
