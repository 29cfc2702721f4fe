// fsdplab compare SIM.json MEASURED.json: predicted vs measured, per step and per op.
//
// Both files are fsdplab.report v1 documents (`simulate -o`, `run -o`). Steps are matched by
// index; ops (the report's "ops": computes and collectives of the lowest rank) by kind, unit,
// phase, step, microbatch and their occurrence among ops with those keys.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <nlohmann/json.hpp>
#include <tuple>

#include "cli_common.h"
#include "commands.h"
#include "fsdplab/core/file_util.h"

namespace fsdplab::cli {
namespace {

using Json = nlohmann::json;
using OJson = nlohmann::ordered_json;

constexpr std::string_view kUsage =
    "fsdplab compare PREDICTED.json MEASURED.json [--threshold PCT] [--top N] [--json] [-o FILE]";
constexpr std::string_view kDescription =
    "Puts a simulated report (fsdplab simulate -o) beside a measured one (fsdplab run -o): per\n"
    "step the step time, compute and exposed communication with the error of the prediction\n"
    "(error % = (predicted - measured) / measured), per op (every compute and collective of the\n"
    "first rank, matched by kind, unit, phase, step, microbatch and occurrence) the duration and\n"
    "its error, the ops predicted worst, the error per op kind, and one verdict line: whether\n"
    "the mean step time (steps after the first) is predicted within --threshold percent\n"
    "(default 5).";

StatusOr<Json> ReadReport(const std::string& path) {
  FSDP_ASSIGN_OR_RETURN(std::string text, ReadFile(path));
  Json doc = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded() || !doc.is_object()) {
    return InvalidInput(fmt::format("{}: not a JSON document", path));
  }
  if (doc.value("format", "") != "fsdplab.report") {
    return InvalidInput(fmt::format("{}: format is '{}', expected 'fsdplab.report'", path,
                                    doc.value("format", "")));
  }
  if (!doc.contains("version") || !doc["version"].is_number_integer() || doc["version"] != 1) {
    return InvalidInput(fmt::format("{}: version must be 1", path));
  }
  if (!doc.contains("steps") || !doc["steps"].is_array()) {
    return InvalidInput(fmt::format("{}: steps: missing or not a list", path));
  }
  for (std::size_t i = 0; i < doc["steps"].size(); ++i) {
    const Json& s = doc["steps"][i];
    for (const char* key : {"index", "time_us"}) {
      if (!s.is_object() || !s.contains(key) || !s[key].is_number()) {
        return InvalidInput(fmt::format("{}: steps[{}].{}: missing or not a number", path, i, key));
      }
    }
  }
  if (!doc.contains("summary") || !doc["summary"].is_object() ||
      !doc["summary"].contains("step_time_us") || !doc["summary"]["step_time_us"].is_number()) {
    return InvalidInput(fmt::format("{}: summary.step_time_us: missing or not a number", path));
  }
  return doc;
}

double Num(const Json& j, const char* key) {
  return j.contains(key) && j[key].is_number() ? j[key].get<double>() : 0.0;
}

double ErrorPct(double predicted, double measured) {
  if (measured == 0) return predicted == 0 ? 0 : INFINITY;
  return 100.0 * (predicted - measured) / measured;
}

using OpKey = std::tuple<std::string, std::string, std::string, int, int, int>;

// kind, unit, phase, step, microbatch -> occurrence.
std::map<OpKey, const Json*> IndexOps(const Json& report) {
  std::map<OpKey, const Json*> out;
  std::map<std::tuple<std::string, std::string, std::string, int, int>, int> seen;
  if (!report.contains("ops") || !report["ops"].is_array()) return out;
  for (const Json& op : report["ops"]) {
    const std::string kind = op.value("kind", "");
    const std::string unit =
        op.contains("unit") && op["unit"].is_string() ? op["unit"].get<std::string>() : "(none)";
    const std::string phase = kind == "compute" ? op.value("phase", "") : "";
    const int step = op.value("step", 0);
    const int mb = op.value("microbatch", 0);
    const int n = seen[{kind, unit, phase, step, mb}]++;
    out[{kind, unit, phase, step, mb, n}] = &op;
  }
  return out;
}

struct OpRow {
  OpKey key;
  double predicted = 0;
  double measured = 0;
  double error_pct = 0;
};

Status Run(const Args& args) {
  if (args.positionals().size() != 2) {
    return UsageError("expected PREDICTED.json and MEASURED.json (see --help)");
  }
  double threshold = 5;
  if (auto v = args.Get("--threshold")) {
    FSDP_ASSIGN_OR_RETURN(threshold, ParseDouble(*v, "--threshold"));
    if (!(threshold > 0)) return UsageError("--threshold: must be positive");
  }
  std::int64_t top = 10;
  if (auto v = args.Get("--top")) {
    FSDP_ASSIGN_OR_RETURN(top, ParseInt(*v, "--top"));
    if (top < 0) return UsageError("--top: must not be negative");
  }
  FSDP_ASSIGN_OR_RETURN(Json pred, ReadReport(args.positionals()[0]));
  FSDP_ASSIGN_OR_RETURN(Json meas, ReadReport(args.positionals()[1]));

  OJson out;
  out["format"] = "fsdplab.compare";
  out["version"] = 1;
  out["predicted"] = {{"file", args.positionals()[0]}, {"source", pred.value("source", "")}};
  out["measured"] = {{"file", args.positionals()[1]}, {"source", meas.value("source", "")}};
  std::vector<std::string> warnings;
  if (!meas.value("measured", false))
    warnings.push_back("the second report is not marked measured");
  if (pred.value("measured", false)) warnings.push_back("the first report is marked measured");
  if (pred.contains("policy") && meas.contains("policy") && pred["policy"] != meas["policy"]) {
    warnings.push_back("the two reports ran different policies");
  }

  // Per step.
  std::map<int, const Json*> msteps;
  for (const Json& s : meas["steps"]) msteps[s["index"].get<int>()] = &s;
  OJson steps = OJson::array();
  std::string text =
      "per step (predicted vs measured, error = (predicted - measured) / measured)\n";
  text += fmt::format("  {:>4}  {:>12} {:>12} {:>8}  {:>12} {:>12}  {:>12} {:>12}  {:>12} {:>12}\n",
                      "step", "time pred", "time meas", "error", "compute pred", "compute meas",
                      "exposed pred", "exposed meas", "idle pred", "idle meas");
  for (const Json& s : pred["steps"]) {
    const int index = s["index"].get<int>();
    auto it = msteps.find(index);
    if (it == msteps.end()) {
      warnings.push_back(fmt::format("step {} is only in the predicted report", index));
      continue;
    }
    const Json& m = *it->second;
    const double e = ErrorPct(Num(s, "time_us"), Num(m, "time_us"));
    steps.push_back({{"index", index},
                     {"predicted_us", Num(s, "time_us")},
                     {"measured_us", Num(m, "time_us")},
                     {"error_pct", e},
                     {"compute_predicted_us", Num(s, "compute_us")},
                     {"compute_measured_us", Num(m, "compute_us")},
                     {"exposed_predicted_us", Num(s, "exposed_comm_us")},
                     {"exposed_measured_us", Num(m, "exposed_comm_us")},
                     {"idle_predicted_us", Num(s, "idle_us")},
                     {"idle_measured_us", Num(m, "idle_us")}});
    text += fmt::format(
        "  {:>4}  {:>12.1f} {:>12.1f} {:>+7.1f}%  {:>12.1f} {:>12.1f}  {:>12.1f} "
        "{:>12.1f}  {:>12.1f} {:>12.1f}\n",
        index, Num(s, "time_us"), Num(m, "time_us"), e, Num(s, "compute_us"), Num(m, "compute_us"),
        Num(s, "exposed_comm_us"), Num(m, "exposed_comm_us"), Num(s, "idle_us"), Num(m, "idle_us"));
  }
  out["steps"] = steps;

  // Per op.
  const auto pops = IndexOps(pred);
  const auto mops = IndexOps(meas);
  std::vector<OpRow> rows;
  int only_pred = 0;
  for (const auto& [key, op] : pops) {
    auto it = mops.find(key);
    if (it == mops.end()) {
      ++only_pred;
      continue;
    }
    OpRow r{key, Num(*op, "dur_us"), Num(*it->second, "dur_us"), 0};
    r.error_pct = ErrorPct(r.predicted, r.measured);
    rows.push_back(r);
  }
  const int only_meas = static_cast<int>(mops.size()) - static_cast<int>(rows.size());
  if (pops.empty() || mops.empty()) {
    warnings.push_back("a report has no \"ops\" section: no per-op comparison");
  } else if (only_pred > 0 || only_meas > 0) {
    warnings.push_back(fmt::format("{} ops only predicted, {} only measured (different schedules?)",
                                   only_pred, only_meas));
  }
  // Per kind: durations summed, so long ops weigh more.
  std::map<std::string, std::pair<double, double>> by_kind;
  for (const OpRow& r : rows) {
    std::string kind =
        std::get<0>(r.key) == "compute" ? "compute " + std::get<2>(r.key) : std::get<0>(r.key);
    by_kind[kind].first += r.predicted;
    by_kind[kind].second += r.measured;
  }
  OJson kinds = OJson::array();
  text += "\nper op kind (summed durations)\n";
  for (const auto& [kind, pm] : by_kind) {
    const double e = ErrorPct(pm.first, pm.second);
    kinds.push_back(
        {{"kind", kind}, {"predicted_us", pm.first}, {"measured_us", pm.second}, {"error_pct", e}});
    text += fmt::format("  {:<20} {:>12.1f} {:>12.1f} {:>+8.1f}%\n", kind, pm.first, pm.second, e);
  }
  out["op_kinds"] = kinds;
  // Worst ops by absolute difference (a 1 us op 50% off matters less than a 1 ms op 10% off).
  std::vector<OpRow> worst = rows;
  std::sort(worst.begin(), worst.end(), [](const OpRow& a, const OpRow& b) {
    return std::fabs(a.predicted - a.measured) > std::fabs(b.predicted - b.measured);
  });
  if (worst.size() > static_cast<std::size_t>(top)) worst.resize(static_cast<std::size_t>(top));
  auto row_json = [](const OpRow& r) {
    const auto& [kind, unit, phase, step, mb, n] = r.key;
    return OJson{{"kind", kind},
                 {"unit", unit},
                 {"phase", phase},
                 {"step", step},
                 {"microbatch", mb},
                 {"occurrence", n},
                 {"predicted_us", r.predicted},
                 {"measured_us", r.measured},
                 {"error_pct", r.error_pct}};
  };
  OJson ops = OJson::array();
  for (const OpRow& r : rows) ops.push_back(row_json(r));
  out["ops"] = ops;
  OJson worst_json = OJson::array();
  text += fmt::format("\nworst ops ({} matched)\n", rows.size());
  for (const OpRow& r : worst) {
    const auto& [kind, unit, phase, step, mb, n] = r.key;
    const std::string what = kind == "compute" ? fmt::format("compute {}", phase) : kind;
    worst_json.push_back(row_json(r));
    text += fmt::format("  step {} mb {} {:<18} {:<22} #{:<2} {:>10.1f} {:>10.1f} {:>+8.1f}%\n",
                        step, mb, what, unit, n, r.predicted, r.measured, r.error_pct);
  }
  out["worst_ops"] = worst_json;

  const double ps = pred["summary"]["step_time_us"].get<double>();
  const double ms = meas["summary"]["step_time_us"].get<double>();
  const double err = ErrorPct(ps, ms);
  const bool ok = std::fabs(err) <= threshold;
  const std::string verdict = fmt::format(
      "verdict: {}: step time predicted {:.1f} us, measured {:.1f} us, error {:+.1f}% ({} the "
      "{:g}% threshold)",
      ok ? "GOOD" : "OFF", ps, ms, err, ok ? "within" : "outside", threshold);
  out["summary"] = {{"step_time_predicted_us", ps},
                    {"step_time_measured_us", ms},
                    {"step_time_error_pct", err},
                    {"exposed_predicted_us", Num(pred["summary"], "exposed_comm_us")},
                    {"exposed_measured_us", Num(meas["summary"], "exposed_comm_us")},
                    {"idle_predicted_us", Num(pred["summary"], "idle_us")},
                    {"idle_measured_us", Num(meas["summary"], "idle_us")},
                    {"threshold_pct", threshold},
                    {"within_threshold", ok}};
  out["warnings"] = warnings;
  out["verdict"] = verdict;
  for (const std::string& w : warnings) text += "\nwarning: " + w;
  text += "\n" + verdict + "\n";
  const std::string json = out.dump(2) + "\n";
  if (auto file = args.Get("-o")) FSDP_RETURN_IF_ERROR(WriteFileAtomic(*file, json));
  fmt::print("{}", args.Has("--json") ? json : text);
  return Status::Ok();
}

}  // namespace

int RunCompare(const Argv& argv) {
  Args args(argv);
  args.Declare("--threshold", ArgKind::kValue, "verdict threshold, percent (default 5)", "PCT");
  args.Declare("--top", ArgKind::kValue, "how many worst ops to list (default 10)", "N");
  args.Declare("--json", ArgKind::kSwitch, "print the comparison as JSON");
  args.Declare("-o", ArgKind::kValue, "also write the JSON to FILE", "FILE");
  if (Status s = args.Parse(); !s.ok()) return Fail("compare", s);
  if (args.help()) return PrintHelp(kUsage, kDescription, args);
  if (Status s = Run(args); !s.ok()) return Fail("compare", s);
  return 0;
}

}  // namespace fsdplab::cli
