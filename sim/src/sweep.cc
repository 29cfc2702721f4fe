#include "fsdplab/sim/sweep.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "fsdplab/core/text_format.h"
#include "fsdplab/report/report.h"
#include "fsdplab/sim/simulate_report.h"

namespace fsdplab::sim {

namespace {

SimOptions RowOptions(const Policy& policy, const SimOptions& base) {
  SimOptions opt = base;
  opt.policy = policy;
  opt.record_host_ops = false;
  opt.max_recorded_ranks = 1;
  return opt;
}

}  // namespace

SweepRow SimulatePolicy(const Trace& trace, const Policy& policy, const SimOptions& base) {
  return RowOf(policy, SimulateToReport(trace, RowOptions(policy, base)));
}

SweepRow SimulatePolicy(const std::vector<const Trace*>& rank_traces, const Policy& policy,
                        const SimOptions& base) {
  return RowOf(policy, SimulateToReport(rank_traces, RowOptions(policy, base)));
}

SweepRow RowOf(const Policy& policy, const StatusOr<SimulatedRun>& run) {
  SweepRow row;
  row.policy = policy;
  if (!run.ok()) {
    row.status = run.status();
    return row;
  }
  const SimResult* r = &run->result;
  const Report& rep = run->report;
  row.status = r->status;
  row.step_time_us = rep.summary.step_time_us;
  row.exposed_comm_us = rep.summary.exposed_comm_us;
  row.overlap_ratio = rep.summary.overlap_ratio;
  row.peak_memory_bytes = rep.summary.peak_memory_bytes;
  for (Bytes b : r->peak_memory_by_rank) row.peak_memory_bytes = std::max(row.peak_memory_bytes, b);
  for (Bytes b : r->peak_reserved_by_rank) {
    row.peak_reserved_bytes = std::max(row.peak_reserved_bytes, b);
  }
  row.peak_if_late_bytes = std::max(row.peak_memory_bytes, rep.summary.peak_if_late_bytes);
  row.lower_bound_us = rep.summary.lower_bound_us;
  for (std::size_t i = 0; i < rep.steps.size(); ++i) {
    if (IsWarmupStep(i, rep.steps.size())) continue;
    for (const PeakRace& race : rep.steps[i].peak_races) {
      if (race.early) continue;
      if (!row.nearest_race || race.margin_fraction() < row.nearest_race->margin_fraction()) {
        row.nearest_race = race;
      }
    }
  }
  return row;
}

namespace {

std::string StepText(const SweepRow& row) {
  if (!row.ok()) return "fails (" + row.status.message() + ")";
  if (row.step_time_us >= 1e6) return fmt::format("{:.2f} s", row.step_time_us / 1e6);
  return Ms(row.step_time_us);
}

}  // namespace

std::string VersusDefault(std::string_view framework_title, const SweepRow& preset,
                          std::string_view label, const SweepRow& chosen) {
  std::string line = fmt::format("{} default: {}; {}: {}", framework_title, StepText(preset), label,
                                 StepText(chosen));
  if (preset.ok() && chosen.ok() && preset.step_time_us > 0) {
    line += fmt::format(" ({:+.1f}%)",
                        100.0 * (chosen.step_time_us - preset.step_time_us) / preset.step_time_us);
  }
  return line;
}

namespace {

std::string CsvField(const std::string& s) {
  if (s.find_first_of(",\"\n") == std::string::npos) return s;
  std::string out = "\"";
  for (char c : s) {
    if (c == '"') out += '"';
    out += c;
  }
  return out + "\"";
}

// A "nice" tick step for a range (1, 2 or 5 times a power of ten).
double TickStep(double range, int target) {
  if (!(range > 0)) return 1;
  double raw = range / target;
  double p = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0, 10.0}) {
    if (m * p >= raw) return m * p;
  }
  return 10 * p;
}

}  // namespace

SweepResult RunSweep(const Trace& trace, const std::vector<Policy>& grid, const SimOptions& base,
                     const std::vector<std::string>& varied_keys, int jobs,
                     const std::function<void(int, int)>& progress) {
  SweepResult result;
  result.varied_keys = varied_keys;
  result.rows.resize(grid.size());
  int n = static_cast<int>(grid.size());
  if (jobs <= 0) jobs = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  jobs = std::max(1, std::min(jobs, n));
  std::atomic<int> next{0};
  std::mutex mu;
  std::condition_variable cv;
  int done = 0;
  auto worker = [&] {
    for (int i = next++; i < n; i = next++) {
      SweepRow row = SimulatePolicy(trace, grid[static_cast<std::size_t>(i)], base);
      std::lock_guard<std::mutex> lock(mu);
      result.rows[static_cast<std::size_t>(i)] = std::move(row);
      ++done;
      cv.notify_one();
    }
  };
  std::vector<std::thread> threads;
  for (int j = 0; j < jobs; ++j) threads.emplace_back(worker);
  {
    std::unique_lock<std::mutex> lock(mu);
    int reported = -1;
    while (done < n) {
      if (done != reported) {
        reported = done;
        if (progress) {
          lock.unlock();
          progress(reported, n);
          lock.lock();
        }
      }
      cv.wait(lock, [&] { return done != reported; });
    }
  }
  for (std::thread& t : threads) t.join();
  if (progress) progress(n, n);
  for (std::size_t i = 0; i < grid.size(); ++i) {
    for (const std::string& key : varied_keys) {
      result.rows[i].values.push_back(PolicyKeyValue(grid[i], key));
    }
  }
  return result;
}

std::vector<std::size_t> SortedByStepTime(const std::vector<SweepRow>& rows) {
  std::vector<std::size_t> idx(rows.size());
  for (std::size_t i = 0; i < rows.size(); ++i) idx[i] = i;
  std::stable_sort(idx.begin(), idx.end(), [&](std::size_t a, std::size_t b) {
    const SweepRow& x = rows[a];
    const SweepRow& y = rows[b];
    if (x.ok() != y.ok()) return x.ok();
    if (x.step_time_us != y.step_time_us) return x.step_time_us < y.step_time_us;
    return PeakFor(x, CapPeak::kSimulated) < PeakFor(y, CapPeak::kSimulated);
  });
  return idx;
}

std::vector<std::size_t> ParetoFront(const std::vector<SweepRow>& rows) {
  std::vector<std::size_t> front;
  for (std::size_t i = 0; i < rows.size(); ++i) {
    if (!rows[i].ok()) continue;
    bool dominated = false;
    for (std::size_t j = 0; j < rows.size() && !dominated; ++j) {
      if (j == i || !rows[j].ok()) continue;
      const SweepRow& a = rows[j];
      const SweepRow& b = rows[i];
      const Bytes ma = PeakFor(a, CapPeak::kSimulated);
      const Bytes mb = PeakFor(b, CapPeak::kSimulated);
      bool no_worse = a.step_time_us <= b.step_time_us && ma <= mb;
      bool better = a.step_time_us < b.step_time_us || ma < mb;
      // Identical points: keep the first one only.
      bool identical = a.step_time_us == b.step_time_us && ma == mb;
      dominated = (no_worse && better) || (identical && j < i);
    }
    if (!dominated) front.push_back(i);
  }
  std::sort(front.begin(), front.end(), [&](std::size_t a, std::size_t b) {
    return PeakFor(rows[a], CapPeak::kSimulated) < PeakFor(rows[b], CapPeak::kSimulated);
  });
  return front;
}

namespace {

// What the cap holds when the tensors' peak is `tensors` instead of the row's: the reserved peak
// plus the extra tensor bytes (the allocator's rounding of them left out).
Bytes HeldAtTensorPeak(const SweepRow& row, Bytes tensors) {
  return PeakFor(row, CapPeak::kSimulated) + (tensors - std::min(tensors, row.peak_memory_bytes));
}

}  // namespace

std::string FragileUnderCap(const SweepRow& row, Bytes cap, const Model& model) {
  if (!row.nearest_race) return "";
  const PeakRace& race = *row.nearest_race;
  const Bytes held_if = HeldAtTensorPeak(row, race.peak_if_bytes);
  if (held_if <= cap) return "";
  const std::string_view kind = OpKindName(race.op.kind);
  const char* article = kind.find_first_of("aeiou") == 0 ? "an" : "a";
  if (race.gates) {
    return fmt::format(
        "Fragile: {} {} of {} {} sooner than simulated ({:.0f}% of it) lets the compute that "
        "waited for it allocate beside earlier buffers: reserved {}, over the cap.",
        article, kind, model.NameOf(race.op.unit), Ms(race.margin_us),
        100.0 * race.margin_fraction(), GiB(held_if));
  }
  return fmt::format(
      "Fragile: {} {} of {} {:.0f}% slower than simulated ({} late) puts the reserved memory at "
      "{}, over the cap.",
      article, kind, model.NameOf(race.op.unit), 100.0 * race.margin_fraction(), Ms(race.margin_us),
      GiB(held_if));
}

StatusOr<CapPeak> ParseCapPeak(std::string_view text, std::string_view flag) {
  if (text == "simulated") return CapPeak::kSimulated;
  if (text == "late") return CapPeak::kOneLate;
  return UsageError(fmt::format("{}: '{}' (expected simulated or late)", flag, text));
}

Bytes PeakFor(const SweepRow& row, CapPeak which) {
  if (which == CapPeak::kOneLate) return HeldAtTensorPeak(row, row.peak_if_late_bytes);
  return std::max(row.peak_reserved_bytes, row.peak_memory_bytes);
}

bool FitsUnderCap(const SweepRow& row, Bytes cap, CapPeak which) {
  return row.ok() && PeakFor(row, which) <= cap;
}

bool FitsOnDevice(SweepRow& row, Bytes cap, CapPeak which,
                  const std::function<SweepRow()>& run_capped) {
  if (!row.ok() || FitsUnderCap(row, cap, which)) return FitsUnderCap(row, cap, which);
  if (row.peak_memory_bytes > cap || row.peak_reserved_bytes <= row.peak_memory_bytes) {
    return false;  // the tensors alone do not fit, or no cache to release
  }
  const SweepRow capped = run_capped();
  const auto same = [](TimeUs a, TimeUs b) { return std::abs(a - b) <= 1e-9 * std::max(1.0, a); };
  if (!capped.ok() || !same(capped.step_time_us, row.step_time_us) ||
      !same(capped.exposed_comm_us, row.exposed_comm_us)) {
    return false;
  }
  row.peak_reserved_bytes = capped.peak_reserved_bytes;
  return FitsUnderCap(row, cap, which);
}

std::optional<std::size_t> BestUnderCap(const std::vector<SweepRow>& rows, Bytes cap,
                                        CapPeak which) {
  std::optional<std::size_t> best;
  for (std::size_t i : SortedByStepTime(rows)) {
    if (FitsUnderCap(rows[i], cap, which)) {
      best = i;
      break;
    }
  }
  return best;
}

std::string SweepCsv(const SweepResult& result) {
  std::string out;
  for (const std::string& k : result.varied_keys) out += CsvField(k) + ",";
  out +=
      "step_time_us,exposed_comm_us,overlap_ratio,peak_memory_bytes,peak_memory_if_late_bytes,"
      "peak_reserved_bytes,cap_holds_if_late_bytes,lower_bound_us,status\n";
  for (std::size_t i : SortedByStepTime(result.rows)) {
    const SweepRow& r = result.rows[i];
    for (const std::string& v : r.values) out += CsvField(v) + ",";
    out += fmt::format(
        "{:.3f},{:.3f},{:.4f},{},{},{},{},{:.3f},{}\n", r.step_time_us, r.exposed_comm_us,
        r.overlap_ratio, r.peak_memory_bytes, std::max(r.peak_memory_bytes, r.peak_if_late_bytes),
        PeakFor(r, CapPeak::kSimulated), PeakFor(r, CapPeak::kOneLate), r.lower_bound_us,
        CsvField(r.ok() ? std::string("ok") : r.status.ToString()));
  }
  return out;
}

std::string SweepSvg(const SweepResult& result, std::optional<Bytes> cap, const std::string& title,
                     CapPeak which) {
  constexpr double kW = 760, kH = 480, kLeft = 80, kRight = 30, kTop = 50, kBottom = 70;
  const std::vector<SweepRow>& rows = result.rows;
  double gib = static_cast<double>(1ull << 30);
  double xmin = 1e300, xmax = -1e300, ymin = 1e300, ymax = -1e300;
  for (const SweepRow& r : rows) {
    if (!r.ok()) continue;
    double x = static_cast<double>(PeakFor(r, CapPeak::kSimulated)) / gib;
    double y = r.step_time_us / 1e3;
    xmin = std::min(xmin, x);
    xmax = std::max(xmax, x);
    ymin = std::min(ymin, y);
    ymax = std::max(ymax, y);
  }
  if (cap) {
    xmin = std::min(xmin, static_cast<double>(*cap) / gib);
    xmax = std::max(xmax, static_cast<double>(*cap) / gib);
  }
  if (xmin > xmax) xmin = 0, xmax = 1, ymin = 0, ymax = 1;  // nothing succeeded
  auto pad = [](double& lo, double& hi) {
    double span = hi - lo;
    if (span <= 0) span = std::max(std::abs(hi), 1e-3);
    bool non_negative = lo >= 0;
    lo -= 0.08 * span;
    hi += 0.08 * span;
    if (non_negative) lo = std::max(lo, 0.0);
  };
  pad(xmin, xmax);
  pad(ymin, ymax);
  double pw = kW - kLeft - kRight, ph = kH - kTop - kBottom;
  auto sx = [&](double x) { return kLeft + (x - xmin) / (xmax - xmin) * pw; };
  auto sy = [&](double y) { return kTop + ph - (y - ymin) / (ymax - ymin) * ph; };

  std::string svg = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{0}\" height=\"{1}\" viewBox=\"0 0 {0} "
      "{1}\" font-family=\"sans-serif\" font-size=\"12\">\n"
      "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
      "<text x=\"{2}\" y=\"24\" font-size=\"15\" text-anchor=\"middle\">{3}</text>\n",
      kW, kH, kW / 2, XmlEscape(title));
  // Axes, ticks, grid.
  svg += fmt::format(
      "<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"none\" stroke=\"black\"/>\n",
      kLeft, kTop, pw, ph);
  double xs = TickStep(xmax - xmin, 6);
  for (double t = std::ceil(xmin / xs) * xs; t <= xmax + 1e-12; t += xs) {
    svg += fmt::format(
        "<line x1=\"{0:.1f}\" y1=\"{1}\" x2=\"{0:.1f}\" y2=\"{2}\" stroke=\"#ddd\"/>"
        "<text x=\"{0:.1f}\" y=\"{3}\" text-anchor=\"middle\">{4:g}</text>\n",
        sx(t), kTop, kTop + ph, kTop + ph + 16, std::round(t / xs) * xs);
  }
  double ys = TickStep(ymax - ymin, 6);
  for (double t = std::ceil(ymin / ys) * ys; t <= ymax + 1e-12; t += ys) {
    svg += fmt::format(
        "<line x1=\"{0}\" y1=\"{1:.1f}\" x2=\"{2}\" y2=\"{1:.1f}\" stroke=\"#ddd\"/>"
        "<text x=\"{3}\" y=\"{4:.1f}\" text-anchor=\"end\">{5:g}</text>\n",
        kLeft, sy(t), kLeft + pw, kLeft - 6, sy(t) + 4, std::round(t / ys) * ys);
  }
  svg += fmt::format(
      "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">memory per rank (GiB): what the caching "
      "allocator reserves</text>\n"
      "<text x=\"18\" y=\"{}\" text-anchor=\"middle\" transform=\"rotate(-90 18 {})\">step time "
      "(ms)</text>\n",
      kLeft + pw / 2, kH - 30, kTop + ph / 2, kTop + ph / 2);
  if (cap) {
    double x = sx(static_cast<double>(*cap) / gib);
    svg += fmt::format(
        "<line x1=\"{0:.1f}\" y1=\"{1}\" x2=\"{0:.1f}\" y2=\"{2}\" stroke=\"#c00\" "
        "stroke-dasharray=\"6 4\"/><text x=\"{3:.1f}\" y=\"{4}\" fill=\"#c00\">memory cap</text>\n",
        x, kTop, kTop + ph, x + 4, kTop + 14);
  }
  // Pareto front.
  std::vector<std::size_t> front = ParetoFront(rows);
  if (front.size() > 1) {
    std::string pts;
    for (std::size_t i : front) {
      pts += fmt::format("{:.1f},{:.1f} ",
                         sx(static_cast<double>(PeakFor(rows[i], CapPeak::kSimulated)) / gib),
                         sy(rows[i].step_time_us / 1e3));
    }
    svg += fmt::format("<polyline points=\"{}\" fill=\"none\" stroke=\"#1f77b4\"/>\n", pts);
  }
  std::vector<bool> on_front(rows.size(), false);
  for (std::size_t i : front) on_front[i] = true;
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const SweepRow& r = rows[i];
    if (!r.ok()) continue;
    std::string label;
    for (std::size_t k = 0; k < r.values.size() && k < result.varied_keys.size(); ++k) {
      label += fmt::format("{}{}={}", k ? " " : "", result.varied_keys[k], r.values[k]);
    }
    svg += fmt::format(
        "<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"{}\" fill=\"{}\"><title>{}: {:.3f} ms, {:.3f} "
        "GiB</title></circle>\n",
        sx(static_cast<double>(PeakFor(r, CapPeak::kSimulated)) / gib), sy(r.step_time_us / 1e3),
        on_front[i] ? 5 : 3.5, on_front[i] ? "#1f77b4" : "#999", XmlEscape(label),
        r.step_time_us / 1e3, static_cast<double>(PeakFor(r, CapPeak::kSimulated)) / gib);
  }
  if (cap) {
    if (std::optional<std::size_t> best = BestUnderCap(rows, *cap, which)) {
      const SweepRow& r = rows[*best];
      svg += fmt::format(
          "<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"9\" fill=\"none\" stroke=\"#2ca02c\" "
          "stroke-width=\"2\"/>\n",
          sx(static_cast<double>(PeakFor(r, CapPeak::kSimulated)) / gib), sy(r.step_time_us / 1e3));
    }
  }
  // Legend.
  double lx = kLeft + pw - 230, ly = kTop + 10;
  svg += fmt::format(
      "<circle cx=\"{0}\" cy=\"{1}\" r=\"5\" fill=\"#1f77b4\"/><text x=\"{2}\" y=\"{3}\">Pareto "
      "front (nothing is both faster and smaller)</text>\n"
      "<circle cx=\"{0}\" cy=\"{4}\" r=\"3.5\" fill=\"#999\"/><text x=\"{2}\" y=\"{5}\">other "
      "policies</text>\n",
      lx, ly, lx + 10, ly + 4, ly + 18, ly + 22);
  if (cap) {
    svg += fmt::format(
        "<circle cx=\"{0}\" cy=\"{1}\" r=\"7\" fill=\"none\" stroke=\"#2ca02c\" "
        "stroke-width=\"2\"/><text x=\"{2}\" y=\"{3}\">fastest under the cap</text>\n",
        lx, ly + 36, lx + 10, ly + 40);
  }
  svg += "</svg>\n";
  return svg;
}

}  // namespace fsdplab::sim
