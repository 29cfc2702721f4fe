#include "fsdplab/sim/sweep.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
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

namespace {

// The fields of one CSV line (SweepCsv's quoting: a field with a comma, quote or newline is
// quoted, quotes doubled); nullopt when a quote is left open.
std::optional<std::vector<std::string>> CsvLine(std::string_view line) {
  std::vector<std::string> out(1);
  bool quoted = false;
  for (std::size_t i = 0; i < line.size(); ++i) {
    const char c = line[i];
    if (quoted) {
      if (c == '"' && i + 1 < line.size() && line[i + 1] == '"') {
        out.back() += '"';
        ++i;
      } else if (c == '"') {
        quoted = false;
      } else {
        out.back() += c;
      }
    } else if (c == '"') {
      quoted = true;
    } else if (c == ',') {
      out.emplace_back();
    } else if (c != '\r') {
      out.back() += c;
    }
  }
  if (quoted) return std::nullopt;
  return out;
}

std::string RowLabel(const SweepResult& result, const SweepRow& row) {
  std::string label;
  for (std::size_t k = 0; k < row.values.size() && k < result.varied_keys.size(); ++k) {
    label += fmt::format("{}{}={}", k ? " " : "", result.varied_keys[k], row.values[k]);
  }
  return label.empty() ? std::string("(the one policy)") : label;
}

}  // namespace

StatusOr<SweepResult> ParseSweepCsv(std::string_view text, std::string_view file) {
  static constexpr std::string_view kFigures[] = {"step_time_us",
                                                  "exposed_comm_us",
                                                  "overlap_ratio",
                                                  "peak_memory_bytes",
                                                  "peak_memory_if_late_bytes",
                                                  "peak_reserved_bytes",
                                                  "cap_holds_if_late_bytes",
                                                  "lower_bound_us",
                                                  "status"};
  constexpr std::size_t kN = std::size(kFigures);
  SweepResult result;
  std::size_t line_no = 0;
  std::size_t columns = 0;
  std::size_t pos = 0;
  while (pos < text.size()) {
    std::size_t nl = text.find('\n', pos);
    if (nl == std::string_view::npos) nl = text.size();
    const std::string_view line = text.substr(pos, nl - pos);
    pos = nl + 1;
    ++line_no;
    if (line.empty() || line == "\r") continue;
    std::optional<std::vector<std::string>> f = CsvLine(line);
    if (!f) return InvalidInput(fmt::format("{}:{}: a quoted field is not closed", file, line_no));
    if (columns == 0) {
      columns = f->size();
      if (columns < kN || !std::equal(std::begin(kFigures), std::end(kFigures), f->end() - kN)) {
        return InvalidInput(fmt::format(
            "{}:{}: not a sweep's CSV (`fsdplab sweep --csv`): the header must end with {}", file,
            line_no, fmt::join(kFigures, ",")));
      }
      result.varied_keys.assign(f->begin(), f->end() - kN);
      continue;
    }
    if (f->size() != columns) {
      return InvalidInput(
          fmt::format("{}:{}: {} fields, the header has {}", file, line_no, f->size(), columns));
    }
    SweepRow row;
    const std::size_t k = columns - kN;
    row.values.assign(f->begin(), f->begin() + static_cast<std::ptrdiff_t>(k));
    double v[kN - 1] = {};
    for (std::size_t i = 0; i + 1 < kN; ++i) {
      const std::string& field = (*f)[k + i];
      char* end = nullptr;
      v[i] = std::strtod(field.c_str(), &end);
      if (field.empty() || end != field.c_str() + field.size() || !std::isfinite(v[i]) ||
          v[i] < 0) {
        return InvalidInput(
            fmt::format("{}:{}: {}: '{}' is not a number >= 0", file, line_no, kFigures[i], field));
      }
    }
    row.step_time_us = v[0];
    row.exposed_comm_us = v[1];
    row.overlap_ratio = v[2];
    row.peak_memory_bytes = static_cast<Bytes>(v[3]);
    row.peak_if_late_bytes = static_cast<Bytes>(v[4]);
    // What the cap holds: the reserved bytes (or, without the allocator model, the tensors').
    row.peak_reserved_bytes =
        static_cast<Bytes>(v[5]) == row.peak_memory_bytes ? 0 : static_cast<Bytes>(v[5]);
    row.lower_bound_us = v[7];
    const std::string& status = f->back();
    if (status != "ok") row.status = Status(StatusCode::kStepFailed, status);
    result.rows.push_back(std::move(row));
  }
  if (columns == 0) return InvalidInput(fmt::format("{}: empty, not a sweep's CSV", file));
  result.policies_known = false;
  return result;
}

SweepResult SweepOfPolicies(std::vector<SweepRow> rows) {
  SweepResult result;
  std::vector<std::string> keys;
  for (std::string_view key : PolicyKeys()) keys.emplace_back(key);
  keys.emplace_back("units");
  auto value = [](const SweepRow& row, const std::string& key) {
    if (key != "units") return PolicyKeyValue(row.policy, key);
    const std::string units = UnitOverridesText(row.policy);
    return units.empty() ? std::string("none") : units;
  };
  for (const std::string& key : keys) {
    std::set<std::string> seen;
    for (const SweepRow& row : rows) seen.insert(value(row, key));
    if (seen.size() > 1) result.varied_keys.push_back(key);
  }
  for (SweepRow& row : rows) {
    row.values.clear();
    for (const std::string& key : result.varied_keys) row.values.push_back(value(row, key));
  }
  result.rows = std::move(rows);
  return result;
}

nlohmann::ordered_json SweepJson(const SweepResult& result, std::optional<Bytes> cap, CapPeak which,
                                 std::optional<std::size_t> chosen, std::string_view kind,
                                 std::string_view chosen_why, std::string_view title) {
  using Json = nlohmann::ordered_json;
  std::vector<bool> on_front(result.rows.size(), false);
  for (std::size_t i : ParetoFront(result.rows)) on_front[i] = true;
  std::vector<std::size_t> rank(result.rows.size(), 0);  // the row of the table and CSV
  const std::vector<std::size_t> order = SortedByStepTime(result.rows);
  for (std::size_t n = 0; n < order.size(); ++n) rank[order[n]] = n + 1;
  Json rows = Json::array();
  for (std::size_t i = 0; i < result.rows.size(); ++i) {
    const SweepRow& r = result.rows[i];
    Json row{{"label", RowLabel(result, r)}, {"rank", rank[i]}, {"values", r.values}};
    row["policy"] = result.policies_known ? Json::parse(PolicyToJson(r.policy)) : Json(nullptr);
    row["ok"] = r.ok();
    row["error"] = r.ok() ? "" : r.status.message();
    row["step_time_us"] = r.step_time_us;
    row["exposed_comm_us"] = r.exposed_comm_us;
    row["overlap_ratio"] = r.overlap_ratio;
    row["peak_memory_bytes"] = r.peak_memory_bytes;
    row["peak_memory_if_late_bytes"] = std::max(r.peak_memory_bytes, r.peak_if_late_bytes);
    row["memory_bytes"] = PeakFor(r, CapPeak::kSimulated);
    row["cap_holds_bytes"] = PeakFor(r, which);
    row["lower_bound_us"] = r.lower_bound_us;
    row["pareto"] = static_cast<bool>(on_front[i]);
    row["fits_cap"] = cap ? Json(r.ok() && FitsUnderCap(r, *cap, which)) : Json(nullptr);
    rows.push_back(std::move(row));
  }
  Json doc{{"format", "fsdplab.sweep"},
           {"version", 1},
           {"kind", kind},
           {"title", title},
           {"varied_keys", result.varied_keys},
           {"memory_cap_bytes", cap ? Json(*cap) : Json(nullptr)},
           {"cap_peak", which == CapPeak::kOneLate ? "late" : "simulated"},
           {"chosen", chosen ? Json(*chosen) : Json(nullptr)},
           {"chosen_why", chosen ? Json(chosen_why) : Json(nullptr)},
           {"rows", rows}};
  return doc;
}

std::string SweepToJson(const SweepResult& result, std::optional<Bytes> cap, CapPeak which,
                        std::optional<std::size_t> chosen, std::string_view kind,
                        std::string_view chosen_why, std::string_view title) {
  return SweepJson(result, cap, which, chosen, kind, chosen_why, title).dump(2) + "\n";
}

std::string SweepSvg(const SweepResult& result, std::optional<Bytes> cap, const std::string& title,
                     CapPeak which) {
  // The plot, then below it the x axis's title, the legend (one entry a row, so no entry runs
  // past the right edge) and what the points' labels are.
  constexpr double kW = 800, kLeft = 80, kRight = 40, kTop = 50, kPlotH = 360;
  // Text is measured at about 0.6 of the font size per character (sans-serif at 11-12 px).
  auto text_width = [](std::string_view text, double font) {
    return 0.6 * font * static_cast<double>(text.size());
  };
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
  const double pw = kW - kLeft - kRight, ph = kPlotH;
  auto sx = [&](double x) { return kLeft + (x - xmin) / (xmax - xmin) * pw; };
  auto sy = [&](double y) { return kTop + ph - (y - ymin) / (ymax - ymin) * ph; };

  // The legend's rows and the labels' key decide the height.
  struct Entry {
    std::string mark, text;
  };
  std::vector<Entry> legend = {
      {"<circle cx=\"{0}\" cy=\"{1}\" r=\"5\" fill=\"#1f77b4\"/>",
       "Pareto front (nothing is both faster and smaller)"},
      {"<circle cx=\"{0}\" cy=\"{1}\" r=\"3.5\" fill=\"#999\"/>", "other policies"}};
  std::optional<std::size_t> best;
  if (cap) {
    best = BestUnderCap(rows, *cap, which);
    legend.push_back(
        {"<circle cx=\"{0}\" cy=\"{1}\" r=\"7\" fill=\"none\" stroke=\"#2ca02c\" "
         "stroke-width=\"2\"/>",
         "fastest under the cap"});
    legend.push_back(
        {"<line x1=\"{2}\" y1=\"{1}\" x2=\"{3}\" y2=\"{1}\" stroke=\"#c00\" "
         "stroke-dasharray=\"6 4\"/>",
         fmt::format("memory cap ({:.3f} GiB)", static_cast<double>(*cap) / gib)});
  }
  // Each point is labelled with its varied values ("1/2"), or "#n" (its row of the CSV's
  // order) when there are many or they are long; points on one spot share a label.
  std::size_t ok_rows = 0;
  bool short_values = true;
  for (const SweepRow& r : rows) {
    if (!r.ok()) continue;
    ++ok_rows;
    short_values = short_values && fmt::format("{}", fmt::join(r.values, "/")).size() <= 14;
  }
  const bool values_as_labels = ok_rows <= 40 && short_values && !result.varied_keys.empty();
  const std::string key =
      values_as_labels
          ? fmt::format("points labelled {}", fmt::join(result.varied_keys, "/"))
          : "points labelled #n: the row of the sweep's table (sorted by step time) and CSV";
  const double axis_title_y = kTop + ph + 40;
  const double legend_y = axis_title_y + 26;
  const double kH = legend_y + 18.0 * static_cast<double>(legend.size()) + 30;

  std::string svg = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{0}\" height=\"{1}\" viewBox=\"0 0 {0} "
      "{1}\" font-family=\"sans-serif\" font-size=\"12\">\n"
      "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
      "<text x=\"{2}\" y=\"24\" font-size=\"15\" text-anchor=\"middle\">{3}</text>\n",
      kW, kH, kW / 2, XmlEscape(title));
  // Axes, ticks, grid. A tick label that would pass the picture's edge is anchored at its end.
  svg += fmt::format(
      "<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"none\" stroke=\"black\"/>\n",
      kLeft, kTop, pw, ph);
  double xs = TickStep(xmax - xmin, 6);
  for (double t = std::ceil(xmin / xs) * xs; t <= xmax + 1e-12; t += xs) {
    const std::string label = fmt::format("{:g}", std::round(t / xs) * xs);
    const double half = text_width(label, 12) / 2;
    const char* anchor = sx(t) + half > kW - 2 ? "end" : sx(t) - half < 2 ? "start" : "middle";
    svg += fmt::format(
        "<line x1=\"{0:.1f}\" y1=\"{1}\" x2=\"{0:.1f}\" y2=\"{2}\" stroke=\"#ddd\"/>"
        "<text x=\"{0:.1f}\" y=\"{3}\" text-anchor=\"{4}\">{5}</text>\n",
        sx(t), kTop, kTop + ph, kTop + ph + 16, anchor, label);
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
      kLeft + pw / 2, axis_title_y, kTop + ph / 2, kTop + ph / 2);
  if (cap) {
    double x = sx(static_cast<double>(*cap) / gib);
    svg += fmt::format(
        "<line x1=\"{0:.1f}\" y1=\"{1}\" x2=\"{0:.1f}\" y2=\"{2}\" stroke=\"#c00\" "
        "stroke-dasharray=\"6 4\"/>\n",
        x, kTop, kTop + ph);
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
  std::vector<std::size_t> rank_of(rows.size(), 0);  // "#n": the row in the table's order
  {
    const std::vector<std::size_t> order = SortedByStepTime(rows);
    for (std::size_t n = 0; n < order.size(); ++n) rank_of[order[n]] = n + 1;
  }
  std::map<std::pair<long, long>, std::pair<std::pair<double, double>, std::vector<std::string>>>
      spots;  // labels by the point's pixel
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const SweepRow& r = rows[i];
    if (!r.ok()) continue;
    const double x = sx(static_cast<double>(PeakFor(r, CapPeak::kSimulated)) / gib);
    const double y = sy(r.step_time_us / 1e3);
    svg += fmt::format(
        "<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"{}\" fill=\"{}\"><title>#{} {}: {:.3f} ms, "
        "{:.3f} GiB</title></circle>\n",
        x, y, on_front[i] ? 5 : 3.5, on_front[i] ? "#1f77b4" : "#999", rank_of[i],
        XmlEscape(RowLabel(result, r)), r.step_time_us / 1e3,
        static_cast<double>(PeakFor(r, CapPeak::kSimulated)) / gib);
    auto& spot = spots[{std::lround(x), std::lround(y)}];
    spot.first = {x, y};
    spot.second.push_back(values_as_labels ? fmt::format("{}", fmt::join(r.values, "/"))
                                           : fmt::format("#{}", rank_of[i]));
  }
  for (const auto& [pixel, spot] : spots) {
    const std::string text = fmt::format("{}", fmt::join(spot.second, ", "));
    const auto [x, y] = spot.first;
    const bool left = x + 7 + text_width(text, 11) > kLeft + pw;
    svg += fmt::format(
        "<text x=\"{:.1f}\" y=\"{:.1f}\" font-size=\"11\" fill=\"#333\" "
        "text-anchor=\"{}\">{}</text>\n",
        left ? x - 7 : x + 7, y - 6, left ? "end" : "start", XmlEscape(text));
  }
  if (best) {
    const SweepRow& r = rows[*best];
    svg += fmt::format(
        "<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"9\" fill=\"none\" stroke=\"#2ca02c\" "
        "stroke-width=\"2\"/>\n",
        sx(static_cast<double>(PeakFor(r, CapPeak::kSimulated)) / gib), sy(r.step_time_us / 1e3));
  }
  // Legend, below the axis title.
  for (std::size_t k = 0; k < legend.size(); ++k) {
    const double y = legend_y + 18.0 * static_cast<double>(k);
    svg += fmt::format(fmt::runtime(legend[k].mark), kLeft + 8, y - 4, kLeft, kLeft + 16);
    svg += fmt::format("<text x=\"{}\" y=\"{}\">{}</text>\n", kLeft + 24, y,
                       XmlEscape(legend[k].text));
  }
  svg += fmt::format("<text x=\"{}\" y=\"{}\" fill=\"#555\">{}</text>\n", kLeft,
                     legend_y + 18.0 * static_cast<double>(legend.size()) + 4, XmlEscape(key));
  svg += "</svg>\n";
  return svg;
}

std::optional<std::size_t> ChosenRow(const std::vector<SweepRow>& rows, std::optional<Bytes> cap,
                                     CapPeak which) {
  if (cap) return BestUnderCap(rows, *cap, which);
  const std::vector<std::size_t> order = SortedByStepTime(rows);
  if (!order.empty() && rows[order.front()].ok()) return order.front();
  return std::nullopt;
}

}  // namespace fsdplab::sim
