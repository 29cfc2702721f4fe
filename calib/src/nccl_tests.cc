#include "fsdplab/calib/nccl_tests.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <set>

#include "fsdplab/core/file_util.h"
#include "internal/nccl_tests_internal.h"

namespace fsdplab::calib {
namespace internal {

std::string_view Trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

std::string Lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

std::optional<double> ParseNumber(std::string_view s) {
  double v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || p != s.data() + s.size() || !std::isfinite(v)) return std::nullopt;
  return v;
}

}  // namespace internal

namespace {

using internal::Lower;
using internal::ParseNumber;
using internal::Trim;

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

bool AllDigits(std::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) {
    return std::isdigit(static_cast<unsigned char>(c));
  });
}

// Removes the tags that launchers put into output lines: `mpirun --tag-output` tags
// (`[1,0]<stdout>:`, `[1,0]<stderr>:`) anywhere in the line (interleaved output of several
// processes puts them inside a row), then an `srun --label` prefix (`3: `) or an MPICH / Intel MPI
// rank prefix (`[3] `) at the start.
std::string StripTags(std::string_view line) {
  std::string out;
  out.reserve(line.size());
  std::size_t i = 0;
  while (i < line.size()) {
    if (line[i] == '[') {
      std::size_t close = line.find(']', i);
      if (close != std::string_view::npos) {
        std::string_view inside = line.substr(i + 1, close - i - 1);
        std::size_t comma = inside.find(',');
        std::string_view rest = line.substr(close + 1);
        bool ids = comma != std::string_view::npos && AllDigits(inside.substr(0, comma)) &&
                   AllDigits(inside.substr(comma + 1));
        if (ids) {
          bool tagged = false;
          for (std::string_view tag : {"<stdout>:", "<stderr>:"}) {
            if (rest.substr(0, tag.size()) == tag) {
              i = close + 1 + tag.size();
              tagged = true;
              break;
            }
          }
          if (tagged) continue;
        }
      }
    }
    out.push_back(line[i]);
    ++i;
  }
  std::string_view s = out;
  std::size_t lead = 0;
  while (lead < s.size() && (s[lead] == ' ' || s[lead] == '\t')) ++lead;
  std::string_view t = s.substr(lead);
  std::size_t digits = 0;
  while (digits < t.size() && std::isdigit(static_cast<unsigned char>(t[digits]))) ++digits;
  if (digits > 0 && digits + 1 < t.size() && t[digits] == ':' && t[digits + 1] == ' ') {
    return std::string(t.substr(digits + 2));  // srun --label
  }
  if (!t.empty() && t[0] == '[') {
    std::size_t close = t.find(']');
    if (close != std::string_view::npos && close + 1 < t.size() && t[close + 1] == ' ' &&
        AllDigits(t.substr(1, close - 1))) {
      return std::string(t.substr(close + 2));  // mpiexec -prepend-rank / -l
    }
  }
  return out;
}

template <typename T>
std::optional<T> ParseIntegral(std::string_view s) {
  T v{};
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || p != s.data() + s.size()) return std::nullopt;
  return v;
}

bool IsWordStart(std::string_view s) {
  return !s.empty() && std::isalpha(static_cast<unsigned char>(s.front()));
}

constexpr std::string_view kKnownCollectives[] = {
    "all_gather", "reduce_scatter", "all_reduce", "alltoall", "alltoallv", "sendrecv",
    "broadcast",  "reduce",         "gather",     "scatter",  "hypercube"};

// The row layout: whether redop and root columns are present and where the halves start.
struct Layout {
  bool has_redop = false;
  bool has_root = false;
  std::size_t out_at = 0;                  // first field of the out-of-place half
  std::optional<std::size_t> in_place_at;  // first field of the in-place half
};

class TextParser {
 public:
  explicit TextParser(std::string_view source) : source_(source) {}

  StatusOr<std::vector<NcclTestsResult>> Parse(std::string_view text) {
    int line_no = 0;
    std::size_t pos = 0;
    while (pos <= text.size()) {
      std::size_t end = text.find('\n', pos);
      if (end == std::string_view::npos) end = text.size();
      std::string_view raw = text.substr(pos, end - pos);
      pos = end + 1;
      ++line_no;
      if (!raw.empty() && raw.back() == '\r') raw.remove_suffix(1);
      std::string clean = StripTags(raw);
      FSDP_RETURN_IF_ERROR(Line(Trim(clean), line_no));
      if (end == text.size()) break;
    }
    Close();
    if (blocks_.empty()) {
      return InvalidInput(
          fmt::format("{}: no result rows found (expected lines such as "
                      "'1048576  262144  float  ...  time  algbw  busbw ...')",
                      source_));
    }
    return std::move(blocks_);
  }

 private:
  // Ends the current block (kept when it has rows) and starts an empty one that inherits only
  // what a restarted sweep does not print again.
  void Close() {
    if (!cur_.rows.empty()) blocks_.push_back(std::move(cur_));
    cur_ = NcclTestsResult{};
    footer_seen_ = false;
    last_size_ = 0;
  }
  // A marker of a new run (a test's header) after rows: close the block.
  void NewRunMarker() {
    if (!cur_.rows.empty()) {
      Close();
      header_.clear();
    }
  }
  void Name(std::string program, std::string from) {
    cur_.program = std::move(program);
    cur_.collective_name = CollectiveOfBinary(cur_.program);
    cur_.collective_from = std::move(from);
  }

  Status Line(std::string_view line, int line_no) {
    if (line.empty()) return Status::Ok();
    if (line.find("NCCL INFO") != std::string_view::npos ||
        line.find("NCCL WARN") != std::string_view::npos) {
      return Status::Ok();
    }
    if (line.front() == '#') return Comment(Trim(line.substr(1)), line, line_no);
    std::vector<std::string_view> f = Fields(line);
    // A result row starts with two integers (size, count) and a type name.
    if (f.size() >= 3 && ParseIntegral<std::uint64_t>(f[0]) && ParseIntegral<std::uint64_t>(f[1]) &&
        IsWordStart(f[2])) {
      return Row(f, line_no);
    }
    return Chatter(f, line_no);
  }

  // A line that is neither a comment nor a row: a command line naming a test binary starts a
  // block of that collective; anything else (NCCL version, tool chatter) is skipped.
  Status Chatter(const std::vector<std::string_view>& f, int line_no) {
    for (std::string_view tok : f) {
      std::string name = CollectiveOfBinary(tok);
      if (name.empty()) continue;
      NewRunMarker();
      std::size_t slash = tok.find_last_of('/');
      Name(std::string(slash == std::string_view::npos ? tok : tok.substr(slash + 1)),
           fmt::format("command line at line {}", line_no));
      if (cur_.first_line == 0) cur_.first_line = line_no;
      return Status::Ok();
    }
    return Status::Ok();
  }

  Status Comment(std::string_view c, std::string_view whole, int line_no) {
    constexpr std::string_view kStart = "Collective test starting:";
    constexpr std::string_view kEnd = "Collective test concluded";
    constexpr std::string_view kBench = "fsdplab bench-gather:";
    if (c.substr(0, kStart.size()) == kStart) {
      NewRunMarker();
      Name(std::string(Trim(c.substr(kStart.size()))),
           fmt::format("'Collective test starting' at line {}", line_no));
      if (cur_.first_line == 0) cur_.first_line = line_no;
      return Status::Ok();
    }
    if (c.substr(0, kEnd.size()) == kEnd) {
      Close();
      header_.clear();
      return Status::Ok();
    }
    if (c.substr(0, kBench.size()) == kBench) {
      // "# fsdplab bench-gather: all_gather on the host backend, 2 ranks, warmup iters: ..."
      NewRunMarker();
      std::vector<std::string_view> f = Fields(c.substr(kBench.size()));
      if (!f.empty()) {
        cur_.program = "fsdplab bench-gather";
        cur_.collective_name = std::string(f[0]);
        cur_.collective_from = fmt::format("bench-gather header at line {}", line_no);
      }
      for (std::size_t i = 1; i < f.size(); ++i) {
        if (f[i].substr(0, 5) == "ranks") cur_.ranks_hint = ParseIntegral<int>(f[i - 1]);
      }
      if (cur_.first_line == 0) cur_.first_line = line_no;
      return Status::Ok();
    }
    std::vector<std::string_view> f = Fields(c);
    if (f.empty()) return Status::Ok();
    if (f[0] == "nThread" && f.size() >= 4 && f[2] == "nGpus") {
      NewRunMarker();
      cur_.nthreads = ParseIntegral<int>(f[1]);
      cur_.ngpus = ParseIntegral<int>(f[3]);
      if (cur_.first_line == 0) cur_.first_line = line_no;
      return Status::Ok();
    }
    if (f[0] == "Rank" && f.size() >= 2) {
      NewRunMarker();
      return DeviceLine(f, line_no);
    }
    if (f.size() >= 3 && f[0] == "size" && f[1] == "count") {
      NewRunMarker();
      header_.clear();
      for (std::string_view name : f) header_.push_back(Lower(name));
      return Status::Ok();
    }
    if (c.substr(0, 17) == "Avg bus bandwidth") {
      std::size_t colon = c.find(':');
      if (colon != std::string_view::npos) {
        std::vector<std::string_view> v = Fields(c.substr(colon + 1));
        if (!v.empty()) cur_.avg_busbw_GBps = ParseNumber(v[0]);
      }
      footer_seen_ = true;
      return Status::Ok();
    }
    // Other comments: a script's banner may name the binary ("### all_reduce_perf ###").
    std::vector<std::string_view> all = Fields(whole);
    return Chatter(all, line_no);
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
    if (cur_.first_line == 0) cur_.first_line = line_no;
    // A list repeated inside one block (each process printing it) counts each rank once.
    for (const NcclDevice& o : cur_.devices) {
      if (o.rank == d.rank) return Status::Ok();
    }
    cur_.devices.push_back(std::move(d));
    return Status::Ok();
  }

  StatusOr<Layout> LayoutFor(const std::vector<std::string_view>& f, int line_no) const {
    Layout l;
    if (!header_.empty()) {
      l.has_redop = std::find(header_.begin(), header_.end(), "redop") != header_.end();
      l.has_root = std::find(header_.begin(), header_.end(), "root") != header_.end();
      std::vector<std::size_t> times;
      for (std::size_t i = 0; i < header_.size(); ++i) {
        if (header_[i] == "time" || header_[i] == "cputime") times.push_back(i);
      }
      // The header's tokens (after '#') line up with a row's fields: "size" is field 0.
      l.out_at = 3 + (l.has_redop ? 1 : 0) + (l.has_root ? 1 : 0);
      if (!times.empty()) {
        l.out_at = times[0];
        if (times.size() >= 2) l.in_place_at = times[1];
      } else {
        l.in_place_at = l.out_at + 4;
      }
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
    l.out_at = next + (l.has_root ? 1 : 0);
    l.in_place_at = l.out_at + 4;
    return l;
  }

  StatusOr<NcclTiming> Timing(const std::vector<std::string_view>& f, std::size_t at,
                              int line_no) const {
    NcclTiming t;
    double* targets[] = {&t.time_us, &t.algbw_GBps, &t.busbw_GBps};
    const char* names[] = {"time", "algbw", "busbw"};
    for (int k = 0; k < 3; ++k) {
      std::size_t i = at + static_cast<std::size_t>(k);
      std::optional<double> v = ParseNumber(f[i]);
      if (!v || *v < 0) {
        return InvalidInput(fmt::format("{}:{}: field {} ({}) '{}' is not a non-negative number",
                                        source_, line_no, i + 1, names[k], f[i]));
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
    }
    if (f.size() < l.out_at + 4) return TooShort(f, line_no);
    FSDP_ASSIGN_OR_RETURN(row.out_of_place, Timing(f, l.out_at, line_no));
    if (l.in_place_at && f.size() >= *l.in_place_at + 4) {
      FSDP_ASSIGN_OR_RETURN(row.in_place, Timing(f, *l.in_place_at, line_no));
    } else if (header_.empty() && f.size() != l.out_at + 4) {
      return TooShort(f, line_no);
    }
    // A new block: after the footer, when the sweep restarts, or when the rows change their
    // redop/root (tables of two collectives run back to back).
    if (!cur_.rows.empty()) {
      const NcclTestsRow& prev = cur_.rows.back();
      bool restart = row.size_bytes < last_size_;
      bool changed = row.redop != prev.redop || row.root != prev.root;
      if (footer_seen_ || restart || changed) {
        std::vector<NcclDevice> devices = cur_.devices;
        std::optional<int> nthreads = cur_.nthreads, ngpus = cur_.ngpus;
        std::string program = cur_.program, name = cur_.collective_name;
        std::string from = cur_.collective_from;
        Close();
        // A sweep that starts without a header of its own belongs to the same run: the run
        // repeated (nccl-tests -N), or its next reduction op or type (-o all, -d all), which
        // changes the redop column. It keeps the device list and the name. Only a table that
        // never named its collective and changes its redop/root may be another collective.
        if (!changed || !name.empty()) {
          cur_.devices = std::move(devices);
          cur_.nthreads = nthreads;
          cur_.ngpus = ngpus;
          cur_.program = std::move(program);
          cur_.collective_name = std::move(name);
          if (!cur_.collective_name.empty()) {
            cur_.collective_from = from + " (the sweep restarts without a header of its own)";
          }
        }
      }
    }
    if (cur_.first_line == 0) cur_.first_line = line_no;
    cur_.last_line = line_no;
    last_size_ = row.size_bytes;
    cur_.rows.push_back(std::move(row));
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
  std::vector<NcclTestsResult> blocks_;
  NcclTestsResult cur_;
  bool footer_seen_ = false;
  Bytes last_size_ = 0;
};

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

// What the rows' layout allows: a reduction op with size = k x count x element size (k >= 2) is
// a reduce_scatter; nothing else is told apart by the layout alone (all_gather and alltoall print
// alike, as do all_reduce and sendrecv).
std::optional<CollectiveKind> CollectiveFromLayout(const NcclTestsResult& r) {
  if (r.rows.empty()) return std::nullopt;
  const NcclTestsRow& any = r.rows.back();
  if (any.redop.empty() || any.redop == "none") return std::nullopt;
  std::optional<int> k = RanksFromRows(r);
  if (k && *k >= 2) return CollectiveKind::kReduceScatter;
  return std::nullopt;
}

// Whether the rows could be `kind` (used to pick an unnamed block for --collective).
bool LayoutAllows(const NcclTestsResult& r, CollectiveKind kind) {
  if (r.rows.empty()) return false;
  const NcclTestsRow& any = r.rows.back();
  bool reduces = !any.redop.empty() && any.redop != "none";
  bool no_op = any.redop.empty() || any.redop == "none";
  std::optional<int> k = RanksFromRows(r);
  switch (kind) {
    case CollectiveKind::kAllGather: return no_op && (!k || *k >= 2);
    case CollectiveKind::kReduceScatter: return reduces && k && *k >= 2;
    case CollectiveKind::kAllReduce: return (reduces || any.redop.empty()) && (!k || *k == 1);
  }
  return false;
}

std::string Where(const NcclTestsResult& b) {
  if (b.first_line > 0)
    return fmt::format("block {} (lines {}-{})", b.block, b.first_line, b.last_line);
  return fmt::format("block {}", b.block);
}

std::string Holds(const std::vector<NcclTestsResult>& blocks) {
  std::vector<std::string> parts;
  for (const NcclTestsResult& b : blocks) {
    parts.push_back(fmt::format("{} {}", Where(b),
                                b.collective_name.empty() ? "(unnamed)" : b.collective_name));
  }
  return fmt::format("{}", fmt::join(parts, ", "));
}

Status ResolveRanks(NcclTestsResult& r, const NcclTestsOptions& options) {
  std::optional<int> from_devices;
  if (!r.devices.empty()) from_devices = static_cast<int>(r.devices.size());
  std::optional<int> from_rows;
  if (r.collective == CollectiveKind::kAllGather ||
      r.collective == CollectiveKind::kReduceScatter) {
    from_rows = RanksFromRows(r);
  }
  if (from_rows && *from_rows < 2) from_rows.reset();  // bench-gather prints the full count
  std::optional<int> detected = from_devices ? from_devices : r.ranks_hint;
  if (!detected) detected = from_rows;
  if (!detected && r.nthreads && r.ngpus && *r.nthreads * *r.ngpus > 1) {
    detected = *r.nthreads * *r.ngpus;
  }
  if (options.ranks && detected && *options.ranks != *detected) {
    return InvalidInput(fmt::format("{}: the file shows {} ranks but {} {} were given", r.source,
                                    *detected, kRanksFlag, *options.ranks));
  }
  std::optional<int> ranks = options.ranks ? options.ranks : detected;
  if (!ranks) {
    return InvalidInput(fmt::format(
        "{}: cannot tell the number of ranks of this {} run (no device list, and for {} size / "
        "count does not show it); give {} N",
        r.source, r.collective_name, r.collective_name, kRanksFlag));
  }
  if (*ranks < 2) {
    return InvalidInput(fmt::format(
        "{}: a run of {} rank measures no communication (a test binary started once per process "
        "by mpirun or srun needs nccl-tests built with MPI=1; or give {} N if the file is wrong)",
        r.source, *ranks, kRanksFlag));
  }
  r.ranks = *ranks;
  return Status::Ok();
}

StatusOr<std::vector<NcclTestsResult>> Split(std::string_view text, std::string_view source) {
  std::string_view body = Trim(text);
  StatusOr<std::vector<NcclTestsResult>> blocks = !body.empty() && body.front() == '{'
                                                      ? internal::ParseJsonBlocks(body, source)
                                                      : TextParser(source).Parse(text);
  if (!blocks.ok()) return blocks.status();
  std::vector<NcclTestsResult> out = std::move(blocks).value();
  for (std::size_t i = 0; i < out.size(); ++i) {
    out[i].block = static_cast<int>(i + 1);
    out[i].blocks_in_file = static_cast<int>(out.size());
    out[i].source = out.size() == 1 ? std::string(source) : fmt::format("{}#{}", source, i + 1);
    if (!out[i].collective_name.empty()) {
      out[i].collective = ParseCollectiveKind(out[i].collective_name);
    }
  }
  return out;
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
      {"int8", 1},     {"char", 1},     {"uint8", 1}, {"f8e4m3", 1},  {"f8e5m2", 1},
      {"fp8_e4m3", 1}, {"fp8_e5m2", 1}, {"half", 2},  {"float16", 2}, {"bfloat16", 2},
      {"bf16", 2},     {"fp16", 2},     {"int32", 4}, {"int", 4},     {"uint32", 4},
      {"float", 4},    {"float32", 4},  {"fp32", 4},  {"int64", 8},   {"uint64", 8},
      {"double", 8},   {"float64", 8},
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

std::string CollectiveOfBinary(std::string_view token) {
  std::size_t slash = token.find_last_of('/');
  if (slash != std::string_view::npos) token = token.substr(slash + 1);
  while (!token.empty() && (token.back() == ';' || token.back() == '\'' || token.back() == '"' ||
                            token.back() == ':' || token.back() == ',' || token.back() == ')')) {
    token.remove_suffix(1);
  }
  for (std::string_view suffix : {"_perf_mpi", "_perf"}) {
    if (token.size() > suffix.size() && token.substr(token.size() - suffix.size()) == suffix) {
      std::string_view stem = token.substr(0, token.size() - suffix.size());
      for (std::string_view known : kKnownCollectives) {
        if (stem == known) return std::string(known);
      }
    }
  }
  return {};
}

StatusOr<std::vector<NcclTestsResult>> SplitNcclTests(std::string_view text,
                                                      std::string_view source) {
  return Split(text, source);
}

StatusOr<std::vector<NcclTestsResult>> ParseNcclTestsBlocks(std::string_view text,
                                                            std::string_view source,
                                                            const NcclTestsOptions& options,
                                                            std::vector<std::string>* notes) {
  FSDP_ASSIGN_OR_RETURN(std::vector<NcclTestsResult> blocks, Split(text, source));
  if (options.block) {
    if (*options.block < 1 || *options.block > static_cast<int>(blocks.size())) {
      return InvalidInput(fmt::format("{}: {} {}: the file holds {} block(s): {}", source,
                                      kBlockFlag, *options.block, blocks.size(), Holds(blocks)));
    }
    NcclTestsResult one = std::move(blocks[static_cast<std::size_t>(*options.block - 1)]);
    blocks.clear();
    blocks.push_back(std::move(one));
  }
  // Name what the file does not name: a file of one block by its file name, then by layout.
  for (NcclTestsResult& b : blocks) {
    if (!b.collective_name.empty()) continue;
    std::optional<CollectiveKind> guess;
    if (blocks.size() == 1 && b.blocks_in_file == 1) {
      guess = CollectiveFromName(source);
      if (guess) b.collective_from = "file name";
    }
    if (!guess) {
      guess = CollectiveFromLayout(b);
      if (guess) b.collective_from = "row layout (a reduction op, size = ranks x count)";
    }
    if (guess) {
      b.collective = guess;
      b.collective_name = std::string(CollectiveKindName(*guess));
    }
  }
  std::vector<NcclTestsResult> picked;
  if (options.collective) {
    const std::string want(CollectiveKindName(*options.collective));
    for (NcclTestsResult& b : blocks) {
      if (b.collective_name == want) picked.push_back(b);
    }
    if (picked.empty()) {
      std::vector<NcclTestsResult*> unnamed;
      for (NcclTestsResult& b : blocks) {
        if (b.collective_name.empty() && LayoutAllows(b, *options.collective)) {
          unnamed.push_back(&b);
        }
      }
      if (unnamed.size() > 1) {
        return InvalidInput(fmt::format(
            "{}: {} blocks do not say which collective they are and could be {}: {}; give {} N "
            "to pick one",
            source, unnamed.size(), want, Holds(blocks), kBlockFlag));
      }
      if (unnamed.size() == 1) {
        unnamed.front()->collective = options.collective;
        unnamed.front()->collective_name = want;
        unnamed.front()->collective_from = std::string(kCollectiveFlag);
        picked.push_back(*unnamed.front());
      }
    }
    if (picked.empty()) {
      if (blocks.size() == 1 && !blocks.front().collective_name.empty()) {
        return InvalidInput(fmt::format(
            "{}: the file is {} output (from its {}) but {} {} was asked for", source,
            blocks.front().collective_name, blocks.front().collective_from, kCollectiveFlag, want));
      }
      return InvalidInput(
          fmt::format("{}: no {} results in this file; it holds {}", source, want, Holds(blocks)));
    }
  } else {
    std::vector<const NcclTestsResult*> unknown;
    for (NcclTestsResult& b : blocks) {
      if (b.collective) {
        picked.push_back(b);
      } else if (!b.collective_name.empty()) {
        if (notes) {
          notes->push_back(
              fmt::format("{}: {} {} skipped (the cost model has all_gather, "
                          "reduce_scatter and all_reduce)",
                          source, Where(b), b.collective_name));
        }
      } else {
        unknown.push_back(&b);
      }
    }
    if (!unknown.empty()) {
      const NcclTestsResult& u = *unknown.front();
      std::string pick = blocks.size() > 1
                             ? fmt::format(" (with {} {} for this block)", kBlockFlag, u.block)
                             : std::string();
      return InvalidInput(fmt::format(
          "{}: {}: cannot tell which collective this is (no 'Collective test starting' line, no "
          "test binary named, no telling file name); give {} all_gather|reduce_scatter|"
          "all_reduce{}",
          source, Where(u), kCollectiveFlag, pick));
    }
    if (picked.empty()) {
      return InvalidInput(
          fmt::format("{}: no all_gather, reduce_scatter or all_reduce results; the file holds {}",
                      source, Holds(blocks)));
    }
  }
  for (NcclTestsResult& b : picked) FSDP_RETURN_IF_ERROR(ResolveRanks(b, options));
  return picked;
}

StatusOr<std::vector<NcclTestsResult>> ReadNcclTestsBlocks(const std::string& path,
                                                           const NcclTestsOptions& options,
                                                           std::vector<std::string>* notes) {
  FSDP_ASSIGN_OR_RETURN(std::string text, ReadFile(path));
  return ParseNcclTestsBlocks(text, path, options, notes);
}

StatusOr<NcclTestsResult> ParseNcclTests(std::string_view text, std::string_view source,
                                         const NcclTestsOptions& options) {
  FSDP_ASSIGN_OR_RETURN(std::vector<NcclTestsResult> blocks,
                        ParseNcclTestsBlocks(text, source, options));
  if (blocks.size() > 1) {
    std::set<std::string> kinds;
    for (const NcclTestsResult& b : blocks) kinds.insert(b.collective_name);
    return InvalidInput(
        fmt::format("{}: the file holds {} result blocks ({}); give {}{} to pick one", source,
                    blocks.size(), Holds(blocks),
                    kinds.size() > 1 ? std::string(kCollectiveFlag) + " C or " : "", kBlockFlag));
  }
  return std::move(blocks.front());
}

StatusOr<NcclTestsResult> ReadNcclTestsFile(const std::string& path,
                                            const NcclTestsOptions& options) {
  FSDP_ASSIGN_OR_RETURN(std::string text, ReadFile(path));
  return ParseNcclTests(text, path, options);
}

}  // namespace fsdplab::calib
