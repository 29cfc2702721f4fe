// fsdplab: record, simulate, run live and compare FSDP all-gather schedules.
#include <fmt/format.h>

#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

#include "commands.h"

namespace {

struct Subcommand {
  std::string_view name;
  std::string_view summary;
  int (*run)(const fsdplab::cli::Argv&);
};

int RunRun(const fsdplab::cli::Argv& a) { return fsdplab::cli::RunLive(a, /*record=*/false); }
int RunRecord(const fsdplab::cli::Argv& a) { return fsdplab::cli::RunLive(a, /*record=*/true); }

constexpr Subcommand kSubcommands[] = {
    {"simulate", "replay a trace in virtual time under a policy; report overlap, step time, memory",
     fsdplab::cli::RunSimulate},
    {"sweep", "simulate a grid of policies; table, CSV, plot, best policy under a memory cap",
     fsdplab::cli::RunSweep},
    {"tune", "the fastest per-unit policy under a memory cap, and how far from the best it can be",
     fsdplab::cli::RunTune},
    {"run", "run live steps (--backend host|cuda) and report what was measured", RunRun},
    {"record", "run live steps and write them as a trace", RunRecord},
    {"compare", "compare a simulated report with a measured one, per step and per op",
     fsdplab::cli::RunCompare},
    {"report", "one self-contained HTML page of a run, a comparison, a sweep or a calibration",
     fsdplab::cli::RunReport},
    {"bench-gather", "all-gather / reduce-scatter bandwidth with and without overlapped compute",
     fsdplab::cli::RunBenchGather},
    {"calibrate", "fit the collective cost model to nccl-tests output; write a cluster file",
     fsdplab::cli::RunCalibrate},
    {"cost", "a collective's time per size under a cluster file, and which tier and segment",
     fsdplab::cli::RunCost},
    {"validate", "check a trace; list every problem", fsdplab::cli::RunValidate},
    {"order", "print the forward and backward execution orders of a trace", fsdplab::cli::RunOrder},
    {"schedule", "print the scheduler's command stream for each step", fsdplab::cli::RunSchedule},
    {"synth", "generate the trace of a GPT/Llama-like model", fsdplab::cli::RunSynth},
    {"export-policy",
     "write the Python (or JSON) that applies a policy to a live FSDP2 / Megatron-FSDP model",
     fsdplab::cli::RunExportPolicy},
    {"import-policy", "read an exported policy back as the policy the framework runs",
     fsdplab::cli::RunImportPolicy},
    {"import-kineto", "convert PyTorch profiler traces of an FSDP2 run into traces (per rank)",
     fsdplab::cli::RunImportKineto},
};

void PrintUsage(std::FILE* out) {
  fmt::print(
      out,
      "usage: fsdplab <command> [options]\n\n"
      "FSDP / ZeRO-3 parameter all-gather schedules: record, simulate, run live, compare.\n\n"
      "commands:\n");
  for (const Subcommand& s : kSubcommands) fmt::print(out, "  {:<13} {}\n", s.name, s.summary);
  fmt::print(out, "\n'fsdplab <command> --help' describes a command's options.\n");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    PrintUsage(stderr);
    return 1;
  }
  std::string_view name = argv[1];
  if (name == "--help" || name == "-h" || name == "help") {
    PrintUsage(stdout);
    return 0;
  }
  fsdplab::cli::Argv rest(argv + 2, argv + argc);
  for (const Subcommand& s : kSubcommands) {
    if (s.name == name) return s.run(rest);
  }
  fmt::print(stderr, "fsdplab: unknown command '{}'\n\n", name);
  PrintUsage(stderr);
  return 1;
}
