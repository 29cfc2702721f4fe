// The JSON forms of a collective benchmark: nccl-tests' -J file and `fsdplab bench-gather --json`.
#include <fmt/format.h>

#include <charconv>
#include <nlohmann/json.hpp>

#include "internal/nccl_tests_internal.h"

namespace fsdplab::calib::internal {
namespace {

using nlohmann::json;

StatusOr<std::optional<double>> JsonDouble(const json& v, std::string_view where) {
  if (v.is_null()) return std::optional<double>();
  if (v.is_number()) return std::optional<double>(v.get<double>());
  if (v.is_string() && Lower(v.get<std::string>()) == "nan") return std::optional<double>();
  return InvalidInput(fmt::format("{}: expected a number, got {}", where, v.dump()));
}

StatusOr<std::optional<NcclTiming>> JsonTiming(const json& obj, std::string_view where) {
  if (obj.is_null()) return std::optional<NcclTiming>();
  if (!obj.is_object()) return InvalidInput(fmt::format("{}: expected an object or null", where));
  NcclTiming t;
  const char* time_key = obj.contains("time") ? "time" : "cpu_time";
  struct Field {
    const char* key;
    double* target;
  };
  for (Field fld : {Field{time_key, &t.time_us}, Field{"alg_bw", &t.algbw_GBps},
                    Field{"bus_bw", &t.busbw_GBps}}) {
    std::string at = fmt::format("{}.{}", where, fld.key);
    if (!obj.contains(fld.key)) return InvalidInput(fmt::format("{}: missing", at));
    FSDP_ASSIGN_OR_RETURN(std::optional<double> v, JsonDouble(obj.at(fld.key), at));
    if (!v || *v < 0) return InvalidInput(fmt::format("{}: not a non-negative number", at));
    *fld.target = *v;
  }
  if (obj.contains("nwrong")) {
    FSDP_ASSIGN_OR_RETURN(t.wrong, JsonDouble(obj.at("nwrong"), fmt::format("{}.nwrong", where)));
  }
  return std::optional<NcclTiming>(t);
}

std::optional<int> IntOf(std::string_view s) {
  s = Trim(s);
  int v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || p != s.data() + s.size()) return std::nullopt;
  return v;
}

StatusOr<NcclTestsResult> NcclTestsJson(const json& doc, std::string_view source) {
  NcclTestsResult r;
  r.source = std::string(source);
  if (doc.contains("args") && doc["args"].is_array() && !doc["args"].empty() &&
      doc["args"][0].is_string()) {
    std::string arg0 = doc["args"][0].get<std::string>();
    std::size_t slash = arg0.find_last_of('/');
    r.program = slash == std::string::npos ? arg0 : arg0.substr(slash + 1);
    r.collective_name = CollectiveOfBinary(r.program);
    if (!r.collective_name.empty()) r.collective_from = "args[0]";
  }
  if (doc.contains("config") && doc["config"].is_object()) {
    const json& cfg = doc["config"];
    if (cfg.contains("nthreads") && cfg["nthreads"].is_number_integer()) {
      r.nthreads = cfg["nthreads"].get<int>();
    }
    if (cfg.contains("ngpus") && cfg["ngpus"].is_number_integer()) {
      r.ngpus = cfg["ngpus"].get<int>();
    }
    if (cfg.contains("devices") && cfg["devices"].is_array()) {
      for (std::size_t i = 0; i < cfg["devices"].size(); ++i) {
        const json& d = cfg["devices"][i];
        if (!d.is_object() || !d.contains("rank") || !d["rank"].is_number_integer()) {
          return InvalidInput(fmt::format(
              "{}: config.devices[{}]: expected an object with an integer rank", source, i));
        }
        NcclDevice dev;
        dev.rank = d["rank"].get<int>();
        if (d.contains("hostname") && d["hostname"].is_string()) {
          dev.hostname = d["hostname"].get<std::string>();
        }
        if (d.contains("device") && d["device"].is_number_integer()) {
          dev.device = d["device"].get<int>();
        }
        bool seen = false;
        for (const NcclDevice& o : r.devices) seen = seen || o.rank == dev.rank;
        if (!seen) r.devices.push_back(std::move(dev));
      }
    }
  }
  if (doc.contains("average_bus_bandwidth") && doc["average_bus_bandwidth"].is_object() &&
      doc["average_bus_bandwidth"].contains("bandwidth") &&
      doc["average_bus_bandwidth"]["bandwidth"].is_number()) {
    r.avg_busbw_GBps = doc["average_bus_bandwidth"]["bandwidth"].get<double>();
  }
  if (!doc.contains("results") || !doc["results"].is_array()) {
    return InvalidInput(fmt::format("{}: results: missing or not a list", source));
  }
  const json& results = doc["results"];
  for (std::size_t i = 0; i < results.size(); ++i) {
    const json& e = results[i];
    std::string at = fmt::format("{}: results[{}]", source, i);
    if (!e.is_object()) return InvalidInput(fmt::format("{}: expected an object", at));
    NcclTestsRow row;
    for (const char* key : {"size", "count"}) {
      if (!e.contains(key) || !e[key].is_number_unsigned()) {
        return InvalidInput(fmt::format("{}.{}: missing or not a non-negative integer", at, key));
      }
    }
    row.size_bytes = e["size"].get<Bytes>();
    row.count = e["count"].get<std::uint64_t>();
    if (e.contains("type") && e["type"].is_string()) row.type = e["type"].get<std::string>();
    if (e.contains("redop") && e["redop"].is_string()) row.redop = e["redop"].get<std::string>();
    if (e.contains("root")) {
      const json& root = e["root"];
      if (root.is_number_integer()) {
        row.root = root.get<int>();
      } else if (root.is_string()) {
        row.root = IntOf(root.get_ref<const std::string&>());
      }
    }
    if (!e.contains("out_of_place") && !e.contains("in_place")) {
      return InvalidInput(fmt::format("{}: neither out_of_place nor in_place", at));
    }
    if (e.contains("out_of_place")) {
      FSDP_ASSIGN_OR_RETURN(row.out_of_place, JsonTiming(e["out_of_place"], at + ".out_of_place"));
    }
    if (e.contains("in_place")) {
      FSDP_ASSIGN_OR_RETURN(row.in_place, JsonTiming(e["in_place"], at + ".in_place"));
    }
    if (!row.out_of_place && !row.in_place) {
      return InvalidInput(fmt::format("{}: no timing (both halves null)", at));
    }
    r.rows.push_back(std::move(row));
  }
  if (r.rows.empty()) return InvalidInput(fmt::format("{}: results: empty", source));
  return r;
}

// `fsdplab bench-gather --json` (format "fsdplab.bench_gather", version 1).
StatusOr<NcclTestsResult> BenchGatherJson(const json& doc, std::string_view source) {
  auto bad = [&](std::string_view what) {
    return InvalidInput(
        fmt::format("{}: {} (a `fsdplab bench-gather --json` document)", source, what));
  };
  if (doc.contains("version") && doc["version"] != 1) {
    return bad(fmt::format("version: {} (this fsdplab reads version 1)", doc["version"].dump()));
  }
  NcclTestsResult r;
  r.source = std::string(source);
  std::string op = doc.contains("op") && doc["op"].is_string() ? doc["op"].get<std::string>() : "";
  if (op == "concurrent") {
    return bad(
        "op: concurrent measures contention, not one collective's cost; give it to `fsdplab "
        "calibrate --contention FILE`");
  }
  r.collective_name = op;
  r.program = "fsdplab bench-gather";
  r.collective_from = "bench-gather op";
  if (doc.contains("world_size") && doc["world_size"].is_number_integer()) {
    r.ranks_hint = doc["world_size"].get<int>();
  }
  if (!doc.contains("rows") || !doc["rows"].is_array()) return bad("rows: missing or not a list");
  const json& rows = doc["rows"];
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const json& e = rows[i];
    std::string at = fmt::format("rows[{}]", i);
    if (!e.is_object()) return bad(at + ": expected an object");
    NcclTestsRow row;
    if (!e.contains("size_bytes") || !e["size_bytes"].is_number_unsigned()) {
      return bad(at + ".size_bytes: missing or not a non-negative integer");
    }
    row.size_bytes = e["size_bytes"].get<Bytes>();
    if (e.contains("count") && e["count"].is_number_unsigned()) {
      row.count = e["count"].get<std::uint64_t>();
    }
    if (e.contains("type") && e["type"].is_string()) row.type = e["type"].get<std::string>();
    auto timing = [&](const char* prefix) -> StatusOr<std::optional<NcclTiming>> {
      std::string t = std::string(prefix) + "time_us";
      if (!e.contains(t)) return std::optional<NcclTiming>();
      if (!e[t].is_number() || e[t].get<double>() < 0) {
        return bad(fmt::format("{}.{}: not a non-negative number", at, t));
      }
      NcclTiming out;
      out.time_us = e[t].get<double>();
      std::string a = std::string(prefix) + "algbw_GBps";
      std::string b = std::string(prefix) + "busbw_GBps";
      std::string w = std::string(prefix) + "wrong";
      if (e.contains(a) && e[a].is_number()) out.algbw_GBps = e[a].get<double>();
      if (e.contains(b) && e[b].is_number()) out.busbw_GBps = e[b].get<double>();
      if (e.contains(w) && e[w].is_number()) out.wrong = e[w].get<double>();
      return std::optional<NcclTiming>(out);
    };
    FSDP_ASSIGN_OR_RETURN(row.out_of_place, timing(""));
    FSDP_ASSIGN_OR_RETURN(row.in_place, timing("inplace_"));
    if (!row.out_of_place) return bad(at + ".time_us: missing");
    r.rows.push_back(std::move(row));
  }
  if (r.rows.empty()) return bad("rows: empty");
  return r;
}

}  // namespace

StatusOr<std::vector<NcclTestsResult>> ParseJsonBlocks(std::string_view text,
                                                       std::string_view source) {
  json doc = json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) {
    return InvalidInput(
        fmt::format("{}: not valid JSON (and not an nccl-tests text table)", source));
  }
  if (!doc.is_object()) return InvalidInput(fmt::format("{}: expected a JSON object", source));
  std::vector<NcclTestsResult> out;
  if (doc.contains("format") && doc["format"] == "fsdplab.bench_gather") {
    FSDP_ASSIGN_OR_RETURN(NcclTestsResult r, BenchGatherJson(doc, source));
    out.push_back(std::move(r));
  } else {
    FSDP_ASSIGN_OR_RETURN(NcclTestsResult r, NcclTestsJson(doc, source));
    out.push_back(std::move(r));
  }
  return out;
}

}  // namespace fsdplab::calib::internal
