// fsdplab bench-gather: all-gather / reduce-scatter bandwidth with and without an overlapped GEMM,
// with nccl-tests' flags and columns.
//
//   fsdplab bench-gather --backend host -b 1M -e 64M -f 2 -n 20 -w 5 --world-size 2
//   fsdplab bench-gather --backend host --nccl-out ag.txt && fsdplab calibrate ag.txt -o c.json
//   mpirun -np 2 fsdplab bench-gather --backend host -b 1M -e 64M   # one process per rank
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <utility>

#include "backends.h"
#include "cli_common.h"
#include "commands.h"
#include "fsdplab/calib/calibration.h"
#include "fsdplab/core/file_util.h"
#include "fsdplab/core/timeline.h"
#include "fsdplab/core/trace.h"
#include "fsdplab/live/gather_bench.h"
#include "fsdplab/live/launch.h"
#include "fsdplab/live/live.h"
#include "fsdplab/synth/synth.h"

namespace fsdplab::cli {
namespace {

constexpr std::string_view kUsage =
    "fsdplab bench-gather [--backend host|cuda] [-b MIN] [-e MAX] [-f FACTOR] [-n ITERS] "
    "[-w WARMUP] [-c 0|1] [--op all_gather|reduce_scatter|concurrent|drift] [-d TYPE] "
    "[--world-size N] [--gemm-n N] [--seconds S] [--window S] [--json] [-J FILE] "
    "[--nccl-out FILE] [--trace TRACE [policy flags]]";
constexpr std::string_view kDescription =
    "Times the collective alone (out of place and in place), a GEMM alone, and both launched\n"
    "together on every rank, for message sizes MIN, MIN*F, ... up to MAX. Columns as nccl-tests:\n"
    "size, count, type, redop, root, time, algbw = size / time, busbw = algbw x (n-1)/n, #wrong\n"
    "(elements that differ from an independently computed expected value), then the overlap:\n"
    "the collective and the GEMM alone and together, overlap efficiency = (alone sum -\n"
    "together) / the shorter of the two (1 = the shorter one is hidden completely, 0 = no\n"
    "overlap), and the GEMM's slowdown under overlap. --nccl-out writes the nccl-tests text\n"
    "format that `fsdplab calibrate` reads; -J writes JSON beside the table.\n"
    "\n"
    "--op concurrent (host backend) measures instead how an all-gather and a reduce-scatter of\n"
    "the same size slow each other down when both run at once on every rank, as they do in a\n"
    "backward pass: five rounds of each alone, then both together, then each alone again (the\n"
    "median together time against the median of the alone times around it, so that the\n"
    "machine's drift cancels), and the slowdown of each (together / alone - 1). The slowdowns\n"
    "over all sizes, weighted by time (sum together / sum alone - 1), are\n"
    "the simulator's communication contention. It also probes the streams' wake-ups, and runs\n"
    "two short live probes on the executor itself (8 layers near the middle of the sizes, 8\n"
    "steps): with no compute, for the gap between back-to-back collectives on a stream\n"
    "(stream_wake_us.after_*), and at prefetch budget 0 with 250 us kernels, for how late an\n"
    "all-gather issued on demand starts after the kernel it waited for\n"
    "(stream_wake_us.demand_all_gather). `fsdplab calibrate ... --contention FILE` takes them\n"
    "all from the -J file.\n"
    "\n"
    "--op drift (host backend) times one collective of -b's size (--collective all_gather, the\n"
    "default, or reduce_scatter) again and again for --seconds of calls (default 20), in\n"
    "samples of about 100 ms, and shows how far the machine alone moves its time: the samples'\n"
    "10th, 50th and 90th percentiles, and each window of --window seconds (default 2.5,\n"
    "about one live run) with the spread between the slowest and the fastest. A prediction\n"
    "checked against a live run on this machine cannot be told from the truth more finely\n"
    "than that spread. -n, -e, -f and -c do not apply.\n"
    "\n"
    "--trace TRACE (host backend) times the collectives of TRACE's units instead, both kinds\n"
    "(or --op's), on the executor's own buffers: it runs the trace live as `fsdplab\n"
    "run --compute timed` would, under the policy flags given, with the compute scaled to\n"
    "nothing and both kinds of collective on one stream, so that each runs alone while the\n"
    "caches hold what the step's own shards, pool buffers and gradients leave there. A row per\n"
    "message size: the mean time of its calls in the timed steps (from the last rank's arrival\n"
    "to the end, every rank). -w counts warm-up steps (default 1; the first is checked with\n"
    "-c 1) and -n timed steps (default 20); -b, -e, -f, -d and --working-set do not apply.\n"
    "`fsdplab calibrate` reads its --nccl-out file (a block per collective) like any other.";

std::string NcclName(const std::string& op) { return op + "_perf"; }

// Ranks as threads of this process (no launcher).
bool InOneProcess() {
  StatusOr<LaunchInfo> launch = DetectLaunch();
  return !launch.ok() || launch->launcher == Launcher::kNone;
}

// Every process of a multi-process run computes the same rows; rank 0 prints and writes them.
bool ReportsHere() {
  StatusOr<LaunchInfo> launch = DetectLaunch();
  return !launch.ok() || launch->rank == 0;
}

std::string Table(const GatherBenchOptions& o, const std::vector<GatherBenchRow>& rows,
                  const std::string& backend) {
  std::string t = fmt::format(
      "# fsdplab bench-gather: {} on the {} backend, {} ranks, warmup iters: {} iters: {} "
      "validation: {}\n#\n",
      o.op, backend, o.world_size, o.warmup, o.iters, o.check ? 1 : 0);
  t += fmt::format(
      "# {:>10} {:>13} {:>9} {:>6} {:>5} {:>9} {:>7} {:>7} {:>6}  {:>9} {:>9} {:>9} "
      "{:>9} {:>9} {:>6} {:>8}\n",
      "size", "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong", "coll", "gemm",
      "together", "coll_ovl", "gemm_ovl", "eff", "slowdown");
  t += fmt::format(
      "# {:>10} {:>13} {:>9} {:>6} {:>5} {:>9} {:>7} {:>7} {:>6}  {:>9} {:>9} {:>9} "
      "{:>9} {:>9} {:>6} {:>8}\n",
      "(B)", "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(us)", "(us)",
      "(us)", "(us)", "", "");
  const std::string redop = o.op == "all_gather" ? "none" : "sum";
  for (const GatherBenchRow& r : rows) {
    t += fmt::format(
        "  {:>10} {:>13} {:>9} {:>6} {:>5} {:>9.2f} {:>7.2f} {:>7.2f} {:>6}  {:>9.2f} {:>9.2f} "
        "{:>9.2f} {:>9.2f} {:>9.2f} {:>6.2f} {:>7.1f}%\n",
        r.size_bytes, r.count, r.type, redop, -1, r.time_us, r.algbw_GBps, r.busbw_GBps, r.wrong,
        r.time_us, r.gemm_alone_us, r.together_us, r.collective_under_overlap_us,
        r.gemm_under_overlap_us, r.overlap_efficiency, 100 * r.compute_slowdown);
  }
  double bus = 0;
  for (const GatherBenchRow& r : rows) bus += r.busbw_GBps;
  t += fmt::format("# Avg bus bandwidth    : {:.3f}\n", rows.empty() ? 0 : bus / rows.size());
  return t;
}

// The nccl-tests text format (modern, 2.17-style), which `fsdplab calibrate` parses.
std::string NcclTestsText(const GatherBenchOptions& o, const std::vector<GatherBenchRow>& rows,
                          const std::string& backend) {
  char host[256] = "localhost";
  gethostname(host, sizeof(host) - 1);
  std::string t = fmt::format("# fsdplab bench-gather --backend {} (nccl-tests format)\n", backend);
  if (o.working_set_bytes > 0) {
    t += fmt::format("# working set: {} bytes (out-of-place calls rotate over buffer copies)\n",
                     o.working_set_bytes);
  }
  t += fmt::format("# Collective test starting: {}\n", NcclName(o.op));
  t += fmt::format(
      "# nThread 1 nGpus {} minBytes {} maxBytes {} step: {}(factor) warmup iters: {} iters: {} "
      "agg iters: 1 validation: {} graph: 0\n#\n# Using devices\n",
      o.world_size, o.min_bytes, o.max_bytes, o.step_factor, o.warmup, o.iters, o.check ? 1 : 0);
  for (int r = 0; r < o.world_size; ++r) {
    t += fmt::format("#  Rank {:>2} Group  0 Pid {:>7} on {} device {:>2} [0x00] {} rank thread\n",
                     r, getpid(), host, r, backend);
  }
  t += "#\n";
  t += "#                                                              out-of-place               "
       "        in-place          \n";
  t += "#       size         count      type   redop    root     time   algbw   busbw  #wrong     "
       "time   algbw   busbw  #wrong \n";
  t += "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)             "
       "(us)  (GB/s)  (GB/s)         \n";
  const std::string redop = o.op == "all_gather" ? "none" : "sum";
  double bus = 0;
  for (const GatherBenchRow& r : rows) {
    t += fmt::format(
        "{:>12} {:>13} {:>9} {:>7} {:>7} {:>8.2f} {:>7.2f} {:>7.2f} {:>7} {:>8.2f} "
        "{:>7.2f} {:>7.2f} {:>7}\n",
        r.size_bytes, r.count, r.type, redop, -1, r.time_us, r.algbw_GBps, r.busbw_GBps, r.wrong,
        r.inplace_time_us, r.inplace_algbw_GBps, r.inplace_busbw_GBps, r.inplace_wrong);
    bus += r.busbw_GBps;
  }
  std::uint64_t wrong = 0;
  for (const GatherBenchRow& r : rows) wrong += r.wrong + r.inplace_wrong;
  t += fmt::format("# Out of bounds values : {} {}\n", wrong, wrong == 0 ? "OK" : "FAILED");
  t += fmt::format("# Avg bus bandwidth    : {:.3f} \n#\n", rows.empty() ? 0 : bus / rows.size());
  t += fmt::format("# Collective test concluded: {}\n#\n", NcclName(o.op));
  return t;
}

// The fields every bench-gather JSON document starts with.
nlohmann::ordered_json JsonHeader(const GatherBenchOptions& o, const std::string& backend,
                                  const std::string& op) {
  nlohmann::ordered_json doc;
  doc["format"] = "fsdplab.bench_gather";
  doc["version"] = 1;
  doc["backend"] = backend;
  doc["op"] = op;
  doc["world_size"] = o.world_size;
  doc["dtype"] = o.dtype;
  doc["warmup"] = o.warmup;
  doc["iters"] = o.iters;
  doc["check"] = o.check;
  doc["working_set_bytes"] = o.working_set_bytes;
  return doc;
}

std::string Json(const GatherBenchOptions& o, const std::vector<GatherBenchRow>& rows,
                 const std::string& backend) {
  nlohmann::ordered_json doc = JsonHeader(o, backend, o.op);
  nlohmann::ordered_json list = nlohmann::ordered_json::array();
  for (const GatherBenchRow& r : rows) {
    list.push_back({{"size_bytes", r.size_bytes},
                    {"count", r.count},
                    {"type", r.type},
                    {"time_us", r.time_us},
                    {"algbw_GBps", r.algbw_GBps},
                    {"busbw_GBps", r.busbw_GBps},
                    {"wrong", r.wrong},
                    {"inplace_time_us", r.inplace_time_us},
                    {"inplace_algbw_GBps", r.inplace_algbw_GBps},
                    {"inplace_busbw_GBps", r.inplace_busbw_GBps},
                    {"inplace_wrong", r.inplace_wrong},
                    {"gemm_alone_us", r.gemm_alone_us},
                    {"together_us", r.together_us},
                    {"collective_under_overlap_us", r.collective_under_overlap_us},
                    {"gemm_under_overlap_us", r.gemm_under_overlap_us},
                    {"overlap_efficiency", r.overlap_efficiency},
                    {"compute_slowdown", r.compute_slowdown}});
  }
  doc["rows"] = std::move(list);
  return doc.dump(2) + "\n";
}

// The contention figures the simulator uses: sum over sizes of the time together / sum of the time
// alone - 1, per collective. Weighted by time like a step is: small messages, whose slowdown is
// mostly thread wake-ups, count for little next to the large ones that fill a backward pass.
std::pair<double, double> WeightedSlowdowns(const std::vector<ContentionRow>& rows) {
  double ag_alone = 0, ag_together = 0, rs_alone = 0, rs_together = 0;
  for (const ContentionRow& r : rows) {
    ag_alone += r.all_gather_alone_us;
    ag_together += r.all_gather_together_us;
    rs_alone += r.reduce_scatter_alone_us;
    rs_together += r.reduce_scatter_together_us;
  }
  return {ag_alone > 0 ? ag_together / ag_alone - 1 : 0,
          rs_alone > 0 ? rs_together / rs_alone - 1 : 0};
}

// The stream wake-up the simulator uses (host only: no probes elsewhere): per condition, the mean
// over every probe of every size. A size's probes run as long as its loops do, so the sizes
// weigh by time as they do in a step.
struct MeasuredWake {
  calib::StreamWake wake;
  int probes = 0;
  int gap_pairs = 0;       // back-to-back collectives behind wake.after_*
  int demand_gathers = 0;  // on-demand gathers behind wake.demand_all_gather
};
std::optional<MeasuredWake> StreamWakeOf(const std::vector<ContentionRow>& rows,
                                         const CollectiveGaps& gaps,
                                         const DemandGatherStarts& demand) {
  using Probe = ContentionRow::WakeProbe;
  auto mean = [&](Probe ContentionRow::*which, int& probes) {
    double sum = 0;
    probes = 0;
    for (const ContentionRow& r : rows) {
      const Probe& p = r.*which;
      sum += p.mean_us * p.probes;
      probes += p.probes;
    }
    return probes > 0 ? sum / probes : 0.0;
  };
  MeasuredWake m;
  int idle = 0, ag = 0, rs = 0, both_ag = 0, both_rs = 0;
  m.wake.idle_us = mean(&ContentionRow::wake_idle, idle);
  m.wake.while_all_gather_us = mean(&ContentionRow::wake_while_all_gather, ag);
  m.wake.while_reduce_scatter_us = mean(&ContentionRow::wake_while_reduce_scatter, rs);
  m.wake.together_all_gather_us = mean(&ContentionRow::wake_together_all_gather, both_ag);
  m.wake.together_reduce_scatter_us = mean(&ContentionRow::wake_together_reduce_scatter, both_rs);
  m.probes = idle + ag + rs + both_ag + both_rs;
  if (idle == 0 || ag == 0 || rs == 0) return std::nullopt;
  m.wake.after_all_gather_us = gaps.all_gather.mean_us;
  m.wake.after_reduce_scatter_us = gaps.reduce_scatter.mean_us;
  m.gap_pairs = gaps.all_gather.pairs + gaps.reduce_scatter.pairs;
  m.wake.demand_all_gather_us = demand.mean_us;
  m.demand_gathers = demand.gathers;
  return m;
}

std::string ContentionTable(const GatherBenchOptions& o, const std::vector<ContentionRow>& rows,
                            const CollectiveGaps& gaps, const DemandGatherStarts& demand,
                            const std::string& backend) {
  std::string t = fmt::format(
      "# fsdplab bench-gather: all_gather and reduce_scatter at once on the {} backend, {} ranks, "
      "warmup iters: {} iters: {} validation: {}\n#\n",
      backend, o.world_size, o.warmup, o.iters, o.check ? 1 : 0);
  t += fmt::format("# {:>10} {:>9}  {:>11} {:>11} {:>9}  {:>11} {:>11} {:>9} {:>6}\n", "size",
                   "type", "AG alone", "AG together", "AG slower", "RS alone", "RS together",
                   "RS slower", "#wrong");
  t += fmt::format("# {:>10} {:>9}  {:>11} {:>11} {:>9}  {:>11} {:>11} {:>9} {:>6}\n", "(B)", "",
                   "(us)", "(us)", "", "(us)", "(us)", "", "");
  for (const ContentionRow& r : rows) {
    t += fmt::format(
        "  {:>10} {:>9}  {:>11.2f} {:>11.2f} {:>8.1f}%  {:>11.2f} {:>11.2f} {:>8.1f}% {:>6}\n",
        r.size_bytes, r.type, r.all_gather_alone_us, r.all_gather_together_us,
        100 * r.all_gather_slowdown, r.reduce_scatter_alone_us, r.reduce_scatter_together_us,
        100 * r.reduce_scatter_slowdown, r.wrong);
  }
  const auto [ag, rs] = WeightedSlowdowns(rows);
  t += fmt::format(
      "# Slowdown while both run (time-weighted over sizes): all_gather {:.1f}%, "
      "reduce_scatter {:.1f}% "
      "(comm_contention {:.3f} / {:.3f}; `fsdplab calibrate --contention` reads the -J file)\n",
      100 * ag, 100 * rs, ag, rs);
  if (const std::optional<MeasuredWake> m = StreamWakeOf(rows, gaps, demand)) {
    t += fmt::format(
        "# A communication stream resumed after the emulated kernel it waited on: {:.1f} us late "
        "with no collective running, {:.1f} us while all_gather ran, {:.1f} us while "
        "reduce_scatter ran; both streams released by the same kernel: all_gather started "
        "{:.1f} us and reduce_scatter {:.1f} us after it (mean of {} probes; stream_wake_us)\n",
        m->wake.idle_us, m->wake.while_all_gather_us, m->wake.while_reduce_scatter_us,
        m->wake.together_all_gather_us, m->wake.together_reduce_scatter_us, m->probes);
    if (m->gap_pairs > 0) {
      t += fmt::format(
          "# Back-to-back collectives of a live probe (the executor, no compute): the next "
          "began {:.1f} us after an all-gather on its stream ended, {:.1f} us after a "
          "reduce-scatter (means of {} and {} pairs; {} more, where the other stream's "
          "collective was running, left out; stream_wake_us.after_*)\n",
          gaps.all_gather.mean_us, gaps.reduce_scatter.mean_us, gaps.all_gather.pairs,
          gaps.reduce_scatter.pairs, gaps.busy_pairs);
    }
    if (m->demand_gathers > 0) {
      t += fmt::format(
          "# On-demand all-gathers of a live probe at prefetch budget 0 (the executor, 250 us "
          "kernels): each started {:.1f} us after the kernel its stream waited for (mean of {} "
          "gathers; stream_wake_us.demand_all_gather)\n",
          demand.mean_us, demand.gathers);
    }
  }
  return t;
}

std::string ContentionJson(const GatherBenchOptions& o, const std::vector<ContentionRow>& rows,
                           const CollectiveGaps& gaps, const DemandGatherStarts& demand,
                           const std::string& backend) {
  nlohmann::ordered_json doc = JsonHeader(o, backend, "concurrent");
  nlohmann::ordered_json list = nlohmann::ordered_json::array();
  for (const ContentionRow& r : rows) {
    list.push_back({{"size_bytes", r.size_bytes},
                    {"type", r.type},
                    {"all_gather_alone_us", r.all_gather_alone_us},
                    {"reduce_scatter_alone_us", r.reduce_scatter_alone_us},
                    {"all_gather_together_us", r.all_gather_together_us},
                    {"reduce_scatter_together_us", r.reduce_scatter_together_us},
                    {"all_gather_slowdown", r.all_gather_slowdown},
                    {"reduce_scatter_slowdown", r.reduce_scatter_slowdown},
                    {"wrong", r.wrong}});
    if (r.wake_idle.probes > 0) {
      nlohmann::ordered_json& row = list.back();
      for (auto [name, p] :
           {std::pair{"idle", r.wake_idle}, std::pair{"while_all_gather", r.wake_while_all_gather},
            std::pair{"while_reduce_scatter", r.wake_while_reduce_scatter},
            std::pair{"together_all_gather", r.wake_together_all_gather},
            std::pair{"together_reduce_scatter", r.wake_together_reduce_scatter}}) {
        row[fmt::format("wake_{}_us", name)] = p.mean_us;
        row[fmt::format("wake_{}_probes", name)] = p.probes;
      }
    }
  }
  doc["rows"] = std::move(list);
  const auto [ag, rs] = WeightedSlowdowns(rows);
  doc["comm_contention"] = {{"all_gather", ag},
                            {"reduce_scatter", rs},
                            {"statistic", "sum of together / sum of alone - 1, over sizes"}};
  if (const std::optional<MeasuredWake> m = StreamWakeOf(rows, gaps, demand)) {
    nlohmann::ordered_json wake = nlohmann::ordered_json::parse(calib::StreamWakeJson(m->wake));
    wake["probes"] = m->probes;
    wake["statistic"] = "mean over probes, every size";
    if (m->gap_pairs > 0) {
      wake["statistic"] = fmt::format(
          "mean over probes, every size; after_*: means over {} back-to-back pairs of a live "
          "probe",
          m->gap_pairs);
    }
    if (m->demand_gathers > 0) {
      wake["statistic"] = wake["statistic"].get<std::string>() +
                          fmt::format(
                              "; demand_all_gather: mean over {} on-demand gathers of a "
                              "live probe at prefetch budget 0",
                              m->demand_gathers);
    }
    doc["stream_wake_us"] = std::move(wake);
  }
  return doc.dump(2) + "\n";
}

// A live probe on the executor itself: 8 bf16 layers of units near the middle of the bench's
// sizes (geometric), within 256 KiB-8 MiB; 8 steps, the first a warm-up; the same executor,
// threads and niceness as `run --compute timed`. `prefetch`: both budgets; `layer_fwd_us`: a
// layer's forward compute (0: none to wait for). Its timeline.
StatusOr<Timeline> ProbeLiveRun(const GatherBenchOptions& o, const ChosenBackend& chosen,
                                std::uint64_t prefetch, double layer_fwd_us,
                                std::string_view what) {
  constexpr int kLayers = 8;
  constexpr int kSteps = 8;
  const double middle =
      std::sqrt(static_cast<double>(o.min_bytes) * static_cast<double>(o.max_bytes));
  const double unit_bytes = std::clamp(middle, 256.0 * 1024, 8.0 * 1024 * 1024);
  // A layer holds 4h^2 + 3h * ffn parameters; with ffn = 3h, 13h^2 of 2 bytes.
  synth::SynthConfig c;
  c.layers = kLayers;
  c.hidden = std::max<std::int64_t>(64, 8 * std::llround(std::sqrt(unit_bytes / 26) / 8));
  c.ffn = 3 * c.hidden;
  c.heads = 4;
  c.kv_heads = 4;
  c.vocab = 256;
  c.seq = 64;
  c.world_size = o.world_size;
  // synth costs a layer's forward at tflops x 1e6 FLOP per us.
  FSDP_ASSIGN_OR_RETURN(const double layer_flops, synth::LayerForwardFlops(c));
  c.tflops = layer_fwd_us > 0 ? layer_flops / (layer_fwd_us * 1e6) : 1e6;
  FSDP_ASSIGN_OR_RETURN(const Trace trace, synth::SynthesizeTrace(c));
  LiveOptions live;
  live.world_size = o.world_size;
  live.steps = kSteps;
  live.policy.forward_prefetch = Budget{.value = prefetch};
  live.policy.backward_prefetch = Budget{.value = prefetch};
  live.compute = ComputeMode::kTimed;
  live.check = false;
  StatusOr<RunOutcome> run = chosen.backend->Run(
      RunRequest{.trace = &trace, .options = live, .backend_flags = chosen.flags});
  if (!run.ok()) {
    return Status(run.status().code(),
                  fmt::format("the live probe of {}: {}", what, run.status().message()));
  }
  return std::move(run->timeline);
}

// The host streams' own work between two collectives: the live probe with no compute to wait
// for, prefetching two units ahead, so that every collective is ready before the one ahead of it
// on its stream ends (the gaps are the stream's, not the schedule's). Measured beside a grid's
// 24 workloads (2-3 ranks; bench/README.md): 37-165 us after an all-gather, 18-76 us after a
// reduce-scatter, where the bench's own back-to-back loop leaves 1-16 us (inside the curve:
// counted twice, a few us).
StatusOr<CollectiveGaps> ProbeCollectiveGaps(const GatherBenchOptions& o,
                                             const ChosenBackend& chosen) {
  FSDP_ASSIGN_OR_RETURN(
      const Timeline t,
      ProbeLiveRun(o, chosen, /*prefetch=*/2, /*layer_fwd_us=*/0, "the gaps between collectives"));
  return MeasureCollectiveGaps(t);
}

// The on-demand all-gather's start: the live probe at prefetch budget 0 with forward kernels of
// 250 us (a step's short computes, as the wake-up probes' 150-350 us), so that every forward
// gather waits for the kernel before it. From that kernel's end to the gather's start the
// stream wakes, runs its releases and allocations, takes the buffer from the pool and meets the
// other ranks: on a grid's budget-0 workloads 48-297 us (medians; bench/README.md), where the idle
// wake-up probe beside them read 28 us and the simulator, charging it, 21-144 us.
StatusOr<DemandGatherStarts> ProbeDemandGathers(const GatherBenchOptions& o,
                                                const ChosenBackend& chosen) {
  FSDP_ASSIGN_OR_RETURN(const Timeline t,
                        ProbeLiveRun(o, chosen, /*prefetch=*/0,
                                     /*layer_fwd_us=*/250, "on-demand all-gathers"));
  return MeasureDemandGatherStarts(t);
}

// --op concurrent: the contention benchmark.
Status RunConcurrent(const Args& args, const GatherBenchOptions& o, const ChosenBackend& chosen) {
  if (args.Get("--nccl-out")) {
    return UsageError("--nccl-out: --op concurrent has no nccl-tests equivalent; use -J FILE");
  }
  const std::string& backend = chosen.name;
  StatusOr<std::vector<ContentionRow>> measured =
      chosen.backend->BenchContention(BenchRequest{.options = o, .backend_flags = chosen.flags});
  if (!measured.ok()) return InFlags(measured.status(), FlagScope::kBenchGather);
  const std::vector<ContentionRow>& rows = *measured;
  CollectiveGaps gaps;
  DemandGatherStarts demand;
  if (backend == "host" && InOneProcess()) {
    FSDP_ASSIGN_OR_RETURN(gaps, ProbeCollectiveGaps(o, chosen));
    FSDP_ASSIGN_OR_RETURN(demand, ProbeDemandGathers(o, chosen));
  }
  const std::string json = ContentionJson(o, rows, gaps, demand, backend);
  if (!ReportsHere()) return Status::Ok();
  if (auto file = args.Get("-J")) FSDP_RETURN_IF_ERROR(WriteFileAtomic(*file, json));
  fmt::print("{}", args.Has("--json") ? json : ContentionTable(o, rows, gaps, demand, backend));
  std::uint64_t wrong = 0;
  for (const ContentionRow& r : rows) wrong += r.wrong;
  if (wrong > 0)
    return InternalError(fmt::format("{} elements differ from the expected values", wrong));
  return Status::Ok();
}

// --op drift: how far the machine alone moves one collective's time.
std::string DriftTable(const GatherBenchOptions& o, std::uint64_t size,
                       const std::vector<DriftSample>& samples, const DriftSummary& s,
                       double window_s, const std::string& backend) {
  int calls = 0;
  for (const DriftSample& d : samples) calls += d.calls;
  std::string t = fmt::format(
      "# fsdplab bench-gather: {} of {} B timed again and again for {:.1f} s on the {} backend, "
      "{} ranks, working set {} B\n",
      o.op, size, o.drift_seconds, backend, o.world_size, o.working_set_bytes);
  t += fmt::format("# {:>8} {:>7} {:>12}\n", "window", "calls", "time (us)");
  for (const DriftWindow& w : s.windows) {
    t += fmt::format("  {:>7.1f}s {:>7} {:>12.2f}\n", w.start_s, w.calls, w.time_us);
  }
  t += fmt::format(
      "# {} samples ({} calls): per call p10 {:.1f} us, median {:.1f} us, p90 {:.1f} us "
      "(p90 / p10 - 1 = {:.1f}%)\n",
      samples.size(), calls, s.sample_p10_us, s.sample_median_us, s.sample_p90_us,
      s.sample_p10_us > 0 ? 100 * (s.sample_p90_us / s.sample_p10_us - 1) : 0.0);
  t += fmt::format(
      "# The machine alone moved this collective's time by {:.1f}% between windows of {:.1f} s "
      "(per call {:.1f} to {:.1f} us, median {:.1f} us over {} windows): a live run here is not "
      "reproducible more closely than that\n",
      100 * s.window_spread, window_s, s.window_min_us, s.window_max_us, s.window_median_us,
      s.windows.size());
  return t;
}

std::string DriftJson(const GatherBenchOptions& o, std::uint64_t size,
                      const std::vector<DriftSample>& samples, const DriftSummary& s,
                      double window_s, const std::string& backend) {
  nlohmann::ordered_json doc = JsonHeader(o, backend, "drift");
  doc["collective"] = o.op;
  doc["size_bytes"] = size;
  doc["seconds"] = o.drift_seconds;
  doc["window_s"] = window_s;
  nlohmann::ordered_json list = nlohmann::ordered_json::array();
  for (const DriftSample& d : samples) {
    list.push_back({{"at_s", d.at_s}, {"calls", d.calls}, {"time_us", d.time_us}});
  }
  doc["samples"] = std::move(list);
  nlohmann::ordered_json windows = nlohmann::ordered_json::array();
  for (const DriftWindow& w : s.windows) {
    windows.push_back({{"start_s", w.start_s}, {"calls", w.calls}, {"time_us", w.time_us}});
  }
  doc["windows"] = std::move(windows);
  doc["summary"] = {{"sample_p10_us", s.sample_p10_us},
                    {"sample_median_us", s.sample_median_us},
                    {"sample_p90_us", s.sample_p90_us},
                    {"window_min_us", s.window_min_us},
                    {"window_median_us", s.window_median_us},
                    {"window_max_us", s.window_max_us},
                    {"window_spread", s.window_spread},
                    {"statistic", "percentiles by nearest rank; window_spread = max / min - 1"}};
  return doc.dump(2) + "\n";
}

Status RunDrift(const Args& args, GatherBenchOptions o, const ChosenBackend& chosen) {
  if (args.Get("--nccl-out")) {
    return UsageError("--nccl-out: --op drift has no nccl-tests equivalent; use -J FILE");
  }
  o.op = "all_gather";
  if (auto v = args.Get("--collective")) {
    if (*v != "all_gather" && *v != "reduce_scatter") {
      return UsageError(fmt::format("--collective: '{}' is not all_gather or reduce_scatter", *v));
    }
    o.op = *v;
  }
  if (auto v = args.Get("--seconds")) {
    FSDP_ASSIGN_OR_RETURN(o.drift_seconds, ParseDouble(*v, "--seconds"));
  }
  // Before the window is checked against it, and before any time is spent.
  FSDP_RETURN_IF_ERROR(InFlags(CheckGatherBenchOptions(o), FlagScope::kBenchGather));
  double window_s = std::min(2.5, o.drift_seconds);
  if (auto v = args.Get("--window")) {
    FSDP_ASSIGN_OR_RETURN(window_s, ParseDouble(*v, "--window"));
  }
  if (!(window_s > 0 && window_s <= o.drift_seconds)) {
    return UsageError(fmt::format("--window: {} s must be positive and at most --seconds ({} s)",
                                  window_s, o.drift_seconds));
  }
  StatusOr<std::vector<DriftSample>> samples =
      chosen.backend->BenchDrift(BenchRequest{.options = o, .backend_flags = chosen.flags});
  if (!samples.ok()) return InFlags(samples.status(), FlagScope::kBenchGather);
  FSDP_ASSIGN_OR_RETURN(const DriftSummary summary, SummarizeDrift(*samples, window_s));
  if (!ReportsHere()) return Status::Ok();
  FSDP_ASSIGN_OR_RETURN(const BenchType type, FindBenchType(o.dtype));  // the run checked it
  const std::uint64_t size = BenchMessageBytes(o.min_bytes, o.world_size, type);
  const std::string json = DriftJson(o, size, *samples, summary, window_s, chosen.name);
  if (auto file = args.Get("-J")) FSDP_RETURN_IF_ERROR(WriteFileAtomic(*file, json));
  fmt::print("{}", args.Has("--json")
                       ? json
                       : DriftTable(o, size, *samples, summary, window_s, chosen.name));
  return Status::Ok();
}

// --trace: the collectives of a trace's units, timed on the executor's own buffers. A bench on
// rotated copies of one size walks its working set evenly, call after call; a step does not: its
// shards and reduced gradients come round once a step while its gathered planes and gradient
// buffers are the pool's, recycled within a unit or two. On a grid's small-unit workloads
// (bench/README.md) the live collectives ran at 0.76-0.88x the curves benched on the bytes their
// collectives walk, and a 5.2 MB all-gather of one of them took 432-443 us serialized here
// against 457-466 us live beside a 131M-working-set bench's 541-609 us. So the executor runs the
// trace itself, as `run --compute timed` would, with the compute scaled to nothing and both kinds
// of collective on one stream: each is timed alone, from the last rank's arrival to its end (as
// a live collective is), in the cache state the step's own buffers leave.
constexpr double kNoCompute = 1e-9;  // the compute scale: kernels of (almost) no time

// Per message size of the benched kind: the mean time of its calls in the timed steps (every
// rank's), in nccl-tests' row shape (bytes as uint8 elements: a unit's planes may mix types).
std::vector<GatherBenchRow> TraceRows(const Timeline& t, const std::string& op, int world,
                                      int warmup_steps) {
  const OpKind kind = op == "all_gather" ? OpKind::kAllGather : OpKind::kReduceScatter;
  std::map<Bytes, std::pair<double, int>> by_size;  // bytes -> (sum us, calls)
  for (const TimelineOp& x : t.ops) {
    if (x.kind != kind || x.step < warmup_steps || x.bytes == 0) continue;
    auto& [sum, calls] = by_size[x.bytes];
    sum += x.end_us - x.start_us;
    ++calls;
  }
  std::vector<GatherBenchRow> rows;
  for (const auto& [bytes, acc] : by_size) {
    GatherBenchRow r;
    r.size_bytes = bytes;
    r.count = bytes;
    r.type = "uint8";
    r.time_us = acc.first / acc.second;
    // Out of place only: the in-place columns repeat it, for the format's sake.
    r.inplace_time_us = r.time_us;
    FillDerivedColumns(r, op, world);
    rows.push_back(r);
  }
  return rows;
}

Status RunTrace(const Args& args, GatherBenchOptions o, const ChosenBackend& chosen,
                const std::string& path) {
  if (chosen.name != "host") {
    return UsageError("--trace: the host backend only (its executor's buffers are what it times)");
  }
  for (const char* flag : {"-b", "-e", "-f", "-d", "--gemm-n", "--working-set", "--seconds",
                           "--window", "--collective"}) {
    if (args.Get(flag)) {
      return UsageError(
          fmt::format("{}: not with --trace (the sizes, buffers and types are the trace's)", flag));
    }
  }
  // One run times both kinds; --op keeps one.
  std::vector<std::string> ops = {"all_gather", "reduce_scatter"};
  if (args.Get("--op")) {
    if (o.op != "all_gather" && o.op != "reduce_scatter") {
      return UsageError(
          fmt::format("--op {}: --trace times all_gather and reduce_scatter, not {}", o.op, o.op));
    }
    ops = {o.op};
  }
  if (!InOneProcess()) {
    return UsageError("--trace: ranks as threads of one process only (no mpirun or srun)");
  }
  // Steps, not calls: every unit's collectives come once (or once a microbatch) a step.
  o.warmup = args.Get("-w") ? std::max(o.warmup, 1) : 1;
  FSDP_ASSIGN_OR_RETURN(const Trace trace, ReadReplayableTrace(path));
  LiveOptions live;
  FSDP_ASSIGN_OR_RETURN(live.policy, PolicyFromArgs(args, trace));
  live.policy.unified_comm_stream = true;
  live.world_size = o.world_size;
  live.steps = o.warmup + o.iters;
  live.compute = ComputeMode::kTimed;
  live.compute_scale = kNoCompute;
  live.check = o.check;  // in the first step, which is not timed
  StatusOr<RunOutcome> run = chosen.backend->Run(
      RunRequest{.trace = &trace, .options = live, .backend_flags = chosen.flags});
  if (!run.ok()) {
    return Status(run.status().code(), fmt::format("--trace {}: {}", path, run.status().message()));
  }
  const LiveCheck& check = run->check;
  nlohmann::ordered_json doc = JsonHeader(o, chosen.name, ops.size() == 1 ? ops[0] : "both");
  doc["dtype"] = "uint8";
  doc["trace"] = path;
  doc["steps"] = {{"warmup", o.warmup}, {"timed", o.iters}};
  doc["statistic"] =
      "mean time of a call, from the last rank's arrival to its end, every rank, timed steps";
  nlohmann::ordered_json list = nlohmann::ordered_json::array();
  std::string nccl;
  std::string table = fmt::format(
      "# fsdplab bench-gather --trace {}: on the {} backend, {} ranks, the executor's own "
      "buffers, one collective at a time; {} warm-up and {} timed steps\n#\n"
      "# {:>14} {:>12} {:>10} {:>9} {:>9}\n",
      path, chosen.name, o.world_size, o.warmup, o.iters, "collective", "size (B)", "time (us)",
      "algbw", "busbw");
  std::uint64_t wrong_total = 0;
  for (const std::string& op : ops) {
    std::vector<GatherBenchRow> rows = TraceRows(run->timeline, op, o.world_size, o.warmup);
    if (rows.empty()) {
      return InvalidInput(fmt::format(
          "--trace {}: no {} moved bytes in its steps (a model without parameters?)", path, op));
    }
    const std::uint64_t wrong =
        op == "all_gather" ? check.gathered_bytes_wrong : check.grad_elements_wrong;
    rows.front().wrong = wrong;
    wrong_total += wrong;
    GatherBenchOptions block = o;
    block.op = op;
    block.dtype = "uint8";
    block.min_bytes = rows.front().size_bytes;
    block.max_bytes = rows.back().size_bytes;
    std::string text = NcclTestsText(block, rows, chosen.name);
    const std::size_t eol = text.find('\n') + 1;
    text.insert(eol, fmt::format("# the collectives of {} on the executor's buffers, one at a "
                                 "time, {} warm-up and {} timed steps (bench-gather --trace)\n",
                                 path, o.warmup, o.iters));
    nccl += text;
    for (const GatherBenchRow& r : rows) {
      list.push_back({{"op", op},
                      {"size_bytes", r.size_bytes},
                      {"time_us", r.time_us},
                      {"algbw_GBps", r.algbw_GBps},
                      {"busbw_GBps", r.busbw_GBps},
                      {"wrong", r.wrong}});
      table += fmt::format("  {:>14} {:>12} {:>10.2f} {:>9.2f} {:>9.2f}\n", op, r.size_bytes,
                           r.time_us, r.algbw_GBps, r.busbw_GBps);
    }
  }
  doc["rows"] = std::move(list);
  const std::string json = doc.dump(2) + "\n";
  if (auto file = args.Get("-J")) FSDP_RETURN_IF_ERROR(WriteFileAtomic(*file, json));
  if (auto file = args.Get("--nccl-out")) FSDP_RETURN_IF_ERROR(WriteFileAtomic(*file, nccl));
  fmt::print("{}", args.Has("--json") ? json : table);
  if (wrong_total > 0) {
    return InternalError(fmt::format(
        "the checked first step: {} gathered bytes and {} reduced gradient elements differ from "
        "the expected values",
        check.gathered_bytes_wrong, check.grad_elements_wrong));
  }
  return Status::Ok();
}

Status Run(const Args& args) {
  if (!args.positionals().empty()) {
    return UsageError(fmt::format("unexpected argument '{}'", args.positionals().front()));
  }
  GatherBenchOptions o;
  FSDP_ASSIGN_OR_RETURN(ChosenBackend chosen, ChooseBackend(args));
  const std::string& backend = chosen.name;
  if (auto v = args.Get("-b")) {
    FSDP_ASSIGN_OR_RETURN(o.min_bytes, ParseSize(*v, "-b"));
  }
  if (auto v = args.Get("-e")) {
    FSDP_ASSIGN_OR_RETURN(o.max_bytes, ParseSize(*v, "-e"));
  } else if (args.Get("-b")) {
    o.max_bytes = o.min_bytes;
  }
  if (auto v = args.Get("-f")) {
    FSDP_ASSIGN_OR_RETURN(o.step_factor, ParseSize(*v, "-f"));
  }
  auto int_flag = [&](std::string_view flag, int& out, int lo, int hi) -> Status {
    if (auto v = args.Get(flag)) {
      FSDP_ASSIGN_OR_RETURN(std::int64_t n, ParseInt(*v, flag));
      if (n < lo || n > hi)
        return UsageError(fmt::format("{}: {} is outside {}..{}", flag, n, lo, hi));
      out = static_cast<int>(n);
    }
    return Status::Ok();
  };
  FSDP_RETURN_IF_ERROR(int_flag("-n", o.iters, 1, 1000000));
  FSDP_RETURN_IF_ERROR(int_flag("-w", o.warmup, 0, 1000000));
  int check = 1;
  FSDP_RETURN_IF_ERROR(int_flag("-c", check, 0, 1));
  o.check = check == 1;
  FSDP_RETURN_IF_ERROR(int_flag("--world-size", o.world_size, 1, 256));
  // Under mpirun (srun, ...) the launcher says how many ranks there are: one per process.
  FSDP_ASSIGN_OR_RETURN(const LaunchInfo launch, DetectLaunch());
  if (launch.multi_process()) o.world_size = launch.world_size;
  if (auto v = args.Get("--op")) o.op = *v;
  if (auto v = args.Get("-d")) o.dtype = *v;
  if (auto v = args.Get("--gemm-n")) {
    FSDP_ASSIGN_OR_RETURN(std::int64_t n, ParseInt(*v, "--gemm-n"));
    if (n < 0 || n > 16384) return UsageError("--gemm-n: must be in 0..16384");
    o.gemm_n = static_cast<std::uint64_t>(n);
  }
  if (auto v = args.Get("--working-set")) {
    FSDP_ASSIGN_OR_RETURN(o.working_set_bytes, ParseSize(*v, "--working-set"));
    if (backend != "host") return UsageError("--working-set: the host backend only");
  }
  if (auto trace = args.Get("--trace")) return RunTrace(args, o, chosen, *trace);
  if (std::optional<std::string> flag = FirstPolicyFlag(args)) {
    return UsageError(fmt::format("{}: only with --trace (the policy its steps run under)", *flag));
  }
  if (o.op == "concurrent") return RunConcurrent(args, o, chosen);
  if (o.op == "drift") return RunDrift(args, o, chosen);
  for (const char* flag : {"--seconds", "--window", "--collective"}) {
    if (args.Get(flag)) return UsageError(fmt::format("{}: only with --op drift", flag));
  }
  StatusOr<std::vector<GatherBenchRow>> rows =
      chosen.backend->BenchGather(BenchRequest{.options = o, .backend_flags = chosen.flags});
  if (!rows.ok()) return InFlags(rows.status(), FlagScope::kBenchGather);
  if (!ReportsHere()) return Status::Ok();
  const std::string json = Json(o, *rows, backend);
  if (auto file = args.Get("-J")) FSDP_RETURN_IF_ERROR(WriteFileAtomic(*file, json));
  if (auto file = args.Get("--nccl-out")) {
    FSDP_RETURN_IF_ERROR(WriteFileAtomic(*file, NcclTestsText(o, *rows, backend)));
  }
  fmt::print("{}", args.Has("--json") ? json : Table(o, *rows, backend));
  std::uint64_t wrong = 0;
  for (const GatherBenchRow& r : *rows) wrong += r.wrong + r.inplace_wrong;
  if (wrong > 0)
    return InternalError(fmt::format("{} elements differ from the expected values", wrong));
  return Status::Ok();
}

}  // namespace

int RunBenchGather(const Argv& argv) {
  Args args(argv);
  DeclareBackendFlags(args);
  args.Declare("-b", ArgKind::kValue, "smallest message, bytes (suffixes K M G; default 32M)",
               "SIZE");
  args.Declare("-e", ArgKind::kValue, "largest message, bytes (default: -b)", "SIZE");
  args.Declare("-f", ArgKind::kValue, "multiply the size by F between rows (default 2)", "F");
  args.Declare("-n", ArgKind::kValue, "timed iterations per size (default 20)", "N");
  args.Declare("-w", ArgKind::kValue, "warm-up iterations per size (default 5)", "N");
  args.Declare("-c", ArgKind::kValue, "check the results: 1 (default) or 0", "0|1");
  args.Declare("--op", ArgKind::kValue,
               "all_gather (default), reduce_scatter, concurrent (both at once: contention), or "
               "drift (one collective timed again and again: the machine's own noise)",
               "OP");
  args.Declare("--collective", ArgKind::kValue,
               "--op drift: the collective timed, all_gather (default) or reduce_scatter", "OP");
  args.Declare("--seconds", ArgKind::kValue,
               "--op drift: how long to time calls, seconds (default 20)", "S");
  args.Declare("--window", ArgKind::kValue,
               "--op drift: the windows compared, seconds (default 2.5, about one live run, or "
               "--seconds if shorter)",
               "S");
  args.Declare("-d", ArgKind::kValue,
               "element type: bf16 (default), fp16, fp32, or uint8 (cuda, all_gather); nccl-tests' "
               "names bfloat16, half and float also",
               "TYPE");
  args.Declare("--world-size", ArgKind::kValue, "ranks (default 2)", "N");
  args.Declare("--gemm-n", ArgKind::kValue,
               "overlapped GEMM size n (n x n x n); 0 (default) sizes it to match the collective",
               "N");
  args.Declare("--working-set", ArgKind::kValue,
               "host: rotate the out-of-place calls (with --op concurrent, both collectives' "
               "calls) over buffer copies covering SIZE bytes, as a live step walks many units' "
               "buffers (default 0: one hot buffer)",
               "SIZE");
  args.Declare("--trace", ArgKind::kValue,
               "host: time the collectives of TRACE's units instead of sizes -b..-e, on the "
               "executor's own buffers (see above); -n and -w count steps, and the policy flags "
               "apply",
               "FILE");
  DeclarePolicyFlags(args);
  args.Declare("--json", ArgKind::kSwitch, "print JSON instead of the table");
  args.Declare("-J", ArgKind::kValue, "also write the JSON to FILE", "FILE");
  args.Declare("--nccl-out", ArgKind::kValue,
               "also write the nccl-tests text format (for `fsdplab calibrate`) to FILE", "FILE");
  if (Status s = args.Parse(); !s.ok()) return Fail("bench-gather", s);
  if (args.help()) return PrintHelp(kUsage, kDescription, args);
  if (Status s = Run(args); !s.ok()) return Fail("bench-gather", s);
  return 0;
}

}  // namespace fsdplab::cli
