// fsdplab order TRACE --order registration|recorded [--recompute-aware] [--json]
#include <fmt/format.h>

#include "cli_common.h"
#include "commands.h"
#include "fsdplab/core/execution_order.h"
#include "fsdplab/core/scheduler.h"
#include "fsdplab/core/trace.h"

namespace fsdplab::cli {

int RunOrder(const Argv& argv) {
  constexpr std::string_view kCmd = "order";
  Args args(argv);
  args.Declare("--json", ArgKind::kSwitch, "print {\"forward\": [...], \"backward\": [...]}");
  args.Declare("-o", ArgKind::kValue, "write the output to FILE instead of stdout", "FILE");
  DeclarePolicyFlags(args);
  if (Status s = args.Parse(); !s.ok()) return Fail(kCmd, s);
  if (args.help()) {
    return PrintHelp(
        "fsdplab order TRACE [--order registration|recorded] [--recompute-aware true] [--json]",
        "Prints the forward and backward execution orders the scheduler prefetches along.\n"
        "registration: units in registration order (backward: roots reversed, children\n"
        "reversed). recorded: the order the trace's first forward/backward pass ran in;\n"
        "with --recompute-aware true, reentrant recomputations appear as their own entries.",
        args);
  }
  if (args.positionals().size() != 1) {
    return Fail(kCmd, UsageError("expected exactly one TRACE (see --help)"));
  }
  StatusOr<Trace> trace = ReadReplayableTrace(args.positionals()[0]);
  if (!trace.ok()) return Fail(kCmd, trace.status());
  StatusOr<Policy> policy = PolicyFromArgs(args, *trace);
  if (!policy.ok()) return Fail(kCmd, policy.status());

  StatusOr<ExecutionOrder> order = PrefetchOrderOf(*trace, *policy);
  if (!order.ok()) return Fail(kCmd, order.status());
  std::string out = args.Has("--json")
                        ? order->ToJson(trace->model) + "\n"
                        : fmt::format("order: {}\n{}", PrefetchOrderName(policy->order),
                                      order->ToText(trace->model));
  if (Status s = EmitOutput(args, out); !s.ok()) return Fail(kCmd, s);
  return 0;
}

}  // namespace fsdplab::cli
