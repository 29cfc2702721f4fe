// fsdplab validate TRACE... [--json]: checks traces and lists every problem of each.
#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "cli_common.h"
#include "commands.h"
#include "fsdplab/core/file_util.h"
#include "fsdplab/trace/trace_io.h"
#include "fsdplab/trace/trace_structure.h"

namespace fsdplab::cli {

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
  std::vector<TraceCheck> results;
  bool all_valid = true;
  const std::vector<std::string>& paths = args.positionals();
  for (const std::string& path : paths) {
    results.push_back(CheckTraceFile(path));
    all_valid = all_valid && results.back().valid;
  }
  std::string out;
  if (args.Has("--json")) {
    nlohmann::ordered_json files = nlohmann::ordered_json::array();
    for (std::size_t i = 0; i < results.size(); ++i) {
      const TraceCheck& r = results[i];
      nlohmann::ordered_json f;
      f["path"] = paths[i];
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
    for (std::size_t i = 0; i < results.size(); ++i) {
      const TraceCheck& r = results[i];
      if (r.valid) {
        out += fmt::format("{}: valid ({} units, {} steps, {} events)\n", paths[i], r.units,
                           r.steps, r.events);
        continue;
      }
      for (const std::string& p : r.problems) out += fmt::format("{}: {}\n", paths[i], p);
      out += fmt::format("{}: invalid ({} problem{})\n", paths[i], r.problems.size(),
                         r.problems.size() == 1 ? "" : "s");
    }
  }
  if (Status s = EmitOutput(args, out); !s.ok()) return Fail(kCmd, s);
  return all_valid ? 0 : 2;
}

}  // namespace fsdplab::cli
