#include "fsdplab/sim/nccl_tests.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <nlohmann/json.hpp>
#include <set>

#include "fsdplab/core/file_util.h"

namespace fsdplab::sim {
namespace {

using nlohmann::json;

std::string_view Trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

std::vector<std::string_view> Fields(std::string_view s) {
  std::vector<std::string_view> out;
  std::size_t i = 0;
  while (i < s.size()) {
    while (i < s.size() && std::isspace(static_cast<unsigned char>(s[i]))) ++i;
    std::size_t j = i;
    while (j < s.size() && !std::isspace(static_cast<unsigned char>(s[j]))) ++j;
    if (j > i) out.push_back(s.substr(i, j - i));
    i = j;
  }
  return out;
}

std::string Lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

// Removes an `mpirun --tag-output` prefix: `[1,0]<stdout>:` (or <stderr>).
std::string_view StripTagPrefix(std::string_view line) {
  std::string_view s = line;
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  if (s.empty() || s.front() != '[') return line;
  std::size_t close = s.find(']');
  if (close == std::string_view::npos) return line;
  std::string_view inside = s.substr(1, close - 1);
  if (inside.empty() || inside.find_first_not_of("0123456789,") != std::string_view::npos) {
    return line;
  }
  std::string_view rest = s.substr(close + 1);
  for (std::string_view tag : {"<stdout>:", "<stderr>:"}) {
    if (rest.substr(0, tag.size()) == tag) return rest.substr(tag.size());
  }
  return line;
}

template <typename T>
std::optional<T> ParseIntegral(std::string_view s) {
  T v{};
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || p != s.data() + s.size()) return std::nullopt;
  return v;
}

std::optional<double> ParseNumber(std::string_view s) {
  double v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || p != s.data() + s.size() || !std::isfinite(v)) return std::nullopt;
  return v;
}

bool IsWordStart(std::string_view s) {
  return !s.empty() && std::isalpha(static_cast<unsigned char>(s.front()));
}

// The row layout: where the timing columns start and whether redop/root are present.
struct Layout {
  bool has_redop = false;
  bool has_root = false;
};

class TextParser {
 public:
  explicit TextParser(std::string_view source) : source_(source) {}

  StatusOr<NcclTestsResult> Parse(std::string_view text) {
    result_.source = std::string(source_);
    int line_no = 0;
    std::size_t pos = 0;
    while (pos <= text.size()) {
      std::size_t end = text.find('\n', pos);
      if (end == std::string_view::npos) end = text.size();
      std::string_view raw = text.substr(pos, end - pos);
      pos = end + 1;
      ++line_no;
      if (!raw.empty() && raw.back() == '\r') raw.remove_suffix(1);
      FSDP_RETURN_IF_ERROR(Line(Trim(StripTagPrefix(raw)), line_no));
      if (end == text.size()) break;
    }
    if (result_.rows.empty()) {
      return InvalidInput(
          fmt::format("{}: no result rows found (expected lines such as "
                      "'1048576  262144  float  ...  time  algbw  busbw ...')",
                      source_));
    }
    return std::move(result_);
  }

 private:
  Status Line(std::string_view line, int line_no) {
    if (line.empty()) return Status::Ok();
    if (line.front() == '#') return Comment(Trim(line.substr(1)), line_no);
    std::vector<std::string_view> f = Fields(line);
    // A result row starts with two integers (size, count) and a type name.
    if (f.size() < 3 || !ParseIntegral<std::uint64_t>(f[0]) ||
        !ParseIntegral<std::uint64_t>(f[1]) || !IsWordStart(f[2])) {
      return Status::Ok();  // NCCL INFO/WARN, NCCL version, tool chatter
    }
    return Row(f, line_no);
  }

  Status Comment(std::string_view c, int line_no) {
    constexpr std::string_view kStart = "Collective test starting:";
    if (c.substr(0, kStart.size()) == kStart) {
      result_.program = std::string(Trim(c.substr(kStart.size())));
      return Status::Ok();
    }
    std::vector<std::string_view> f = Fields(c);
    if (f.empty()) return Status::Ok();
    if (f[0] == "nThread" && f.size() >= 4 && f[2] == "nGpus") {
      result_.nthreads = ParseIntegral<int>(f[1]);
      result_.ngpus = ParseIntegral<int>(f[3]);
      return Status::Ok();
    }
    if (f[0] == "Rank" && f.size() >= 2) return DeviceLine(f, line_no);
    if (f.size() >= 3 && f[0] == "size" && f[1] == "count") {
      header_.clear();
      for (std::string_view name : f) header_.push_back(Lower(name));
      return Status::Ok();
    }
    if (c.substr(0, 17) == "Avg bus bandwidth") {
      std::size_t colon = c.find(':');
      if (colon != std::string_view::npos) {
        std::vector<std::string_view> v = Fields(c.substr(colon + 1));
        if (!v.empty()) result_.avg_busbw_GBps = ParseNumber(v[0]);
      }
    }
    return Status::Ok();
  }

  // "Rank  0 Group  0 Pid 1583987 on HOST device  0 [0000:29:00] NVIDIA H100 80GB HBM3"
  // "Rank  0 Pid 112372 on localhost device  0 [0x00] A100-SXM4-40GB"
  Status DeviceLine(const std::vector<std::string_view>& f, int line_no) {
    NcclDevice d;
    std::optional<int> rank = ParseIntegral<int>(f[1]);
    if (!rank) {
      return InvalidInput(
          fmt::format("{}:{}: device line: rank '{}' is not an integer", source_, line_no, f[1]));
    }
    d.rank = *rank;
    for (std::size_t i = 2; i + 1 < f.size(); ++i) {
      if (f[i] == "on") d.hostname = std::string(f[i + 1]);
      if (f[i] == "device") d.device = ParseIntegral<int>(f[i + 1]).value_or(0);
    }
    result_.devices.push_back(std::move(d));
    return Status::Ok();
  }

  StatusOr<Layout> LayoutFor(const std::vector<std::string_view>& f, int line_no) const {
    Layout l;
    if (!header_.empty()) {
      l.has_redop = std::find(header_.begin(), header_.end(), "redop") != header_.end();
      l.has_root = std::find(header_.begin(), header_.end(), "root") != header_.end();
      return l;
    }
    // No header (an excerpt): decide from the fields. A redop is a word; a root is the one
    // integer field that makes the rest exactly two groups of four.
    std::size_t next = 3;
    if (f.size() > 3 && IsWordStart(f[3]) && f[3] != "N/A") {
      l.has_redop = true;
      next = 4;
    }
    std::size_t rest = f.size() - next;
    if (rest == 9 || (rest > 9 && l.has_redop)) {
      l.has_root = true;
    } else if (rest != 8 && rest != 4) {
      return InvalidInput(fmt::format(
          "{}:{}: cannot tell the columns of a row with {} fields and no header line (expected "
          "size count type [redop [root]] and 4 out-of-place + 4 in-place columns)",
          source_, line_no, f.size()));
    }
    return l;
  }

  StatusOr<NcclTiming> Timing(const std::vector<std::string_view>& f, std::size_t at,
                              int line_no) const {
    NcclTiming t;
    double* targets[] = {&t.time_us, &t.algbw_GBps, &t.busbw_GBps};
    const char* names[] = {"time", "algbw", "busbw"};
    for (int k = 0; k < 3; ++k) {
      std::optional<double> v = ParseNumber(f[at + static_cast<std::size_t>(k)]);
      if (!v || *v < 0) {
        return InvalidInput(fmt::format("{}:{}: field {} ({}) '{}' is not a non-negative number",
                                        source_, line_no, at + static_cast<std::size_t>(k) + 1,
                                        names[k], f[at + static_cast<std::size_t>(k)]));
      }
      *targets[k] = *v;
    }
    std::string_view w = f[at + 3];
    if (w != "N/A") {
      std::optional<double> v = ParseNumber(w);
      if (!v) {
        return InvalidInput(fmt::format("{}:{}: field {} (#wrong) '{}' is neither a number nor N/A",
                                        source_, line_no, at + 4, w));
      }
      t.wrong = *v;
    }
    return t;
  }

  Status Row(const std::vector<std::string_view>& f, int line_no) {
    FSDP_ASSIGN_OR_RETURN(Layout l, LayoutFor(f, line_no));
    NcclTestsRow row;
    row.line = line_no;
    row.size_bytes = *ParseIntegral<std::uint64_t>(f[0]);
    row.count = *ParseIntegral<std::uint64_t>(f[1]);
    row.type = std::string(f[2]);
    std::size_t at = 3;
    if (l.has_redop) {
      if (f.size() <= at) return TooShort(f, line_no);
      row.redop = std::string(f[at++]);
    }
    if (l.has_root) {
      if (f.size() <= at) return TooShort(f, line_no);
      std::optional<int> root = ParseIntegral<int>(f[at]);
      if (!root) {
        return InvalidInput(fmt::format("{}:{}: field {} (root) '{}' is not an integer", source_,
                                        line_no, at + 1, f[at]));
      }
      row.root = *root;
      ++at;
    }
    if (f.size() < at + 4) return TooShort(f, line_no);
    FSDP_ASSIGN_OR_RETURN(row.out_of_place, Timing(f, at, line_no));
    at += 4;
    if (f.size() >= at + 4) {
      FSDP_ASSIGN_OR_RETURN(row.in_place, Timing(f, at, line_no));
    } else if (f.size() != at) {
      return TooShort(f, line_no);
    }
    result_.rows.push_back(std::move(row));
    return Status::Ok();
  }

  Status TooShort(const std::vector<std::string_view>& f, int line_no) const {
    return InvalidInput(fmt::format(
        "{}:{}: result row has {} fields; expected size count type{} time algbw busbw #wrong "
        "[time algbw busbw #wrong]",
        source_, line_no, f.size(), header_.empty() ? " [redop [root]]" : " (+ header columns)"));
  }

  std::string_view source_;
  std::vector<std::string> header_;
  NcclTestsResult result_;
};

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

StatusOr<NcclTestsResult> ParseJson(std::string_view text, std::string_view source) {
  json doc = json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) {
    return InvalidInput(
        fmt::format("{}: not valid JSON (and not an nccl-tests text table)", source));
  }
  if (!doc.is_object()) return InvalidInput(fmt::format("{}: expected a JSON object", source));
  NcclTestsResult r;
  r.source = std::string(source);
  if (doc.contains("args") && doc["args"].is_array() && !doc["args"].empty() &&
      doc["args"][0].is_string()) {
    std::string arg0 = doc["args"][0].get<std::string>();
    std::size_t slash = arg0.find_last_of('/');
    r.program = slash == std::string::npos ? arg0 : arg0.substr(slash + 1);
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
        r.devices.push_back(std::move(dev));
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
        row.root = ParseIntegral<int>(Trim(root.get_ref<const std::string&>()));
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

// Ranks implied by a row: size = ranks x count x element size (all_gather, reduce_scatter).
std::optional<int> RanksFromRows(const NcclTestsResult& r) {
  for (const NcclTestsRow& row : r.rows) {
    std::optional<Bytes> elem = NcclTypeBytes(row.type);
    if (row.count == 0 || !elem) continue;
    Bytes per_rank = row.count * *elem;
    if (row.size_bytes % per_rank != 0) return std::nullopt;
    return static_cast<int>(row.size_bytes / per_rank);
  }
  return std::nullopt;
}

Status Resolve(NcclTestsResult& r, const NcclTestsOptions& options) {
  // The collective.
  std::optional<CollectiveKind> from_file;
  if (!r.program.empty()) from_file = CollectiveFromName(r.program);
  if (!from_file) from_file = CollectiveFromName(r.source);
  if (options.collective && from_file && *options.collective != *from_file) {
    return InvalidInput(fmt::format("{}: the file is {} output but {} was asked for", r.source,
                                    CollectiveKindName(*from_file),
                                    CollectiveKindName(*options.collective)));
  }
  r.collective = options.collective ? options.collective : from_file;

  // The ranks.
  std::optional<int> from_devices;
  if (!r.devices.empty()) {
    std::set<int> ranks;
    for (const NcclDevice& d : r.devices) ranks.insert(d.rank);
    from_devices = static_cast<int>(ranks.size());
  }
  std::optional<int> from_rows;
  if (r.collective == CollectiveKind::kAllGather ||
      r.collective == CollectiveKind::kReduceScatter) {
    from_rows = RanksFromRows(r);
  }
  std::optional<int> detected = from_devices ? from_devices : from_rows;
  if (!detected && r.nthreads && r.ngpus) detected = *r.nthreads * *r.ngpus;
  if (options.ranks && detected && *options.ranks != *detected) {
    return InvalidInput(fmt::format("{}: the file shows {} ranks but {} were given", r.source,
                                    *detected, *options.ranks));
  }
  std::optional<int> ranks = options.ranks ? options.ranks : detected;
  if (!ranks) {
    return InvalidInput(fmt::format(
        "{}: cannot tell the number of ranks (no device list, no nGpus line); give it", r.source));
  }
  if (*ranks < 1)
    return InvalidInput(fmt::format("{}: {} ranks is not positive", r.source, *ranks));
  r.ranks = *ranks;
  return Status::Ok();
}

}  // namespace

int NcclTestsResult::NumHosts() const {
  std::set<std::string> hosts;
  for (const NcclDevice& d : devices) hosts.insert(d.hostname);
  return static_cast<int>(hosts.size());
}

std::optional<Bytes> NcclTypeBytes(std::string_view type) {
  struct Entry {
    std::string_view name;
    Bytes bytes;
  };
  static constexpr Entry kTypes[] = {
      {"int8", 1},     {"char", 1},     {"uint8", 1},  {"f8e4m3", 1},  {"f8e5m2", 1},
      {"fp8_e4m3", 1}, {"fp8_e5m2", 1}, {"half", 2},   {"float16", 2}, {"bfloat16", 2},
      {"bf16", 2},     {"int32", 4},    {"int", 4},    {"uint32", 4},  {"float", 4},
      {"float32", 4},  {"int64", 8},    {"uint64", 8}, {"double", 8},  {"float64", 8},
  };
  std::string lower = Lower(type);
  for (const Entry& e : kTypes) {
    if (e.name == lower) return e.bytes;
  }
  return std::nullopt;
}

std::optional<CollectiveKind> CollectiveFromName(std::string_view name) {
  std::string n = Lower(name);
  std::size_t slash = n.find_last_of('/');
  if (slash != std::string::npos) n = n.substr(slash + 1);
  auto has = [&](std::string_view s) { return n.find(s) != std::string::npos; };
  if (has("all_gather") || has("allgather") || n.rfind("ag_", 0) == 0) {
    return CollectiveKind::kAllGather;
  }
  if (has("reduce_scatter") || has("reducescatter") || n.rfind("rs_", 0) == 0) {
    return CollectiveKind::kReduceScatter;
  }
  if (has("all_reduce") || has("allreduce") || n.rfind("ar_", 0) == 0) {
    return CollectiveKind::kAllReduce;
  }
  return std::nullopt;
}

StatusOr<NcclTestsResult> ParseNcclTests(std::string_view text, std::string_view source,
                                         const NcclTestsOptions& options) {
  std::string_view body = Trim(text);
  StatusOr<NcclTestsResult> parsed = [&]() -> StatusOr<NcclTestsResult> {
    if (!body.empty() && body.front() == '{') return ParseJson(body, source);
    TextParser parser(source);
    return parser.Parse(text);
  }();
  if (!parsed.ok()) return parsed.status();
  NcclTestsResult r = std::move(parsed).value();
  FSDP_RETURN_IF_ERROR(Resolve(r, options));
  return r;
}

StatusOr<NcclTestsResult> ReadNcclTestsFile(const std::string& path,
                                            const NcclTestsOptions& options) {
  FSDP_ASSIGN_OR_RETURN(std::string text, ReadFile(path));
  return ParseNcclTests(text, path, options);
}

}  // namespace fsdplab::sim
