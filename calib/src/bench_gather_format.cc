#include "fsdplab/calib/bench_gather_format.h"

#include <fmt/format.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <utility>

#include "fsdplab/core/file_util.h"
#include "fsdplab/core/trace.h"

namespace fsdplab::calib {
namespace {

using json = nlohmann::ordered_json;

std::string NcclName(std::string_view op) { return std::string(op) + "_perf"; }

// The fields every bench-gather JSON document starts with.
// The fields every bench-gather JSON document starts with.
json JsonHeader(const GatherBenchOptions& o, std::string_view backend, std::string_view op) {
  json doc;
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

}  // namespace

std::string BenchGatherTable(const GatherBenchOptions& o, const std::vector<GatherBenchRow>& rows,
                             std::string_view backend) {
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

std::string BenchGatherNcclText(const GatherBenchOptions& o,
                                const std::vector<GatherBenchRow>& rows, std::string_view backend,
                                std::string_view host, long pid, std::string_view note) {
  std::string t = fmt::format("# fsdplab bench-gather --backend {} (nccl-tests format)\n", backend);
  if (!note.empty()) t += fmt::format("# {}\n", note);
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
                     r, pid, host, r, backend);
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

std::string BenchGatherJson(const GatherBenchOptions& o, const std::vector<GatherBenchRow>& rows,
                            std::string_view backend) {
  json doc = JsonHeader(o, backend, o.op);
  json list = json::array();
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
                            std::string_view backend) {
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
                           std::string_view backend) {
  json doc = JsonHeader(o, backend, "concurrent");
  json list = json::array();
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
      json& row = list.back();
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
    json wake = json::parse(StreamWakeJson(m->wake));
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

// Reads the bench-gather JSON (format "fsdplab.bench_gather", op "concurrent"); errors name the
// file and the field.
StatusOr<MeasuredContention> ReadContentionFile(const std::string& path) {
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
  if (auto w = doc.find("stream_wake_us"); w != doc.end()) {
    StatusOr<StreamWake> wake = ParseStreamWakeJson(w->dump(), "stream_wake_us");
    if (!wake.ok()) return bad(wake.status().message());
    m.stream_wake = *wake;
  }
  return m;
}

std::string DriftTable(const GatherBenchOptions& o, std::uint64_t size,
                       const std::vector<DriftSample>& samples, const DriftSummary& s,
                       double window_s, std::string_view backend) {
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
                      double window_s, std::string_view backend) {
  json doc = JsonHeader(o, backend, "drift");
  doc["collective"] = o.op;
  doc["size_bytes"] = size;
  doc["seconds"] = o.drift_seconds;
  doc["window_s"] = window_s;
  json list = json::array();
  for (const DriftSample& d : samples) {
    list.push_back({{"at_s", d.at_s}, {"calls", d.calls}, {"time_us", d.time_us}});
  }
  doc["samples"] = std::move(list);
  json windows = json::array();
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

StatusOr<std::vector<GatherBenchRow>> ReadTimedRows(const std::string& path,
                                                    const GatherBenchOptions& o) {
  if (o.op != "all_gather" && o.op != "reduce_scatter") {
    return UsageError(fmt::format("op: rows of all_gather or reduce_scatter, not {}", o.op));
  }
  FSDP_ASSIGN_OR_RETURN(const BenchType type, FindBenchType(o.dtype));
  FSDP_ASSIGN_OR_RETURN(const std::string text, ReadFile(path));
  std::vector<GatherBenchRow> rows;
  std::size_t pos = 0;
  for (int line = 1; pos < text.size(); ++line) {
    std::size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    std::string_view l(text.data() + pos, end - pos);
    pos = end + 1;
    if (const std::size_t hash = l.find('#'); hash != std::string_view::npos) {
      l = l.substr(0, hash);
    }
    unsigned long long size = 0;
    double us = 0;
    char trailing = 0;
    const std::string s(l);
    const int got = std::sscanf(s.c_str(), " %llu %lf %c", &size, &us, &trailing);
    if (got <= 0) continue;  // blank
    if (got != 2 || size == 0 || !(us > 0) || !std::isfinite(us)) {
      return InvalidInput(
          fmt::format("{}:{}: expected `SIZE_BYTES TIME_US` (a positive size and time), got '{}'",
                      path, line, s));
    }
    if (!rows.empty() && size <= rows.back().size_bytes) {
      return InvalidInput(fmt::format("{}:{}: size {} does not increase on the previous {}", path,
                                      line, size, rows.back().size_bytes));
    }
    GatherBenchRow r;
    r.size_bytes = size;
    r.count = size / (type.bytes * static_cast<std::uint64_t>(o.world_size));
    r.type = std::string(type.nccl_name);
    r.time_us = us;
    r.inplace_time_us = us;  // one timing per size: the in-place half repeats it
    FillDerivedColumns(r, o.op, o.world_size);
    rows.push_back(r);
  }
  if (rows.empty()) return InvalidInput(fmt::format("{}: no rows", path));
  return rows;
}

TraceOutputs TraceBenchOutputs(const GatherBenchOptions& o, std::string_view backend,
                               std::string_view trace_path, const std::vector<TraceBlock>& blocks,
                               std::string_view host, long pid) {
  TraceOutputs out;
  json doc = JsonHeader(o, backend, blocks.size() == 1 ? std::string_view(blocks[0].op) : "both");
  doc["dtype"] = "uint8";
  doc["trace"] = trace_path;
  doc["steps"] = {{"warmup", o.warmup}, {"timed", o.iters}};
  doc["statistic"] =
      "mean time of a call, from the last rank's arrival to its end, every rank, timed steps";
  json list = json::array();
  out.table = fmt::format(
      "# fsdplab bench-gather --trace {}: on the {} backend, {} ranks, the executor's own "
      "buffers, one collective at a time; {} warm-up and {} timed steps\n#\n"
      "# {:>14} {:>12} {:>10} {:>9} {:>9}\n",
      trace_path, backend, o.world_size, o.warmup, o.iters, "collective", "size (B)", "time (us)",
      "algbw", "busbw");
  for (const TraceBlock& b : blocks) {
    if (b.rows.empty()) continue;
    GatherBenchOptions block = o;
    block.op = b.op;
    block.dtype = "uint8";
    block.min_bytes = b.rows.front().size_bytes;
    block.max_bytes = b.rows.back().size_bytes;
    out.nccl += BenchGatherNcclText(
        block, b.rows, backend, host, pid,
        fmt::format("the collectives of {} on the executor's buffers, one at a time, {} warm-up "
                    "and {} timed steps (bench-gather --trace)",
                    trace_path, o.warmup, o.iters));
    for (const GatherBenchRow& r : b.rows) {
      list.push_back({{"op", b.op},
                      {"size_bytes", r.size_bytes},
                      {"time_us", r.time_us},
                      {"algbw_GBps", r.algbw_GBps},
                      {"busbw_GBps", r.busbw_GBps},
                      {"wrong", r.wrong}});
      out.table += fmt::format("  {:>14} {:>12} {:>10.2f} {:>9.2f} {:>9.2f}\n", b.op, r.size_bytes,
                               r.time_us, r.algbw_GBps, r.busbw_GBps);
    }
  }
  doc["rows"] = std::move(list);
  out.json = doc.dump(2) + "\n";
  return out;
}

}  // namespace fsdplab::calib
