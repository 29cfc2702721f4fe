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
#include "fsdplab/core/trace_recorder.h"
#include "fsdplab/host/executor.h"
#include "fsdplab/host/numerics.h"
#include "fsdplab/host/runtime.h"

namespace fsdplab::host {
namespace {

constexpr int kMaxWorldSize = 256;

Status CheckOptions(const Trace& trace, const LiveOptions& o, const HostRunOptions& h) {
  if (o.world_size < 1 || o.world_size > kMaxWorldSize) {
    return UsageError(fmt::format("world_size: {} is outside 1..{}", o.world_size, kMaxWorldSize));
  }
  if (o.steps < 1) return UsageError(fmt::format("steps: {} is not positive", o.steps));
  if (!(o.timeout_us > 0) || !std::isfinite(o.timeout_us)) {
    return UsageError(fmt::format("timeout_us: {} must be positive", o.timeout_us));
  }
  if (!(o.compute_scale > 0) || !std::isfinite(o.compute_scale)) {
    return UsageError(fmt::format("compute_scale: {} must be positive", o.compute_scale));
  }
  if (h.gemm_tokens < 1 || h.gemm_tokens > (1 << 20)) {
    return UsageError(fmt::format("gemm_tokens: {} is outside 1..{}", h.gemm_tokens, 1 << 20));
  }
  if (!o.fail_op.empty() && o.fail_op != "compute" && o.fail_op != "mismatch" &&
      o.fail_op != "hang") {
    return UsageError(
        fmt::format("fail_op: unknown fault '{}' (compute, mismatch or hang)", o.fail_op));
  }
  if (o.fail_rank && (*o.fail_rank < 0 || *o.fail_rank >= o.world_size)) {
    return UsageError(
        fmt::format("fail_rank: {} is not one of the {} ranks", *o.fail_rank, o.world_size));
  }
  if (trace.steps.empty()) return InvalidInput("the trace has no steps to run");
  return ValidatePolicy(o.policy, trace.model);
}

StatusOr<UnitId> FaultUnit(const Model& model, const LiveOptions& o) {
  if (!o.fail_rank) return kNoUnit;
  if (!o.fail_unit.empty()) {
    std::optional<UnitId> id = model.Find(o.fail_unit);
    if (!id)
      return InvalidInput(fmt::format("fail_unit: '{}' is not a unit of the model", o.fail_unit));
    return *id;
  }
  for (const Unit& u : model.units()) {
    if (u.has_params()) return u.id();
  }
  return InvalidInput("the model has no unit with parameters to inject a fault into");
}

// One rank's host thread: its scheduler over the trace, issuing into its executor.
struct RankRun {
  ExecutionOrder order;
  std::vector<Divergence> divergences;
  std::vector<std::vector<std::vector<TimeUs>>> issue_us;  // [step][microbatch][event]
  OpContext position;
};

void RunRankHost(const Trace& trace, const LiveOptions& options, RunControl& control,
                 RankBarrier& barrier, int check_step, HostExecutor& executor, RankRun& run) {
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

// The single-rank reference: every rank's gradients computed again from the unsharded originals
// and the same seeded inputs, summed in rank order, accumulated like the live shards. Compares
// each rank's reduced shards element by element, bit for bit.
void CheckGradients(const ModelData& data, const LiveOptions& options, std::int64_t gemm_tokens,
                    const std::vector<GradEvent>& events,
                    const std::vector<std::unique_ptr<HostExecutor>>& executors, LiveCheck& check) {
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
    if (ev.origin.step != check.step) continue;  // only the checked step's gradients are kept
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
            replicated ? 0 : static_cast<std::size_t>(r % shard_group) * gl.grad_shard_elements;
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
  for (int r = 0; r < w; ++r) {
    const auto& live = executors[static_cast<std::size_t>(r)]->reduced_grads();
    for (UnitId u = 0; u < static_cast<UnitId>(live.size()); ++u) {
      const auto& groups = live[static_cast<std::size_t>(u)];
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

// The trace each rank would write with `fsdplab record`: the replayed events with measured
// compute durations and start times, and the measured collectives at the end of each microbatch.
}  // namespace

StatusOr<LiveResult> RunLiveSteps(const Trace& trace, const LiveOptions& options,
                                  const HostRunOptions& host_options) {
  FSDP_RETURN_IF_ERROR(CheckOptions(trace, options, host_options));
  FSDP_ASSIGN_OR_RETURN(const UnitId fail_unit, FaultUnit(trace.model, options));
  FSDP_ASSIGN_OR_RETURN(ModelData data, ModelData::Create(trace.model, options.policy,
                                                          options.world_size, options.seed));
  const int w = options.world_size;
  ExecutorConfig config;
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

  RunControl control(options.timeout_us, w);
  RankBarrier barrier(control, w);
  const bool unified = options.policy.unified_comm_stream;
  // One communicator per shard group (the world but under hsdp) and stream, and under hsdp one
  // per replica column, as NCCL sub-communicators: shard group k is ranks [k S, (k + 1) S),
  // column c the ranks c, c + S, ...
  const int shard_group = data.layout().shard_group_size();
  const int replicas = data.layout().replicas();
  std::vector<std::unique_ptr<Communicator>> gathers;
  std::vector<std::unique_ptr<Communicator>> scatters;
  std::vector<std::unique_ptr<Communicator>> columns;
  // Under hsdp a communicator's name says which ranks it joins (its errors number them 0..n-1).
  auto group_name = [&](std::string_view what, int k) {
    if (replicas == 1) return std::string(what);
    return fmt::format("{} of shard group {} (ranks {}-{})", what, k, k * shard_group,
                       (k + 1) * shard_group - 1);
  };
  for (int k = 0; k < replicas; ++k) {
    gathers.push_back(std::make_unique<Communicator>(
        control, shard_group, group_name(unified ? "communication" : "all_gather", k)));
    scatters.push_back(
        std::make_unique<Communicator>(control, shard_group, group_name("reduce_scatter", k)));
  }
  if (replicas > 1) {
    for (int c = 0; c < shard_group; ++c) {
      columns.push_back(std::make_unique<Communicator>(
          control, replicas,
          fmt::format("all_reduce of replica column {} (ranks {}, {}, ...)", c, c,
                      c + shard_group)));
    }
  }
  std::vector<std::unique_ptr<HostExecutor>> executors;
  for (int r = 0; r < w; ++r) {
    const auto row = static_cast<std::size_t>(r / shard_group);
    Communicator& ag = *gathers[row];
    executors.push_back(std::make_unique<HostExecutor>(
        trace.model, data, config, control, ag, unified ? ag : *scatters[row], r,
        replicas > 1 ? columns[static_cast<std::size_t>(r % shard_group)].get() : nullptr));
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

  LiveResult result;
  Timeline& tl = result.timeline;
  tl.source = "live-host";
  tl.world_size = w;
  tl.ranks_recorded = w;
  std::vector<ExecutedOp> result_executed;
  std::vector<TimelineOp> ops;
  for (auto& e : executors) {
    std::vector<TimelineOp> rank_ops = e->TakeOps();
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
    std::vector<ExecutedOp> executed = e->TakeExecuted();
    result_executed.insert(result_executed.end(), executed.begin(), executed.end());
    std::vector<MemorySample> samples = e->TakeMemory();
    tl.memory.insert(tl.memory.end(), samples.begin(), samples.end());
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
  for (auto& e : executors) {
    timed += e->stats().timed_computes;
    overruns += e->stats().overruns;
    wake_sum += e->stats().wake_error_sum_us;
    wake_abs_sum += e->stats().wake_error_abs_sum_us;
    overrun_sum += e->stats().overrun_sum_us;
    wake_max = std::max(wake_max, e->stats().wake_error_max_us);
  }
  result.notes.push_back(fmt::format(
      "host backend: {} ranks as threads in one process on {} cores; collectives are in-process "
      "copies and rank-ordered fp32 sums",
      w, std::thread::hardware_concurrency()));
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
        "it on average ({:.1f} us mean |error|, max {:.1f} us), which only shifts when the "
        "streams waiting on it resume",
        timed, wake_sum / timed, wake_abs_sum / timed, wake_max));
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
    check.step = config.check_step;
    for (auto& e : executors) {
      check.gathered_bytes_checked += e->stats().gathered_bytes_checked;
      check.gathered_bytes_wrong += e->stats().gathered_bytes_wrong;
      check.check_us += e->stats().check_us();
    }
    CheckGradients(data, options, host_options.gemm_tokens, executors[0]->grad_events(), executors,
                   check);
  }
  result.order = runs[0].order;
  result.divergences = runs[0].divergences;
  result.executed = std::move(result_executed);
  LiveRecording rec;
  rec.source = "live-host";
  rec.world_size = w;
  for (int r = 0; r < w; ++r) rec.ranks.push_back(r);
  rec.steps = options.steps;
  rec.extra_json =
      fmt::format(R"({{"compute": "{}", "compute_scale": {}}})",
                  options.compute == ComputeMode::kGemm ? "gemm" : "timed", options.compute_scale);
  rec.issue_us = [&runs](int rank, int s, int mb, int e) -> std::optional<TimeUs> {
    const auto& issue = runs[static_cast<std::size_t>(rank)].issue_us;
    return issue[static_cast<std::size_t>(s)][static_cast<std::size_t>(mb)]
                [static_cast<std::size_t>(e)];
  };
  result.recorded = RecordLiveTraces(trace, tl, rec);
  return result;
}

}  // namespace fsdplab::host
