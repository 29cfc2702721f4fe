#include "fsdplab/trace/trace_files.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "fsdplab/core/file_util.h"
#include "fsdplab/trace/trace_io.h"
#include "fsdplab/trace/trace_structure.h"

namespace fsdplab {
namespace {

// Whether a JSON document's top-level "format" is "fsdplab.trace". Read with a SAX parser that
// stops at that key's value (the first key of every trace fsdplab and the recorder write), so a
// large trace is not parsed twice; text that is not JSON, or has no such key, is not a trace.
bool IsTraceDocument(const std::string& text) {
  using Json = nlohmann::json;
  struct Sax final : nlohmann::json_sax<Json> {
    int depth = 0;
    bool format_next = false;
    bool found = false;
    bool Value() { return !format_next; }  // the format key's value (not a string) ends it
    bool null() override { return Value(); }
    bool boolean(bool) override { return Value(); }
    bool number_integer(Json::number_integer_t) override { return Value(); }
    bool number_unsigned(Json::number_unsigned_t) override { return Value(); }
    bool number_float(Json::number_float_t, const Json::string_t&) override { return Value(); }
    bool binary(Json::binary_t&) override { return Value(); }
    bool string(Json::string_t& v) override {
      if (!format_next) return true;
      found = v == "fsdplab.trace";
      return false;
    }
    bool start_object(std::size_t) override { return Value() && ++depth > 0; }
    bool end_object() override { return --depth >= 0; }
    bool start_array(std::size_t) override { return Value() && ++depth > 0; }
    bool end_array() override { return --depth >= 0; }
    bool key(Json::string_t& k) override {
      format_next = depth == 1 && k == "format";
      return true;
    }
    bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) override {
      return false;
    }
  } sax;
  Json::sax_parse(text, &sax, nlohmann::detail::input_format_t::json, false);
  return sax.found;
}

}  // namespace

StatusOr<std::vector<Trace>> ReadTraceDirectory(const std::string& dir) {
  std::vector<std::string> files;
  std::vector<std::string> others;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    if (!entry.is_regular_file() || entry.path().extension() != ".json") continue;
    FSDP_ASSIGN_OR_RETURN(std::string text, ReadFile(entry.path().string()));
    (IsTraceDocument(text) ? files : others).push_back(entry.path().filename().string());
  }
  if (ec) return NotFound(fmt::format("{}: {}", dir, ec.message()));
  if (files.empty()) {
    std::sort(others.begin(), others.end());
    return InvalidInput(fmt::format(
        "{}: no fsdplab.trace files in the directory{}", dir,
        others.empty()
            ? std::string(" (no *.json at all)")
            : fmt::format(" ({} other *.json: {})", others.size(), fmt::join(others, ", "))));
  }
  for (std::string& f : files) f = (std::filesystem::path(dir) / f).string();
  std::sort(files.begin(), files.end());
  std::vector<Trace> traces;
  for (const std::string& f : files) {
    FSDP_ASSIGN_OR_RETURN(Trace t, ReadReplayableTrace(f));
    traces.push_back(std::move(t));
  }
  // Order by meta.rank when the ranks are 0..N-1 exactly; else keep the file-name order.
  std::vector<int> ranks;
  for (const Trace& t : traces) ranks.push_back(t.meta.rank);
  std::vector<int> sorted = ranks;
  std::sort(sorted.begin(), sorted.end());
  bool exact = true;
  for (std::size_t i = 0; i < sorted.size(); ++i) exact = exact && sorted[i] == static_cast<int>(i);
  if (exact) {
    std::sort(traces.begin(), traces.end(),
              [](const Trace& a, const Trace& b) { return a.meta.rank < b.meta.rank; });
  }
  return traces;
}

namespace {

// The structure the scheduler relies on, checked on a trace that was read: its first problem.
StatusOr<Trace> Replayable(Trace trace, std::string_view name) {
  std::vector<Status> problems = CheckTraceStructure(trace);
  if (problems.empty()) return trace;
  std::string more;
  if (problems.size() > 1) {
    more = fmt::format(" (and {} more; `fsdplab validate` lists them)", problems.size() - 1);
  }
  return InvalidInput(fmt::format("{}: {}{}", name, problems.front().message(), more));
}

}  // namespace

StatusOr<Trace> ReadReplayableTrace(const std::string& path) {
  FSDP_ASSIGN_OR_RETURN(Trace trace, ReadTraceFile(path));
  return Replayable(std::move(trace), path);
}

StatusOr<Trace> ParseReplayableTrace(std::string_view json_text, std::string_view name) {
  StatusOr<Trace> trace = ParseTrace(json_text);
  if (!trace.ok()) return trace.status().WithContext(std::string(name));
  return Replayable(*std::move(trace), name);
}

TraceCheck CheckTraceText(std::string_view text) {
  TraceCheck r;
  // The common case reads once; only an invalid trace is walked again to list every problem.
  StatusOr<Trace> trace = ParseTrace(text);
  if (trace.ok()) {
    // Fields are valid; now what the scheduler relies on (pairs closed in the right phase).
    for (const Status& s : CheckTraceStructure(*trace)) r.problems.push_back(s.message());
    if (!r.problems.empty()) return r;
    r.valid = true;
    r.units = trace->model.num_units();
    r.steps = trace->steps.size();
    for (const Step& s : trace->steps) {
      for (const Microbatch& m : s.microbatches) r.events += m.events.size();
    }
    return r;
  }
  for (const Status& s : ValidateTraceText(text)) r.problems.push_back(s.message());
  if (r.problems.empty()) r.problems.push_back(trace.status().message());
  return r;
}

TraceCheck CheckTraceFile(const std::string& path) {
  StatusOr<std::string> text = ReadFile(path);
  if (!text.ok()) {
    // ReadFile's message starts with the path, which every output line already shows.
    TraceCheck r;
    std::string msg = text.status().message();
    if (msg.rfind(path + ": ", 0) == 0) msg.erase(0, path.size() + 2);
    r.problems.push_back(std::move(msg));
    return r;
  }
  return CheckTraceText(*text);
}

}  // namespace fsdplab
