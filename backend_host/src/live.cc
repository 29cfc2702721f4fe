#include "fsdplab/host/live.h"

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <thread>
#include <unordered_map>

#include "fsdplab/core/scheduler.h"
#include "fsdplab/host/executor.h"
#include "fsdplab/host/numerics.h"
#include "fsdplab/host/process_group.h"
#include "fsdplab/host/runtime.h"
#include "fsdplab/live/launch.h"
#include "fsdplab/live/trace_recorder.h"
#include "fsdplab/live/wire.h"

namespace fsdplab::host {
namespace {

// The host backend's own options, after the ones every backend takes (ValidateLiveOptions).
Status CheckOptions(const Trace& trace, const LiveOptions& o, const HostRunOptions& h,
                    bool multi_process) {
  FSDP_RETURN_IF_ERROR(ValidateLiveOptions(
      trace, o,
      multi_process ? ""
                    : "die ends the rank's process, which needs one process per rank "
                      "(mpirun or torchrun)"));
  if (h.gemm_tokens < 1 || h.gemm_tokens > (1 << 20)) {
    return UsageError(fmt::format("gemm_tokens: {} is outside 1..{}", h.gemm_tokens, 1 << 20));
  }
  return Status::Ok();
}

// One rank's host thread: its scheduler over the trace, issuing into its executor.
struct RankRun {
  ExecutionOrder order;
  std::vector<Divergence> divergences;
  std::vector<std::vector<std::vector<TimeUs>>> issue_us;  // [step][microbatch][event]
  OpContext position;
};

void RunRankHost(const Trace& trace, const LiveOptions& options, RunControl& control,
                 StepBarrier& barrier, int check_step, HostExecutor& executor, RankRun& run) {
  const int rank = executor.rank();
  const Model& model = trace.model;
  Scheduler scheduler(model, options.policy, options.world_size);
  Status status;
  run.issue_us.resize(static_cast<std::size_t>(options.steps));
  for (int s = 0; s < options.steps && status.ok(); ++s) {
    const Step& step = trace.steps[static_cast<std::size_t>(s) % trace.steps.size()];
    auto& issue = run.issue_us[static_cast<std::size_t>(s)];
    issue.resize(step.microbatches.size());
    run.position = OpContext{rank, s, 0, "(none)", "step begin"};
    status = scheduler.StepBegin(s, executor);
    for (std::size_t mb = 0; mb < step.microbatches.size() && status.ok(); ++mb) {
      const std::vector<Event>& events = step.microbatches[mb].events;
      issue[mb].assign(events.size(), 0);
      for (std::size_t e = 0; e < events.size() && status.ok(); ++e) {
        const Event& event = events[e];
        if (event.op == Op::kCollective) continue;  // measured collectives are not replayed
        run.position =
            OpContext{rank, s, static_cast<int>(mb), std::string(model.NameOf(event.unit)),
                      std::string(OpName(event.op))};
        issue[mb][e] = control.NowUs();
        status = scheduler.OnEvent(
            event, CommandOrigin{s, static_cast<int>(mb), static_cast<int>(e)}, executor);
      }
    }
    if (status.ok()) {
      run.position = OpContext{rank, s, 0, "(none)", "step end"};
      status = scheduler.StepEnd(executor);
    }
    // The checked step ends on every stream of every rank before the next step is issued, so
    // that none of its checks runs inside a measured step.
    if (status.ok() && options.check && s == check_step && s + 1 < options.steps) {
      run.position = OpContext{rank, s, 0, "(none)", "end of the checked step"};
      status = executor.DrainStreams(run.position);
      if (status.ok()) status = barrier.Arrive(rank, run.position);
      if (!status.ok() && !control.aborted()) control.Fail(rank, status);
    }
  }
  if (!status.ok()) {
    scheduler.AbortStep();
    if (!control.aborted()) {
      // The scheduler itself refused (missing plane, divergence, illegal transition).
      status =
          Status(status.code(), fmt::format("{}: {}", run.position.Describe(), status.message()));
    }
    control.Fail(rank, status);
  }
  OpContext finish = run.position;
  finish.op = "finish (waiting for the streams)";
  Status finished = executor.Finish(finish);
  if (!finished.ok()) control.Fail(rank, finished);
  run.order = scheduler.order();
  run.divergences = scheduler.divergences();
}

Status CombinedError(const RunControl& control, int world_size) {
  const Status root = control.root_cause();
  std::string message = root.message();
  const std::vector<Status> errors = control.rank_errors();
  message += "\nevery rank stopped:";
  for (int r = 0; r < world_size; ++r) {
    const Status& e = errors[static_cast<std::size_t>(r)];
    message +=
        fmt::format("\n  {}", e.ok() ? fmt::format("rank {}: finished its work", r) : e.message());
  }
  return Status(root.code(), message);
}

// Accumulated reduced gradients of one rank: [unit][group][element] (HostExecutor::reduced_grads).
using ReducedGrads = std::vector<std::vector<std::vector<float>>>;

// The single-rank reference: every rank's gradients computed again from the unsharded originals
// and the same seeded inputs, summed in rank order, accumulated like the live shards. Compares
// the reduced shards of each rank in `live` (rank, its shards) element by element, bit for bit,
// into `checks` (one per entry of `live`; a process of a multi-process run checks its own rank).
void CheckGradients(const ModelData& data, const LiveOptions& options, std::int64_t gemm_tokens,
                    const std::vector<GradEvent>& events,
                    const std::vector<std::pair<int, const ReducedGrads*>>& live,
                    std::vector<LiveCheck>& checks) {
  checks.assign(live.size(), LiveCheck{});
  const int check_step = 0;
  const int w = options.world_size;
  const bool replicated = options.policy.sharding == Sharding::kNoShard;
  // hsdp: shard groups of S ranks reduce-scatter, then the R replicas of each shard all-reduce
  // it; the reference sums in the same order: within each group in rank order, rounded to the
  // reduce dtype, then the groups' partial sums in group order.
  const int shard_group = data.layout().shard_group_size();
  const int replicas = data.layout().replicas();
  std::vector<std::map<UnitId, GradBuffers>> pending(static_cast<std::size_t>(w));
  // reference[r][unit][group]
  std::vector<std::map<UnitId, std::vector<std::vector<float>>>> reference(
      static_cast<std::size_t>(w));
  std::vector<std::map<UnitId, GradBuffers>> patterns(static_cast<std::size_t>(w));
  for (const GradEvent& ev : events) {
    if (ev.origin.step != check_step) continue;  // only the checked step's gradients are kept
    if (!ev.reduce) {
      for (int q = 0; q < w; ++q) {
        auto& map = pending[static_cast<std::size_t>(q)];
        auto it = map.find(ev.unit);
        const bool fresh = it == map.end();
        if (fresh) it = map.emplace(ev.unit, NewGradBuffers(data, ev.unit)).first;
        if (options.compute == ComputeMode::kTimed) {
          auto& pattern = patterns[static_cast<std::size_t>(q)];
          auto p = pattern.find(ev.unit);
          if (p == pattern.end()) {
            p = pattern.emplace(ev.unit, TimedGradPattern(data, options.seed, q, ev.unit)).first;
          }
          AccumulateGrads(data, ev.unit, p->second, fresh, it->second);
        } else {
          AddWeightGradients(data, options.compute, gemm_tokens, options.seed, q, ev.origin,
                             ev.unit, it->second);
        }
      }
      continue;
    }
    const std::vector<GroupLayout>& groups = data.groups(ev.unit);
    std::vector<GradBuffers> inputs;
    for (int q = 0; q < w; ++q) {
      auto& map = pending[static_cast<std::size_t>(q)];
      auto it = map.find(ev.unit);
      inputs.push_back(it == map.end() ? NewGradBuffers(data, ev.unit) : std::move(it->second));
      if (it != map.end()) map.erase(it);
    }
    for (int r = 0; r < w; ++r) {
      auto& acc = reference[static_cast<std::size_t>(r)][ev.unit];
      acc.resize(groups.size());
      for (std::size_t g = 0; g < groups.size(); ++g) {
        const GroupLayout& gl = groups[g];
        // What this rank holds after the reduction: its shard, or (replicated, all-reduced) the
        // whole gradient, which the layout's grad_shard_elements already is (core/param_layout.h).
        const std::size_t n = gl.grad_shard_elements;
        const std::size_t first =
            replicated
                ? 0
                : static_cast<std::size_t>(data.layout().shard_rank_of(r)) * gl.grad_shard_elements;
        std::vector<std::byte> out(n * gl.grad_element_size);
        if (replicas == 1) {
          std::vector<const std::byte*> ins;
          for (const GradBuffers& b : inputs) ins.push_back(b[g].data());
          ReduceElements(gl.reduce_dtype, ins, first, n, out.data());
        } else {
          std::vector<std::vector<std::byte>> partial(static_cast<std::size_t>(replicas));
          std::vector<const std::byte*> sums;
          for (int k = 0; k < replicas; ++k) {
            std::vector<const std::byte*> ins;
            for (int q = k * shard_group; q < (k + 1) * shard_group; ++q) {
              ins.push_back(inputs[static_cast<std::size_t>(q)][g].data());
            }
            std::vector<std::byte>& sum = partial[static_cast<std::size_t>(k)];
            sum.resize(n * gl.grad_element_size);
            ReduceElements(gl.reduce_dtype, ins, first, n, sum.data());
            sums.push_back(sum.data());
          }
          ReduceElements(gl.reduce_dtype, sums, 0, n, out.data());
        }
        acc[g].resize(n, 0.0f);
        for (std::size_t i = 0; i < n; ++i)
          acc[g][i] += LoadElement(gl.reduce_dtype, out.data(), i);
      }
    }
  }
  for (std::size_t k = 0; k < live.size(); ++k) {
    const int r = live[k].first;
    const ReducedGrads& reduced = *live[k].second;
    LiveCheck& check = checks[k];
    for (UnitId u = 0; u < static_cast<UnitId>(reduced.size()); ++u) {
      const auto& groups = reduced[static_cast<std::size_t>(u)];
      const auto ref_it = reference[static_cast<std::size_t>(r)].find(u);
      for (std::size_t g = 0; g < groups.size(); ++g) {
        const std::vector<float>& got = groups[g];
        for (std::size_t i = 0; i < got.size(); ++i) {
          const float want = ref_it == reference[static_cast<std::size_t>(r)].end() ||
                                     ref_it->second[g].size() <= i
                                 ? 0.0f
                                 : ref_it->second[g][i];
          ++check.grad_elements_checked;
          if (std::bit_cast<std::uint32_t>(got[i]) != std::bit_cast<std::uint32_t>(want)) {
            ++check.grad_elements_wrong;
            check.grad_max_abs_error =
                std::max(check.grad_max_abs_error, static_cast<double>(std::fabs(got[i] - want)));
          }
        }
      }
    }
  }
}

// FNV-1a of a rank's reduced gradients, bit for bit (the cross-mode tests compare them).
std::uint64_t Digest(const ReducedGrads& reduced) {
  std::uint64_t h = 1469598103934665603ull;
  for (const auto& groups : reduced) {
    for (const std::vector<float>& g : groups) {
      for (float v : g) {
        const std::uint32_t bits = std::bit_cast<std::uint32_t>(v);
        for (int i = 0; i < 4; ++i) {
          h ^= (bits >> (8 * i)) & 0xff;
          h *= 1099511628211ull;
        }
      }
    }
  }
  return h;
}

// One rank's share of the result; in a multi-process run, what each rank sends to rank 0.
struct RankOutput {
  std::vector<TimelineOp> ops;
  std::vector<MemorySample> memory;
  std::vector<ExecutedOp> executed;
  ExecutorStats stats;
  std::vector<std::vector<std::vector<TimeUs>>> issue_us;  // [step][microbatch][event]
  LiveCheck grads;  // the gradient fields of this rank's check
  std::uint64_t grad_digest = 0;
};

std::string Pack(const RankOutput& o) {
  WireWriter p;
  p.Pod(static_cast<std::uint64_t>(o.ops.size()));
  for (const TimelineOp& op : o.ops) {
    p.Pod(op.id);
    p.Pod(op.rank);
    p.Pod(op.track);
    p.Pod(op.kind);
    p.Pod(op.unit);
    p.Pod(op.phase);
    p.Pod(op.reason);
    p.Pod(op.planes.bits());
    p.Pod(op.bytes);
    p.Pod(op.step);
    p.Pod(op.microbatch);
    p.Pod(op.event);
    p.Pod(op.start_us);
    p.Pod(op.end_us);
    p.PodVector(op.waited_on);
    p.Str(op.name);
    p.Str(op.args_json);
  }
  p.PodVector(o.memory);
  p.PodVector(o.executed);
  p.Pod(o.stats);
  p.Pod(static_cast<std::uint64_t>(o.issue_us.size()));
  for (const auto& step : o.issue_us) {
    p.Pod(static_cast<std::uint64_t>(step.size()));
    for (const auto& mb : step) p.PodVector(mb);
  }
  p.Pod(o.grads.grad_elements_checked);
  p.Pod(o.grads.grad_elements_wrong);
  p.Pod(o.grads.grad_max_abs_error);
  p.Pod(o.grad_digest);
  return p.Take();
}

StatusOr<RankOutput> Unpack(std::string_view bytes, int rank) {
  WireReader u(bytes);
  RankOutput o;
  const auto ops = u.Pod<std::uint64_t>();
  for (std::uint64_t i = 0; i < ops && !u.bad(); ++i) {
    TimelineOp op;
    op.id = u.Pod<std::int64_t>();
    op.rank = u.Pod<int>();
    op.track = u.Pod<Track>();
    op.kind = u.Pod<OpKind>();
    op.unit = u.Pod<UnitId>();
    op.phase = u.Pod<Phase>();
    op.reason = u.Pod<GatherReason>();
    const auto bits = u.Pod<std::uint8_t>();
    op.planes = (bits & 1) ? PlaneSet::Rowwise() : PlaneSet::None();
    if (bits & 2) op.planes = op.planes | PlaneSet::Columnwise();
    op.bytes = u.Pod<Bytes>();
    op.step = u.Pod<int>();
    op.microbatch = u.Pod<int>();
    op.event = u.Pod<int>();
    op.start_us = u.Pod<TimeUs>();
    op.end_us = u.Pod<TimeUs>();
    op.waited_on = u.PodVector<std::int64_t>();
    op.name = u.Str();
    op.args_json = u.Str();
    o.ops.push_back(std::move(op));
  }
  o.memory = u.PodVector<MemorySample>();
  o.executed = u.PodVector<ExecutedOp>();
  o.stats = u.Pod<ExecutorStats>();
  o.issue_us.resize(static_cast<std::size_t>(u.Pod<std::uint64_t>()));
  for (auto& step : o.issue_us) {
    step.resize(static_cast<std::size_t>(u.Pod<std::uint64_t>()));
    for (auto& mb : step) mb = u.PodVector<TimeUs>();
  }
  o.grads.grad_elements_checked = u.Pod<std::uint64_t>();
  o.grads.grad_elements_wrong = u.Pod<std::uint64_t>();
  o.grads.grad_max_abs_error = u.Pod<double>();
  o.grad_digest = u.Pod<std::uint64_t>();
  if (!u.ok()) {
    return InternalError(
        fmt::format("rank {} sent rank 0 a result of {} bytes that does not "
                    "read back (ranks running different fsdplab binaries?)",
                    rank, bytes.size()));
  }
  return o;
}

RankOutput Collect(HostExecutor& e, RankRun& run) {
  RankOutput o;
  o.ops = e.TakeOps();
  o.memory = e.TakeMemory();
  o.executed = e.TakeExecuted();
  o.stats = e.stats();
  o.issue_us = std::move(run.issue_us);
  o.grad_digest = Digest(e.reduced_grads());
  return o;
}

ExecutorConfig MakeConfig(const Trace& trace, const LiveOptions& options,
                          const HostRunOptions& host_options, UnitId fail_unit) {
  ExecutorConfig config;
  config.gather_copy_out_us = GatherCopyOutUs(trace);
  config.compute = options.compute;
  config.compute_scale = options.compute_scale;
  config.gemm_tokens = host_options.gemm_tokens;
  config.seed = options.seed;
  config.check = options.check;
  config.check_step = 0;
  config.fault = FaultInjection{.rank = options.fail_rank,
                                .op = options.fail_op,
                                .step = options.fail_step,
                                .unit = fail_unit};
  config.unified_comm_stream = options.policy.unified_comm_stream;
  config.log_executed_ops = options.log_executed_ops;
  return config;
}

// Rank 0's result from every rank's output: one timeline (ids unique over the run, a gather's
// waits pointing at it), notes on the emulated device's clock, the checks, the recorded traces.
LiveResult Assemble(const Trace& trace, const LiveOptions& options,
                    const HostRunOptions& host_options, int world_size,
                    std::vector<RankOutput>& outputs, const RankRun& rank0,
                    std::vector<std::string> notes) {
  LiveResult result;
  Timeline& tl = result.timeline;
  tl.source = "live-host";
  tl.world_size = world_size;
  tl.ranks_recorded = world_size;
  std::vector<TimelineOp> ops;
  for (RankOutput& out : outputs) {
    std::vector<TimelineOp>& rank_ops = out.ops;
    // Ids are per rank; make them unique over the run.
    const std::int64_t base = static_cast<std::int64_t>(ops.size());
    std::sort(rank_ops.begin(), rank_ops.end(),
              [](const TimelineOp& a, const TimelineOp& b) { return a.id < b.id; });
    std::unordered_map<std::int64_t, std::int64_t> local;
    for (std::size_t i = 0; i < rank_ops.size(); ++i) {
      local[rank_ops[i].id] = base + static_cast<std::int64_t>(i) + 1;
    }
    for (TimelineOp& op : rank_ops) {
      op.id = local[op.id];
      for (std::int64_t& id : op.waited_on) id = local.count(id) ? local[id] : 0;
      ops.push_back(std::move(op));
    }
    result.executed.insert(result.executed.end(), out.executed.begin(), out.executed.end());
    tl.memory.insert(tl.memory.end(), out.memory.begin(), out.memory.end());
  }
  std::stable_sort(ops.begin(), ops.end(), [](const TimelineOp& a, const TimelineOp& b) {
    if (a.start_us != b.start_us) return a.start_us < b.start_us;
    return a.rank < b.rank;
  });
  tl.ops = std::move(ops);

  // Honest accounting of the emulated device time.
  int timed = 0;
  int overruns = 0;
  TimeUs wake_sum = 0;
  TimeUs wake_abs_sum = 0;
  TimeUs wake_max = 0;
  TimeUs overrun_sum = 0;
  ExecutorStats::Wakes comm_wakes;
  for (const RankOutput& out : outputs) {
    for (const ExecutorStats::Wakes& w : out.stats.comm_wakes) comm_wakes.Add(w);
    timed += out.stats.timed_computes;
    overruns += out.stats.overruns;
    wake_sum += out.stats.wake_error_sum_us;
    wake_abs_sum += out.stats.wake_error_abs_sum_us;
    overrun_sum += out.stats.overrun_sum_us;
    wake_max = std::max(wake_max, out.stats.wake_error_max_us);
  }
  result.notes = std::move(notes);
  if (options.compute == ComputeMode::kGemm) {
    result.notes.push_back(fmt::format(
        "compute: fp32 CPU GEMMs on the gathered weights, {} tokens; unowned work (loss, "
        "optimizer) is emulated for its trace duration",
        host_options.gemm_tokens));
  } else {
    result.notes.push_back(fmt::format(
        "compute: an emulated device (no core used): each kernel lasts its trace duration x {} "
        "and starts when it was issued, its stream was free and its events had fired",
        options.compute_scale));
  }
  if (timed > 0) {
    result.notes.push_back(fmt::format(
        "emulated computes: {}; the compute thread signalled their end {:+.1f} us from "
        "it on average ({:.1f} us mean |error|, max {:.1f} us); a late signal delays the "
        "streams waiting on it, an early one does not let them go on before the end",
        timed, wake_sum / timed, wake_abs_sum / timed, wake_max));
  }
  if (comm_wakes.count > 0) {
    result.notes.push_back(fmt::format(
        "communication streams that waited on an event went on {:.1f} us after it fired on "
        "average ({} waits after the first step, every rank; max {:.1f} us): thread wake-ups, "
        "which the simulator takes from the cluster's stream_wake_us (bench-gather --op "
        "concurrent)",
        comm_wakes.sum_us / comm_wakes.count, comm_wakes.count, comm_wakes.max_us));
  }
  if (overruns > 0) {
    result.notes.push_back(fmt::format(
        "emulated computes: {} lasted longer than their trace duration, by {:.1f} us on average: "
        "writing the checked gradients took longer (a run without checks has no gradient writes)",
        overruns, overrun_sum / overruns));
  }
  tl.notes = result.notes;

  if (options.check) {
    LiveCheck& check = result.check;
    check.tolerance = "exact";
    check.step = 0;
    for (const RankOutput& out : outputs) {
      check.gathered_bytes_checked += out.stats.gathered_bytes_checked;
      check.gathered_bytes_wrong += out.stats.gathered_bytes_wrong;
      check.check_us += out.stats.check_us();
      check.grad_elements_checked += out.grads.grad_elements_checked;
      check.grad_elements_wrong += out.grads.grad_elements_wrong;
      check.grad_max_abs_error = std::max(check.grad_max_abs_error, out.grads.grad_max_abs_error);
      check.reduced_grad_digests.push_back(out.grad_digest);
    }
  }
  result.order = rank0.order;
  result.divergences = rank0.divergences;
  LiveRecording rec;
  rec.source = "live-host";
  rec.world_size = world_size;
  for (int r = 0; r < world_size; ++r) rec.ranks.push_back(r);
  rec.steps = options.steps;
  rec.extra_json =
      fmt::format(R"({{"compute": "{}", "compute_scale": {}}})",
                  options.compute == ComputeMode::kGemm ? "gemm" : "timed", options.compute_scale);
  rec.issue_us = [&outputs](int rank, int s, int mb, int e) -> std::optional<TimeUs> {
    const auto& issue = outputs[static_cast<std::size_t>(rank)].issue_us;
    return issue[static_cast<std::size_t>(s)][static_cast<std::size_t>(mb)]
                [static_cast<std::size_t>(e)];
  };
  result.recorded = RecordLiveTraces(trace, tl, rec);
  return result;
}

// Every rank a thread of this process; collectives are in-process copies and sums.
StatusOr<LiveResult> RunInProcess(const Trace& trace, const LiveOptions& options,
                                  const HostRunOptions& host_options, const ModelData& data,
                                  const ExecutorConfig& config) {
  const int w = options.world_size;
  RunControl control(options.timeout_us, w);
  RankBarrier barrier(control, w);
  const bool unified = options.policy.unified_comm_stream;
  // One communicator per shard group (the world but under hsdp) and stream, and under hsdp one
  // per replica column, as NCCL sub-communicators (MeshGroup: the same groups and names as
  // across processes).
  const ModelLayout& mesh = data.layout();
  const int shard_group = mesh.shard_group_size();
  const int replicas = mesh.replicas();
  std::vector<std::unique_ptr<Communicator>> gathers;
  std::vector<std::unique_ptr<Communicator>> scatters;
  std::vector<std::unique_ptr<Communicator>> columns;
  // Under hsdp a communicator's name says which ranks it joins, and its errors name them.
  auto shard_comm = [&](std::string_view what, int k) {
    if (replicas == 1) {
      return std::make_unique<Communicator>(control, shard_group, std::string(what));
    }
    const MeshGroup g = ShardGroup(mesh, k);
    return std::make_unique<Communicator>(control, shard_group, g.CommName(what), g.ranks);
  };
  for (int k = 0; k < replicas; ++k) {
    gathers.push_back(shard_comm(unified ? "communication" : "all_gather", k));
    scatters.push_back(shard_comm("reduce_scatter", k));
  }
  if (replicas > 1) {
    for (int c = 0; c < shard_group; ++c) {
      const MeshGroup g = ReplicaColumn(mesh, c);
      columns.push_back(
          std::make_unique<Communicator>(control, replicas, g.CommName("all_reduce"), g.ranks));
    }
  }
  std::vector<std::unique_ptr<HostExecutor>> executors;
  for (int r = 0; r < w; ++r) {
    const auto row = static_cast<std::size_t>(data.layout().shard_group_of(r));
    Communicator& ag = *gathers[row];
    executors.push_back(std::make_unique<HostExecutor>(
        trace.model, data, config, control, ag, unified ? ag : *scatters[row], r,
        replicas > 1 ? columns[static_cast<std::size_t>(data.layout().shard_rank_of(r))].get()
                     : nullptr));
  }
  for (auto& e : executors) e->Start();
  std::vector<RankRun> runs(static_cast<std::size_t>(w));
  {
    std::vector<std::thread> hosts;
    for (int r = 0; r < w; ++r) {
      hosts.emplace_back([&, r] {
        RunRankHost(trace, options, control, barrier, config.check_step,
                    *executors[static_cast<std::size_t>(r)], runs[static_cast<std::size_t>(r)]);
      });
    }
    for (std::thread& t : hosts) t.join();
  }
  if (control.aborted()) return CombinedError(control, w);

  std::vector<RankOutput> outputs;
  std::vector<std::pair<int, const ReducedGrads*>> live;
  for (int r = 0; r < w; ++r) {
    outputs.push_back(
        Collect(*executors[static_cast<std::size_t>(r)], runs[static_cast<std::size_t>(r)]));
    live.emplace_back(r, &executors[static_cast<std::size_t>(r)]->reduced_grads());
  }
  if (options.check) {
    std::vector<LiveCheck> checks;
    CheckGradients(data, options, host_options.gemm_tokens, executors[0]->grad_events(), live,
                   checks);
    for (int r = 0; r < w; ++r) {
      outputs[static_cast<std::size_t>(r)].grads = checks[static_cast<std::size_t>(r)];
    }
  }
  std::vector<std::string> notes = {fmt::format(
      "host backend: {} ranks as threads in one process on {} cores; collectives are in-process "
      "copies and rank-ordered fp32 sums",
      w, std::thread::hardware_concurrency())};
  return Assemble(trace, options, host_options, w, outputs, runs[0], std::move(notes));
}

// One rank per process (mpirun, srun): this process runs rank `launch.rank`; every rank's output
// is gathered to rank 0, which returns the whole result (the others return report_rank false).
StatusOr<LiveResult> RunAcrossProcesses(const Trace& trace, LiveOptions options,
                                        const HostRunOptions& host_options, UnitId fail_unit,
                                        const LaunchInfo& launch) {
  std::vector<std::string> notes;
  const int w = launch.world_size;
  const int rank = launch.rank;
  if (options.world_size != w) {
    notes.push_back(fmt::format("world size {} from {} (the option said {})", w,
                                LauncherName(launch.launcher), options.world_size));
    options.world_size = w;
  }
  if (options.fail_rank && *options.fail_rank >= w) {
    return UsageError(
        fmt::format("fail_rank: {} is not one of the {} ranks", *options.fail_rank, w));
  }
  FSDP_ASSIGN_OR_RETURN(ModelData data,
                        ModelData::Create(trace.model, options.policy, w, options.seed));
  const ExecutorConfig config = MakeConfig(trace, options, host_options, fail_unit);
  RunControl control(options.timeout_us, w);
  const bool unified = options.policy.unified_comm_stream;
  FSDP_ASSIGN_OR_RETURN(std::unique_ptr<ProcessGroup> group,
                        ProcessGroup::Create(launch, control, unified, &data.layout()));
  FSDP_ASSIGN_OR_RETURN(const ClockAlignment clocks, group->AlignClocks());
  RankRun run;
  RankOutput mine;
  Status failed;
  auto executor =
      std::make_unique<HostExecutor>(trace.model, data, config, control, group->all_gather(),
                                     group->reduce_scatter(), rank, group->all_reduce());
  {
    HostExecutor& exec = *executor;
    exec.Start();
    RunRankHost(trace, options, control, group->barrier(), config.check_step, exec, run);
    if (control.aborted()) {
      const std::vector<Status> errors = control.rank_errors();
      failed = errors[static_cast<std::size_t>(rank)].ok() ? control.root_cause()
                                                           : errors[static_cast<std::size_t>(rank)];
    } else {
      mine = Collect(exec, run);
      if (options.check) {
        std::vector<LiveCheck> checks;
        CheckGradients(data, options, host_options.gemm_tokens, exec.grad_events(),
                       {{rank, &exec.reduced_grads()}}, checks);
        mine.grads = checks[0];
      }
    }
  }
  // Every rank's output (or where it stopped) to rank 0. After a failure the others have
  // already been told and are stopping too.
  WireWriter p;
  p.Pod(static_cast<std::uint8_t>(failed.ok() ? 1 : 0));
  if (failed.ok()) {
    p.Str(Pack(mine));
  } else {
    p.Pod(static_cast<std::int32_t>(failed.code()));
    p.Str(failed.message());
  }
  const OpContext ctx{rank, options.steps - 1, 0, "(none)", "gathering the results to rank 0"};
  StatusOr<std::vector<std::string>> parts = group->GatherToRoot(p.Take(), ctx, options.timeout_us);
  if (!failed.ok()) {
    // Collectives of the failed step may still be in flight in the engine, on the executor's
    // buffers and the group's: both stay until the process ends, which every rank of a failed
    // run ends alike (under MPI with MPI_Abort, after every rank has had a moment to report;
    // MPI_Finalize would wait for ranks that abandoned a collective).
    (void)executor.release();
    ProcessGroup::Abandon(std::move(group));
  }
  if (!parts.ok()) return failed.ok() ? parts.status() : failed;
  if (rank != 0) {
    if (!failed.ok()) return failed;
    LiveResult result;
    result.report_rank = false;
    return result;
  }
  std::vector<RankOutput> outputs(static_cast<std::size_t>(w));
  std::vector<Status> errors(static_cast<std::size_t>(w));
  bool any_failed = !failed.ok();
  for (int q = 0; q < w; ++q) {
    WireReader u((*parts)[static_cast<std::size_t>(q)]);
    const bool ok = u.Pod<std::uint8_t>() == 1;
    if (ok) {
      const std::string packed = u.Str();
      FSDP_ASSIGN_OR_RETURN(outputs[static_cast<std::size_t>(q)], Unpack(packed, q));
    } else {
      const auto code = static_cast<StatusCode>(u.Pod<std::int32_t>());
      errors[static_cast<std::size_t>(q)] = Status(code, u.Str());
      any_failed = true;
    }
  }
  if (any_failed) {
    // The root cause as rank 0 heard it first (its own failure or another rank's message), else
    // the first rank's error.
    Status root = control.root_cause();
    for (const Status& e : errors) {
      if (root.ok() && !e.ok()) root = e;
    }
    std::string message = root.message();
    message += "\nevery rank stopped:";
    for (int q = 0; q < w; ++q) {
      const Status& e = errors[static_cast<std::size_t>(q)];
      message += fmt::format("\n  {}",
                             e.ok() ? fmt::format("rank {}: finished its work", q) : e.message());
    }
    return Status(root.code(), message);
  }
  // One clock: rank r's times less its measured offset from rank 0's.
  for (int q = 1; q < w; ++q) {
    const TimeUs off = clocks.offset_us[static_cast<std::size_t>(q)];
    RankOutput& out = outputs[static_cast<std::size_t>(q)];
    for (TimelineOp& op : out.ops) {
      op.start_us -= off;
      op.end_us -= off;
    }
    for (MemorySample& m : out.memory) m.t_us -= off;
    for (auto& step : out.issue_us) {
      for (auto& mb : step) {
        for (TimeUs& t : mb) t -= off;
      }
    }
  }
  TimeUs max_offset = 0;
  for (TimeUs off : clocks.offset_us) max_offset = std::max(max_offset, std::fabs(off));
  notes.insert(notes.begin(),
               fmt::format("host backend: {} ranks as processes ({}), one per rank on {} cores "
                           "of this machine; collectives over {} (all-gather; reduce-scatter "
                           "as an all-to-all of the slices, then rank-ordered fp32 sums)",
                           w, LauncherName(launch.launcher), std::thread::hardware_concurrency(),
                           group->engine_name()));
  if (data.layout().replicas() > 1) {
    notes.push_back(fmt::format(
        "hsdp across processes: each rank all-gathers and reduce-scatters within its shard "
        "group of {} ranks and all-reduces within its replica column of {}, each on a "
        "sub-group of its own over {}",
        data.layout().shard_group_size(), data.layout().replicas(), group->engine_name()));
  }
  notes.push_back(fmt::format(
      "clocks: every rank took its origin on leaving one barrier; rank 0 then measured each "
      "rank's remaining offset by ping-pong (largest {:.1f} us, known to +-{:.1f} us) and the "
      "timeline subtracts it",
      max_offset, clocks.max_round_trip_us / 2));
  return Assemble(trace, options, host_options, w, outputs, run, std::move(notes));
}

}  // namespace

StatusOr<LiveResult> RunLiveSteps(const Trace& trace, const LiveOptions& options,
                                  const HostRunOptions& host_options) {
  LaunchInfo launch;
  if (host_options.launch) {
    launch = *host_options.launch;
  } else {
    FSDP_ASSIGN_OR_RETURN(launch, DetectLaunch());
  }
  LiveOptions checked = options;
  if (launch.multi_process()) checked.world_size = launch.world_size;
  FSDP_RETURN_IF_ERROR(CheckOptions(trace, checked, host_options, launch.multi_process()));
  FSDP_ASSIGN_OR_RETURN(const UnitId fail_unit, FaultUnit(trace.model, options));
  FSDP_ASSIGN_OR_RETURN(const bool processes, StartRankProcesses(launch));
  if (processes) return RunAcrossProcesses(trace, options, host_options, fail_unit, launch);
  FSDP_ASSIGN_OR_RETURN(ModelData data, ModelData::Create(trace.model, options.policy,
                                                          options.world_size, options.seed));
  return RunInProcess(trace, options, host_options, data,
                      MakeConfig(trace, options, host_options, fail_unit));
}

}  // namespace fsdplab::host
