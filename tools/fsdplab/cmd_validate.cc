// fsdplab validate TRACE... [--json]: checks traces and lists every problem of each.
#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "cli_common.h"
#include "commands.h"
#include "fsdplab/core/file_util.h"
#include "fsdplab/trace/trace_io.h"
#include "fsdplab/trace/trace_structure.h"

namespace fsdplab::cli {
namespace {

struct FileResult {
  std::string path;
  bool valid = false;
  int units = 0;
  std::size_t steps = 0;
  std::size_t events = 0;
  std::vector<std::string> problems;
};

FileResult Check(const std::string& path) {
  FileResult r;
  r.path = path;
  StatusOr<std::string> text = ReadFile(path);
  if (!text.ok()) {
    // ReadFile's message starts with the path, which every output line already shows.
    std::string msg = text.status().message();
    if (msg.rfind(path + ": ", 0) == 0) msg.erase(0, path.size() + 2);
    r.problems.push_back(std::move(msg));
    return r;
  }
  // The common case reads once; only an invalid trace is walked again to list every problem.
  StatusOr<Trace> trace = ParseTrace(*text);
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
  for (const Status& s : ValidateTraceText(*text)) r.problems.push_back(s.message());
  if (r.problems.empty()) r.problems.push_back(trace.status().message());
  return r;
}

}  // namespace

int RunValidate(const Argv& argv) {
  constexpr std::string_view kCmd = "validate";
  Args args(argv);
  args.Declare("--json", ArgKind::kSwitch,
               "print {\"files\": [{\"path\", \"valid\", \"units\", \"steps\", \"events\", "
               "\"problems\"}]}");
  args.Declare("-o", ArgKind::kValue, "write the output to FILE instead of stdout", "FILE");
  if (Status s = args.Parse(); !s.ok()) return Fail(kCmd, s);
  if (args.help()) {
    return PrintHelp(
        "fsdplab validate TRACE... [--json] [-o FILE]",
        "Checks each trace against the fsdplab.trace v1 format: JSON syntax, fields,\n"
        "units (unique names, parents, no cycle, each parameter owned once) and events\n"
        "(known units, every post after its pre, durations and sizes not negative), and the\n"
        "structure the scheduler relies on: each unit's pre/post pairs close in the right phase\n"
        "(forwards before the backward, recomputations before the unit's backward goes on,\n"
        "backwards before backward_end), and computes inside their phase.\n"
        "Prints 'TRACE: valid (N units, S steps, E events)' or every problem, one per\n"
        "line. Exit status: 0 all valid, 1 bad usage, 2 a trace is invalid.",
        args);
  }
  if (args.positionals().empty()) {
    return Fail(kCmd, UsageError("expected at least one TRACE file"));
  }
  std::vector<FileResult> results;
  bool all_valid = true;
  for (const std::string& path : args.positionals()) {
    results.push_back(Check(path));
    all_valid = all_valid && results.back().valid;
  }
  std::string out;
  if (args.Has("--json")) {
    nlohmann::ordered_json files = nlohmann::ordered_json::array();
    for (const FileResult& r : results) {
      nlohmann::ordered_json f;
      f["path"] = r.path;
      f["valid"] = r.valid;
      if (r.valid) {
        f["units"] = r.units;
        f["steps"] = r.steps;
        f["events"] = r.events;
      }
      f["problems"] = r.problems;
      files.push_back(std::move(f));
    }
    nlohmann::ordered_json doc;
    doc["files"] = std::move(files);
    out = doc.dump(2) + "\n";
  } else {
    for (const FileResult& r : results) {
      if (r.valid) {
        out += fmt::format("{}: valid ({} units, {} steps, {} events)\n", r.path, r.units, r.steps,
                           r.events);
        continue;
      }
      for (const std::string& p : r.problems) out += fmt::format("{}: {}\n", r.path, p);
      out += fmt::format("{}: invalid ({} problem{})\n", r.path, r.problems.size(),
                         r.problems.size() == 1 ? "" : "s");
    }
  }
  if (Status s = EmitOutput(args, out); !s.ok()) return Fail(kCmd, s);
  return all_valid ? 0 : 2;
}

}  // namespace fsdplab::cli
