// fsdplab schedule TRACE [policy flags] [--steps N] [--world-size W] [--json]
#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "cli_common.h"
#include "commands.h"
#include "fsdplab/core/command.h"
#include "fsdplab/core/limits.h"
#include "fsdplab/core/scheduler.h"
#include "fsdplab/core/trace.h"

namespace fsdplab::cli {
namespace {

nlohmann::json CommandJson(const Command& c, const Model& model) {
  nlohmann::json j;
  j["step"] = c.origin.step;
  j["microbatch"] = c.origin.microbatch;
  j["event"] = c.origin.event;
  std::visit(
      [&](const auto& b) {
        using T = std::decay_t<decltype(b)>;
        auto unit_name = [&](UnitId u) {
          return u == kNoUnit ? nlohmann::json(nullptr) : nlohmann::json(model.NameOf(u));
        };
        auto pieces = [&](const std::vector<PlanePiece>& ps, UnitId u) {
          nlohmann::json arr = nlohmann::json::array();
          for (const PlanePiece& p : ps) {
            const ParamGroup& g = model.unit(u).groups()[static_cast<std::size_t>(p.group)];
            arr.push_back({{"dtype", DTypeName(g.dtype)},
                           {"planes", g.multi_plane() ? p.planes.Name() : "data"},
                           {"bytes", p.bytes},
                           {"shard_bytes", p.shard_bytes}});
          }
          return arr;
        };
        if constexpr (std::is_same_v<T, GatherCmd>) {
          j["cmd"] = "gather";
          j["unit"] = unit_name(b.unit);
          j["phase"] = PhaseName(b.phase);
          j["reason"] = GatherReasonName(b.reason);
          j["bytes"] = b.bytes;
          j["pieces"] = pieces(b.pieces, b.unit);
        } else if constexpr (std::is_same_v<T, WaitGatherCmd>) {
          j["cmd"] = "wait_gather";
          j["unit"] = unit_name(b.unit);
        } else if constexpr (std::is_same_v<T, ComputeCmd>) {
          j["cmd"] = "compute";
          j["unit"] = unit_name(b.unit);
          j["phase"] = PhaseName(b.phase);
          j["us"] = b.us;
          j["inside_recompute"] = b.inside_recompute;
          j["saved_bytes"] = b.saved_bytes;
          j["freed_bytes"] = b.freed_bytes;
        } else if constexpr (std::is_same_v<T, StreamWaitCmd>) {
          j["cmd"] = "stream_wait";
          j["waiter"] = StreamName(b.waiter);
          j["signaler"] = StreamName(b.signaler);
        } else if constexpr (std::is_same_v<T, ReleaseCmd>) {
          j["cmd"] = "release";
          j["unit"] = unit_name(b.unit);
          j["bytes"] = b.bytes;
          j["pieces"] = pieces(b.pieces, b.unit);
          j["dropped_prefetch"] = b.dropped_prefetch;
        } else if constexpr (std::is_same_v<T, ReduceScatterCmd>) {
          j["cmd"] = b.kind == CollectiveKind::kAllReduce ? "all_reduce" : "reduce_scatter";
          j["unit"] = unit_name(b.unit);
          j["bytes"] = b.bytes;
          j["shard_bytes"] = b.shard_bytes;
        } else if constexpr (std::is_same_v<T, PassEndCmd>) {
          j["cmd"] = "pass_end";
          j["freed_bytes"] = b.freed_bytes;
        } else {
          j["cmd"] = "step_end";
        }
      },
      c.body);
  return j;
}

}  // namespace

int RunSchedule(const Argv& argv) {
  constexpr std::string_view kCmd = "schedule";
  Args args(argv);
  args.Declare("--steps", ArgKind::kValue, "steps to schedule (default: the trace's)", "N");
  args.Declare("--world-size", ArgKind::kValue, "data-parallel ranks (default: the trace's)", "W");
  args.Declare("--json", ArgKind::kSwitch, "print the commands as JSON");
  args.Declare("-o", ArgKind::kValue, "write the output to FILE instead of stdout", "FILE");
  DeclarePolicyFlags(args);
  if (Status s = args.Parse(); !s.ok()) return Fail(kCmd, s);
  if (args.help()) {
    return PrintHelp("fsdplab schedule TRACE [policy flags] [--steps N] [--json]",
                     "Prints the command stream the scheduler emits for each step, in host\n"
                     "program order: gathers (with planes and reason), waits, computes,\n"
                     "releases, reduce-scatters, and the stream waits of the stream protocol.",
                     args);
  }
  if (args.positionals().size() != 1) {
    return Fail(kCmd, UsageError("expected exactly one TRACE (see --help)"));
  }
  StatusOr<Trace> trace = ReadReplayableTrace(args.positionals()[0]);
  if (!trace.ok()) return Fail(kCmd, trace.status());
  StatusOr<Policy> policy = PolicyFromArgs(args, *trace);
  if (!policy.ok()) return Fail(kCmd, policy.status());
  int steps = static_cast<int>(trace->steps.size());
  int world = trace->meta.world_size;
  if (auto v = args.Get("--steps")) {
    StatusOr<std::int64_t> n = ParseInt(*v, "--steps");
    if (!n.ok()) return Fail(kCmd, n.status());
    if (*n < 1) return Fail(kCmd, UsageError("--steps must be at least 1"));
    if (*n > kMaxSteps) {
      return Fail(kCmd,
                  UsageError(fmt::format("--steps: {} is more than the {} steps a run may have", *n,
                                         kMaxSteps)));
    }
    steps = static_cast<int>(*n);
  }
  if (auto v = args.Get("--world-size")) {
    StatusOr<std::int64_t> n = ParseInt(*v, "--world-size");
    if (!n.ok()) return Fail(kCmd, n.status());
    if (*n < 1) return Fail(kCmd, UsageError("--world-size must be at least 1"));
    world = static_cast<int>(*n);
  }
  Scheduler scheduler(trace->model, *policy, world);
  CommandLog log;
  Status run = ReplaySteps(*trace, steps, scheduler, log);
  const Model& model = trace->model;
  std::string out;
  if (args.Has("--json")) {
    nlohmann::json j;
    j["policy"] = nlohmann::json::parse(PolicyToJson(*policy));
    j["world_size"] = world;
    j["order"] = nlohmann::json::parse(scheduler.order().ToJson(model));
    j["commands"] = nlohmann::json::array();
    for (const Command& c : log.commands()) j["commands"].push_back(CommandJson(c, model));
    j["errors"] = nlohmann::json::array();
    if (!run.ok()) j["errors"].push_back(run.message());
    out = j.dump(1) + "\n";
  } else {
    out += fmt::format("policy: {}\nworld size: {}\n", PolicyToJson(*policy), world);
    int last_step = -1;
    int last_mb = -1;
    for (const Command& c : log.commands()) {
      if (c.origin.step != last_step) {
        out += fmt::format("\n== step {} ==\n", c.origin.step);
        last_step = c.origin.step;
        last_mb = -1;
      }
      if (c.origin.microbatch != last_mb && c.origin.event >= 0) {
        out += fmt::format("-- microbatch {} --\n", c.origin.microbatch);
        last_mb = c.origin.microbatch;
      }
      std::string where = c.origin.event >= 0 ? fmt::format("e{:<4}", c.origin.event) : "     ";
      out += fmt::format("  {} {}\n", where, DescribeCommand(c, model));
    }
    out += fmt::format("\norder now: {}\n{}", PrefetchOrderName(policy->order),
                       scheduler.order().ToText(model));
    if (!run.ok()) out += fmt::format("\nERROR: {}\n", run.message());
  }
  if (Status s = EmitOutput(args, out); !s.ok()) return Fail(kCmd, s);
  return run.ok() ? 0 : Fail(kCmd, run);
}

}  // namespace fsdplab::cli
