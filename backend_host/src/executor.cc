#include "fsdplab/host/executor.h"

#include <fmt/format.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <thread>
#include <variant>

#include "fsdplab/host/numerics.h"
#include "internal/model_data.h"

namespace fsdplab::host {

using internal::DecodeRow;
using internal::InputSeed;
using internal::kTagOutputGrad;
using internal::OutputGradSeed;
using internal::SeededFloats;

// ---- HostExecutor ----

namespace {

// The plan this rank runs (set field by field: GCC 12 warns a designated initializer leaves the
// fault's string uninitialised, which it does not).
PlanConfig PlanConfigFor(int rank, const ExecutorConfig& config) {
  PlanConfig pc;
  pc.rank = rank;
  pc.unified_comm_stream = config.unified_comm_stream;
  pc.gather_copy_out_us = config.gather_copy_out_us;
  return pc;
}

}  // namespace

HostExecutor::HostExecutor(const Model& model, const ModelData& data, const ExecutorConfig& config,
                           RunControl& control, Transport& all_gather, Transport& reduce_scatter,
                           int rank, Transport* all_reduce)
    : model_(model),
      data_(data),
      config_(config),
      control_(control),
      ag_comm_(all_gather),
      rs_comm_(reduce_scatter),
      ar_comm_(all_reduce),
      rank_(rank),
      world_size_(data.world_size()),
      shard_rank_(data.layout().shard_rank_of(rank)),
      replica_rank_(data.layout().shard_group_of(rank)),
      planner_(model, data.layout(), PlanConfigFor(rank, config)) {
  const auto units = static_cast<std::size_t>(model.num_units());
  compute_ = std::make_unique<StreamWorker>(control, rank, "compute");
  all_gather_ = std::make_unique<StreamWorker>(
      control, rank, config.unified_comm_stream ? "communication" : "all_gather");
  if (!config.unified_comm_stream) {
    reduce_scatter_ = std::make_unique<StreamWorker>(control, rank, "reduce_scatter");
  }
  if (planner_.replica_all_reduce()) {
    all_reduce_ = std::make_unique<StreamWorker>(control, rank, "all_reduce");
    if (ar_comm_ == nullptr) {
      control_.Fail(rank_, InternalError("hsdp: the host executor has no replica communicator"));
    }
  }
  grad_gen_.assign(units, 0);
  last_reduce_gen_.assign(units, 0);
  reduced_.resize(units);
  params_.resize(units);
  shards_.resize(units);
  grad_free_.resize(units);
  grad_pattern_.resize(units);
  const bool replicated = !data.layout().sharded();
  for (UnitId u = 0; u < model.num_units(); ++u) {
    const auto uu = static_cast<std::size_t>(u);
    const std::vector<GroupLayout>& groups = data.groups(u);
    params_[uu].resize(groups.size());
    shards_[uu].resize(groups.size());
    if (config.compute == ComputeMode::kTimed && config.check && !groups.empty()) {
      grad_pattern_[uu] = TimedGradPattern(data, config.seed, rank, u);
    }
    // One set of gradient buffers per unit, made (allocated and page-faulted in) here rather
    // than by the first backward kernel: made there, they held the compute thread past its
    // kernel's end in the first step, and every reduce-scatter of that step started late (0.5 to
    // 195 ms). A device's caching allocator hands a kernel its gradients without touching them.
    // Memory is accounted by the plan, so this moves no category's bytes.
    if (!groups.empty() && model.unit(u).has_params()) {
      grad_free_[uu].push_back(std::make_shared<GradBuffers>(NewGradBuffers(data, u)));
    }
    for (std::size_t g = 0; g < groups.size(); ++g) {
      const GroupLayout& gl = groups[g];
      reduced_[uu].emplace_back(gl.grad_shard_elements, 0.0f);
      for (int plane = 0; plane < gl.num_planes; ++plane) {
        const auto p = static_cast<std::size_t>(plane);
        std::span<const std::byte> full = data.original(u, static_cast<int>(g), plane);
        if (replicated) {
          // Not sharded: every rank holds the whole parameter, present from the start.
          params_[uu][g][p] = std::make_shared<std::vector<std::byte>>(full.begin(), full.end());
        } else {
          const std::size_t offset = static_cast<std::size_t>(shard_rank_) * gl.shard_bytes[p];
          shards_[uu][g][p].assign(
              full.begin() + static_cast<std::ptrdiff_t>(offset),
              full.begin() + static_cast<std::ptrdiff_t>(offset + gl.shard_bytes[p]));
        }
      }
    }
  }
  // The plan's set-up: the sharded parameters, held from the start.
  Status begun = planner_.Begin();
  if (!begun.ok()) control_.Fail(rank_, begun);
  for (const PlanOp& op : planner_.TakeNewOps()) {
    if (op.kind == PlanOpKind::kAlloc) memory_[static_cast<std::size_t>(op.category)] += op.bytes;
    if (op.kind == PlanOpKind::kRecord) {
      slot_seq_.resize(static_cast<std::size_t>(op.slot) + 1, 0);
    }
  }
  MemorySample first;
  first.rank = rank;
  first.t_us = 0;
  first.bytes = memory_;
  samples_.push_back(first);
}

HostExecutor::~HostExecutor() {
  // Stop the threads before the members they use go away.
  compute_->Close();
  all_gather_->Close();
  if (reduce_scatter_) reduce_scatter_->Close();
  if (all_reduce_) all_reduce_->Close();
  compute_->Join();
  all_gather_->Join();
  if (reduce_scatter_) reduce_scatter_->Join();
  if (all_reduce_) all_reduce_->Join();
}

void HostExecutor::Start() {
  // With an emulated device the compute thread sleeps to deadlines: the communication threads,
  // which copy and sum on the same cores, yield to it so its kernels end on time.
  const int comm_nice = config_.compute == ComputeMode::kTimed ? kEmulatedCommNice : 0;
  const int core = RankCore(rank_, world_size_);
  compute_->Start(/*low_timer_slack=*/true);
  all_gather_->Start(/*low_timer_slack=*/true, comm_nice, core);
  if (reduce_scatter_) reduce_scatter_->Start(/*low_timer_slack=*/true, comm_nice, core);
  if (all_reduce_) all_reduce_->Start(/*low_timer_slack=*/true, comm_nice, core);
}

OpContext HostExecutor::Context(const CommandOrigin& origin, UnitId unit, std::string op) const {
  return OpContext{rank_, origin.step, origin.microbatch, std::string(model_.NameOf(unit)),
                   std::move(op)};
}

StreamWorker& HostExecutor::StreamAt(int plan_stream) {
  switch (plan_stream) {
    case kPlanCompute: return *compute_;
    case kPlanAllGather: return *all_gather_;
    case kPlanAllReduce: return all_reduce_ ? *all_reduce_ : *all_gather_;
    default: return reduce_scatter_ ? *reduce_scatter_ : *all_gather_;
  }
}

Track HostExecutor::TrackAt(int plan_stream) const {
  switch (plan_stream) {
    case kPlanCompute: return Track::kCompute;
    case kPlanAllGather: return Track::kAllGather;
    case kPlanAllReduce: return Track::kAllReduce;
    default: return Track::kReduceScatter;
  }
}

HostExecutor::Worker HostExecutor::WorkerOf(const StreamWorker& stream) const {
  if (&stream == compute_.get()) return Worker::kCompute;
  if (&stream == reduce_scatter_.get()) return Worker::kReduceScatter;
  if (&stream == all_reduce_.get()) return Worker::kAllReduce;
  return Worker::kAllGather;
}

TimeUs HostExecutor::StreamNowUs(const StreamWorker& stream, Clock::time_point issued) {
  if (&stream == compute_.get() && config_.compute != ComputeMode::kTimed) return control_.NowUs();
  return control_.ToUs(std::max(StreamClock(stream), issued));
}

StreamWorker::Task HostExecutor::Collective(StreamWorker& stream, StreamWorker::Task run) {
  return [this, &stream, run = std::move(run)] {
    Status s = run();
    StreamClock(stream) = Clock::now();
    return s;
  };
}

void HostExecutor::Memory(MemoryCategory category, std::int64_t delta, int step, UnitId unit,
                          TimeUs at_us) {
  if (delta == 0) return;
  std::lock_guard<std::mutex> lock(mu_);
  Bytes& slot = memory_[static_cast<std::size_t>(category)];
  slot = static_cast<Bytes>(static_cast<std::int64_t>(slot) + delta);
  MemorySample s;
  s.rank = rank_;
  s.t_us = at_us;
  s.bytes = memory_;
  s.step = step;
  s.unit = unit;
  samples_.push_back(s);
}

TimelineOp HostExecutor::NewOp(const CommandOrigin& origin, Track track, OpKind kind, UnitId unit) {
  TimelineOp op;
  op.id = next_op_id_.fetch_add(1, std::memory_order_relaxed);
  op.rank = rank_;
  op.track = track;
  op.kind = kind;
  op.unit = unit;
  op.step = origin.step;
  op.microbatch = origin.microbatch;
  op.event = origin.event;
  return op;
}

Status HostExecutor::Execute(const Command& command) {
  const CommandOrigin& origin = command.origin;
  if (control_.aborted()) {
    return control_.AbortedError(
        Context(origin, kNoUnit, fmt::format("issue '{}'", DescribeCommand(command, model_))));
  }
  FSDP_RETURN_IF_ERROR(planner_.Lower(command));
  for (const PlanOp& op : planner_.TakeNewOps()) FSDP_RETURN_IF_ERROR(Enqueue(op));
  return Status::Ok();
}

// Host thread: one plan operation onto its stream's thread.
Status HostExecutor::Enqueue(const PlanOp& op) {
  const CommandOrigin& origin = op.origin;
  const auto at_fault = [&](UnitId unit) { return config_.fault.at(rank_, origin.step, unit); };
  StreamWorker& plan_stream = StreamAt(op.stream);
  // Every task of this operation also logs it when it ran (tests).
  struct Logged {
    HostExecutor* self;
    StreamWorker& worker;
    ExecutedOp executed;
    std::uint64_t Enqueue(StreamWorker::Task task) const {
      if (!self->config_.log_executed_ops) return worker.Enqueue(std::move(task));
      return worker.Enqueue([self = self, e = executed, task = std::move(task)] {
        Status s = task();
        if (s.ok()) self->executed_[static_cast<std::size_t>(e.stream)].push_back(e);
        return s;
      });
    }
    std::uint64_t issued() const { return worker.issued(); }
    const std::string& name() const { return worker.name(); }
  } stream{this, plan_stream, ExecutedFrom(op, rank_)};
  const auto timeline_id = [&](int index) -> std::int64_t& {
    if (timeline_ids_.size() <= static_cast<std::size_t>(index)) {
      timeline_ids_.resize(static_cast<std::size_t>(index) + 1, 0);
    }
    return timeline_ids_[static_cast<std::size_t>(index)];
  };
  switch (op.kind) {
    case PlanOpKind::kRecord: {
      if (slot_seq_.size() <= static_cast<std::size_t>(op.slot)) {
        slot_seq_.resize(static_cast<std::size_t>(op.slot) + 1, 0);
      }
      slot_seq_[static_cast<std::size_t>(op.slot)] = stream.issued();
      return Status::Ok();
    }
    case PlanOpKind::kWait: {
      StreamWorker& signaler = StreamAt(planner_.slot_stream(op.slot));
      const std::uint64_t seq = slot_seq_[static_cast<std::size_t>(op.slot)];
      if (&signaler == &plan_stream) return Status::Ok();  // one stream is already in order
      const bool device = &plan_stream == compute_.get();
      const std::int64_t gather = op.timeline_op >= 0 ? timeline_id(op.timeline_op) : 0;
      OpContext ctx = Context(origin, op.unit,
                              gather != 0 ? std::string("wait for its all_gather")
                                          : fmt::format("{} stream waits for the {} stream",
                                                        stream.name(), signaler.name()));
      stream.Enqueue([this, &signaler, &waiter = plan_stream, seq, ctx, device, gather] {
        Clock::time_point signalled;
        Status s = signaler.WaitReached(seq, ctx, &signalled);
        if (!s.ok()) return s;
        // A device waits in hardware: it goes on when the event fired. So does a communication
        // stream that reached the wait after the event; one that got there first had to sleep
        // on it, and goes on when its thread woke.
        Clock::time_point& clock = StreamClock(waiter);
        if (!device && signalled > clock) {
          clock = Clock::now();
          if (ctx.step >= 1) {
            stats_.comm_wakes[static_cast<std::size_t>(WorkerOf(waiter)) - 1].Add(
                std::chrono::duration<double, std::micro>(clock - signalled).count());
          }
        }
        clock = std::max(clock, signalled);
        if (device && gather != 0) pending_waits_.push_back(gather);
        return s;
      });
      return Status::Ok();
    }
    case PlanOpKind::kAlloc:
      stream.Enqueue([this, op, on = &plan_stream, issued = Clock::now()] {
        Memory(op.category, static_cast<std::int64_t>(op.bytes), op.origin.step, op.unit,
               StreamNowUs(*on, issued));
        return Status::Ok();
      });
      return Status::Ok();
    case PlanOpKind::kFree: {
      std::optional<TimelineOp> release;
      if (op.timeline_op >= 0) {
        const TimelineOp& planned =
            planner_.timeline_ops()[static_cast<std::size_t>(op.timeline_op)];
        release = NewOp(origin, TrackAt(op.stream), OpKind::kRelease, op.unit);
        release->planes = planned.planes;
        release->bytes = planned.bytes;
      }
      stream.Enqueue([this, op, release, on = &plan_stream, issued = Clock::now()] {
        return RunFree(op, release, StreamNowUs(*on, issued));
      });
      return Status::Ok();
    }
    case PlanOpKind::kCollective: {
      if (op.collective == CollectiveKind::kAllGather) {
        const std::int64_t id = next_op_id_.fetch_add(1, std::memory_order_relaxed);
        timeline_id(op.timeline_op) = id;
        bool mismatch = false;
        if (config_.fault.op == "mismatch" && mismatch_armed_ && at_fault(op.unit)) {
          mismatch = true;
          mismatch_armed_ = false;
        }
        stream.Enqueue(Collective(
            plan_stream, [this, op, id, mismatch] { return RunGather(op, id, mismatch); }));
      } else if (op.stream == kPlanAllReduce) {
        // hsdp: the replica all-reduce of the reduction just issued for the unit.
        const std::uint64_t gen = last_reduce_gen_[static_cast<std::size_t>(op.unit)];
        stream.Enqueue(
            Collective(plan_stream, [this, op, gen] { return RunReplicaAllReduce(op, gen); }));
      } else {
        const std::uint64_t gen = grad_gen_[static_cast<std::size_t>(op.unit)]++;
        last_reduce_gen_[static_cast<std::size_t>(op.unit)] = gen;
        grad_events_.push_back(GradEvent{true, op.unit, origin});
        stream.Enqueue(Collective(plan_stream, [this, op, gen] { return RunReduce(op, gen); }));
      }
      return Status::Ok();
    }
    case PlanOpKind::kCompute: {
      std::uint64_t gen = 0;
      if (op.unit != kNoUnit) {
        gen = grad_gen_[static_cast<std::size_t>(op.unit)];
        if (op.phase == Phase::kBackward && model_.unit(op.unit).has_params()) {
          grad_events_.push_back(GradEvent{false, op.unit, origin});
        }
      }
      bool inject = false;
      if ((config_.fault.op == "compute" || config_.fault.op == "hang" ||
           config_.fault.op == "die") &&
          fault_armed_ && at_fault(op.unit)) {
        inject = true;
        fault_armed_ = false;
      }
      const Clock::time_point issued = Clock::now();
      stream.Enqueue(
          [this, op, gen, inject, issued] { return RunCompute(op, gen, inject, issued); });
      return Status::Ok();
    }
    default:  // fill and check operations: the host checks inside its collectives
      return Status::Ok();
  }
}

Status HostExecutor::RunGather(const PlanOp& cmd, std::int64_t op_id, bool mismatch) {
  const CommandOrigin& origin = cmd.origin;
  const OpContext ctx =
      Context(origin, cmd.unit,
              fmt::format("all_gather ({}, {})", GatherReasonName(cmd.reason), cmd.planes.Name()));
  const std::vector<GroupLayout>& groups = data_.groups(cmd.unit);
  const bool checked = Checked(origin);
  struct Out {
    int group;
    int plane;
    PlaneBuffer buffer;
  };
  std::vector<Out> outs;
  std::vector<Segment> segments;
  for (const CollectivePart& part : cmd.parts) {
    const GroupLayout& gl = groups[static_cast<std::size_t>(part.group)];
    const auto p = static_cast<std::size_t>(part.plane);
    // From the pool: a fresh vector would be zeroed and page-faulted in on every gather, on the
    // all-gather stream before the collective, which made the live step tens of milliseconds
    // longer per large unit than the collectives themselves.
    PlaneBuffer buffer = pool_.Get(part.bytes);
    // A recycled buffer may already hold this unit's parameters; when checking, poison it so
    // that only the collective can make the comparison below pass.
    if (checked) {
      const TimeUs begin = control_.NowUs();
      std::fill(buffer->begin(), buffer->end(), std::byte{0xa5});
      CheckOp(origin, cmd.stream, cmd.unit, begin, stats_.check_gather_us);
    }
    Segment seg;
    seg.input =
        shards_[static_cast<std::size_t>(cmd.unit)][static_cast<std::size_t>(part.group)][p].data();
    seg.output = buffer->data();
    seg.element_size = 1;
    seg.shard_elements = gl.shard_bytes[p];
    segments.push_back(seg);
    outs.push_back(Out{part.group, part.plane, std::move(buffer)});
  }
  CollectiveDesc desc;
  desc.kind = mismatch ? CollectiveKind::kReduceScatter : CollectiveKind::kAllGather;
  desc.unit = cmd.unit;
  desc.unit_name = std::string(model_.NameOf(cmd.unit));
  desc.bytes = cmd.bytes;
  StatusOr<CollectiveTimes> times = ag_comm_.Call(shard_rank_, desc, segments, ctx);
  if (!times.ok()) return times.status();
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (Out& out : outs) {
      params_[static_cast<std::size_t>(cmd.unit)][static_cast<std::size_t>(out.group)]
             [static_cast<std::size_t>(out.plane)] = out.buffer;
    }
  }
  if (checked) {
    const TimeUs begin = control_.NowUs();
    for (const Out& out : outs) {
      const GroupLayout& gl = groups[static_cast<std::size_t>(out.group)];
      const Bytes n = gl.plane_bytes[static_cast<std::size_t>(out.plane)];
      std::span<const std::byte> want = data_.original(cmd.unit, out.group, out.plane);
      if (std::memcmp(out.buffer->data(), want.data(), n) != 0) {
        for (Bytes i = 0; i < n; ++i) {
          if ((*out.buffer)[i] != want[i]) ++stats_.gathered_bytes_wrong;
        }
      }
      stats_.gathered_bytes_checked += n;
    }
    CheckOp(origin, cmd.stream, cmd.unit, begin, stats_.check_gather_us);
  }
  TimelineOp op = NewOp(origin, TrackAt(cmd.stream), OpKind::kAllGather, cmd.unit);
  op.id = op_id;
  op.phase = cmd.phase;
  op.reason = cmd.reason;
  op.planes = cmd.planes;
  op.bytes = cmd.bytes;
  op.start_us = times->start_us;
  op.end_us = times->end_us;
  op.wait_us = times->wait_us();
  ops_[static_cast<std::size_t>(cmd.stream)].push_back(std::move(op));
  return Status::Ok();
}

// A free the plan placed on this stream: an unsharded plane goes back to the pool; every free
// applies its memory effect; the last free of a release draws the release.
Status HostExecutor::RunFree(const PlanOp& op, std::optional<TimelineOp> release, TimeUs at_us) {
  if (op.category == MemoryCategory::kUnshardedParams && op.buffer >= 0) {
    std::lock_guard<std::mutex> lock(mu_);
    params_[static_cast<std::size_t>(op.unit)][static_cast<std::size_t>(op.group)]
           [static_cast<std::size_t>(op.plane)]
               .reset();
  }
  Memory(op.category, -static_cast<std::int64_t>(op.bytes), op.origin.step, op.unit, at_us);
  if (release) {
    release->start_us = release->end_us = at_us;
    ops_[static_cast<std::size_t>(op.stream)].push_back(std::move(*release));
  }
  return Status::Ok();
}

Status HostExecutor::InjectedFault(const OpContext& ctx) {
  if (config_.fault.op == "die") {
    // The process is killed as an out-of-memory killer or a crash kills a rank: SIGKILL, no
    // error, no report, no MPI_Finalize (the launcher ends the job, or the other ranks see its
    // connections close; no other rank waits past its timeout in any case).
    std::fflush(stderr);
    ::kill(::getpid(), SIGKILL);
    std::_Exit(70);  // not reached
  }
  if (config_.fault.op == "hang") {
    // A kernel that never ends: it holds the compute stream until the run aborts (the other
    // ranks time out in their collectives), bounded by ten timeouts in any case.
    const Clock::time_point limit = Clock::now() + 10 * control_.timeout();
    while (!control_.aborted() && Clock::now() < limit) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return StepFailed(ctx.Describe() + ": injected hang (the compute never finished)");
  }
  throw std::runtime_error("injected fault");
}

Status HostExecutor::RunCompute(const PlanOp& cmd, std::uint64_t grad_gen, bool inject,
                                Clock::time_point issued) {
  const CommandOrigin& origin = cmd.origin;
  const OpContext ctx = Context(origin, cmd.unit, fmt::format("compute {}", PhaseName(cmd.phase)));
  const bool emulated = config_.compute == ComputeMode::kTimed || cmd.unit == kNoUnit;
  // An emulated kernel starts as a device kernel does: once the host has issued it, the stream's
  // previous kernel has ended and the events it waits on have fired; not when this thread
  // happens to be scheduled (on a busy machine that is often milliseconds later). Real work
  // (GEMMs) starts now.
  Clock::time_point& device_free = StreamClock(*compute_);
  const Clock::time_point start_tp = emulated ? std::max(device_free, issued) : Clock::now();
  TimelineOp op = NewOp(origin, Track::kCompute, OpKind::kCompute, cmd.unit);
  op.phase = cmd.phase;
  op.start_us = control_.ToUs(start_tp);
  op.waited_on = std::move(pending_waits_);
  pending_waits_.clear();

  // The weights this compute reads: every plane its phase needs must have been gathered. The
  // GEMMs use the phase's own plane (rowwise forward, columnwise backward) when it is needed.
  std::vector<std::pair<int, PlaneBuffer>> weights;  // (group * 2 + plane, buffer)
  if (cmd.unit != kNoUnit) {
    const std::vector<GroupLayout>& groups = data_.groups(cmd.unit);
    const PlaneSet needs = cmd.planes;
    const int wanted = cmd.phase == Phase::kBackward ? kColumnwisePlane : kRowwisePlane;
    std::lock_guard<std::mutex> lock(mu_);
    for (std::size_t g = 0; g < groups.size(); ++g) {
      const GroupLayout& gl = groups[g];
      const std::vector<int> planes = PlanesOf(gl, needs);
      for (int plane : planes) {
        const PlaneBuffer& buf =
            params_[static_cast<std::size_t>(cmd.unit)][g][static_cast<std::size_t>(plane)];
        if (!buf) {
          const Unit& unit = model_.unit(cmd.unit);
          const std::string param =
              gl.params.empty() ? "?"
                                : unit.params()[static_cast<std::size_t>(gl.params[0].param)].name;
          return StepFailed(fmt::format(
              "{}: missing {} plane: parameter '{}' (group {}, {}) was not gathered for this "
              "compute",
              ctx.Describe(), PlaneName(gl, plane), param, g, DTypeName(gl.dtype)));
        }
      }
      if (planes.empty()) continue;
      int use = planes.front();
      for (int plane : planes) {
        if (plane == wanted) use = plane;
      }
      weights.emplace_back(
          static_cast<int>(g) * 2 + use,
          params_[static_cast<std::size_t>(cmd.unit)][g][static_cast<std::size_t>(use)]);
    }
  }
  if (inject) {
    try {
      FSDP_RETURN_IF_ERROR(InjectedFault(ctx));
    } catch (const std::exception& e) {
      return StepFailed(fmt::format("{}: exception in compute: {}", ctx.Describe(), e.what()));
    }
  }
  std::shared_ptr<GradBuffers> grads;
  bool fresh = false;
  if (cmd.phase == Phase::kBackward && cmd.unit != kNoUnit && model_.unit(cmd.unit).has_params()) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto& slot = grads_[{cmd.unit, grad_gen}];
      if (!slot) {
        auto& reusable = grad_free_[static_cast<std::size_t>(cmd.unit)];
        if (!reusable.empty()) {
          slot = std::move(reusable.back());
          reusable.pop_back();
        } else {
          slot = std::make_shared<GradBuffers>(NewGradBuffers(data_, cmd.unit));
        }
        fresh = true;
      }
      grads = slot;
    }
  }

  if (emulated) {
    const auto duration = std::chrono::duration_cast<Clock::duration>(
        std::chrono::duration<double, std::micro>(cmd.us * config_.compute_scale));
    // The emulated kernel writes its gradients; only when they are checked does that cost CPU,
    // and a kernel whose real work outlasts its duration lasts as long as the work.
    const Clock::time_point work_begin = Clock::now();
    const bool checked = grads && Checked(cmd.origin);
    if (checked) {
      AccumulateGrads(data_, cmd.unit, grad_pattern_[static_cast<std::size_t>(cmd.unit)], fresh,
                      *grads);
    }
    const Clock::duration work = Clock::now() - work_begin;
    if (checked) stats_.check_compute_us += std::chrono::duration<double, std::micro>(work).count();
    if (work > duration) {
      ++stats_.overruns;
      stats_.overrun_sum_us += std::chrono::duration<double, std::micro>(work - duration).count();
    }
    const Clock::time_point end_tp = start_tp + std::max(duration, work);
    // Sleep towards the kernel's end, aiming early by how late wake-ups have been, so that the
    // streams waiting on this one are signalled close to it on average. The kernel ends at
    // end_tp whatever the wake-up: the device's clock is not the thread's. A thread already
    // behind the device's clock (it woke late before) does not sleep and signals late.
    const Clock::time_point woke = SleepTowards(end_tp, wake_lateness_);
    const TimeUs error = std::chrono::duration<double, std::micro>(woke - end_tp).count();
    ++stats_.timed_computes;
    stats_.wake_error_sum_us += error;
    stats_.wake_error_abs_sum_us += std::fabs(error);
    stats_.wake_error_max_us = std::max(stats_.wake_error_max_us, std::fabs(error));
    device_free = end_tp;
    compute_->CompleteAt(end_tp);  // its events fire at the kernel's end, as a device's do
    op.end_us = control_.ToUs(end_tp);
  } else {
    ComputeGemms(cmd, weights, grads.get(), fresh);
    op.end_us = control_.NowUs();
  }
  ops_[0].push_back(std::move(op));
  return Status::Ok();
}

void HostExecutor::ComputeGemms(const PlanOp& cmd,
                                const std::vector<std::pair<int, PlaneBuffer>>& weights,
                                GradBuffers* grads, bool fresh_grads) {
  const CommandOrigin& origin = cmd.origin;
  const std::vector<GroupLayout>& groups = data_.groups(cmd.unit);
  const std::int64_t tokens = config_.gemm_tokens;
  const auto t = static_cast<std::size_t>(tokens);
  for (const auto& [key, buffer] : weights) {
    const int g = key / 2;
    const int plane = key % 2;
    const GroupLayout& gl = groups[static_cast<std::size_t>(g)];
    for (const ParamLayout& pl : gl.params) {
      if (!pl.matrix) continue;
      std::vector<float> row(static_cast<std::size_t>(pl.cols));
      auto decode = [&](std::int64_t o, std::span<float> out) {
        DecodeRow(gl, pl, buffer->data(), plane, o, out);
      };
      if (cmd.phase == Phase::kBackward) {
        const std::vector<float> dy = SeededFloats(
            OutputGradSeed(config_.seed, kTagOutputGrad, rank_, origin, cmd.unit, pl.param),
            t * static_cast<std::size_t>(pl.rows));
        std::vector<float> dx(t * static_cast<std::size_t>(pl.cols));
        GemmInputGrad(dy, tokens, pl.rows, pl.cols, decode, row, dx);
        stats_.checksum += dx.empty() ? 0.0 : dx[0];
      } else {
        const std::vector<float> x =
            SeededFloats(InputSeed(config_.seed, rank_, origin, cmd.unit, pl.param),
                         t * static_cast<std::size_t>(pl.cols));
        std::vector<float> y(t * static_cast<std::size_t>(pl.rows));
        GemmForward(x, tokens, pl.rows, pl.cols, decode, row, y);
        stats_.checksum += y.empty() ? 0.0 : y[0];
      }
    }
  }
  if (grads != nullptr) {
    if (fresh_grads) {
      for (std::vector<std::byte>& b : *grads) std::fill(b.begin(), b.end(), std::byte{0});
    }
    AddWeightGradients(data_, ComputeMode::kGemm, tokens, config_.seed, rank_, origin, cmd.unit,
                       *grads);
  }
}

Status HostExecutor::RunReduce(const PlanOp& cmd, std::uint64_t gen) {
  const CommandOrigin& origin = cmd.origin;
  const OpContext ctx = Context(origin, cmd.unit, std::string(CollectiveKindName(cmd.collective)));
  const std::vector<GroupLayout>& groups = data_.groups(cmd.unit);
  std::shared_ptr<GradBuffers> grads;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = grads_.find({cmd.unit, gen});
    if (it != grads_.end()) {
      grads = it->second;
      grads_.erase(it);
    }
  }
  const bool counted = grads != nullptr;
  if (!grads) grads = std::make_shared<GradBuffers>(NewGradBuffers(data_, cmd.unit));
  const bool all_reduce = cmd.collective == CollectiveKind::kAllReduce;
  std::vector<PlaneBuffer> outs;
  std::vector<Segment> segments;
  for (const CollectivePart& part : cmd.parts) {
    const GroupLayout& gl = groups[static_cast<std::size_t>(part.group)];
    outs.push_back(pool_.Get(part.shard_bytes));
    Segment seg;
    seg.input = (*grads)[static_cast<std::size_t>(part.group)].data();
    seg.output = outs.back()->data();
    seg.dtype = gl.reduce_dtype;
    seg.element_size = gl.grad_element_size;
    seg.shard_elements = gl.grad_shard_elements;
    seg.elements = gl.grad_elements();
    segments.push_back(seg);
  }
  CollectiveDesc desc;
  desc.kind = cmd.collective;
  desc.unit = cmd.unit;
  desc.unit_name = std::string(model_.NameOf(cmd.unit));
  desc.bytes = cmd.bytes;
  StatusOr<CollectiveTimes> times = rs_comm_.Call(shard_rank_, desc, segments, ctx);
  if (!times.ok()) {
    // A transport between processes may have left the collective in flight, still reading the
    // input and writing the outputs: they stay with the executor (see in_flight_).
    std::lock_guard<std::mutex> lock(mu_);
    in_flight_.push_back(grads);
    for (PlaneBuffer& out : outs) in_flight_.push_back(std::move(out));
    return times.status();
  }
  if (planner_.replica_all_reduce()) {
    // hsdp: the shard is final after the replica all-reduce, which takes the outputs over.
    std::lock_guard<std::mutex> lock(mu_);
    awaiting_all_reduce_[{cmd.unit, gen}] = std::move(outs);
  } else {
    AccumulateReduced(cmd, outs);
  }
  if (counted) {
    std::lock_guard<std::mutex> lock(mu_);
    grad_free_[static_cast<std::size_t>(cmd.unit)].push_back(std::move(grads));
  }
  TimelineOp op = NewOp(origin, TrackAt(cmd.stream),
                        all_reduce ? OpKind::kAllReduce : OpKind::kReduceScatter, cmd.unit);
  op.phase = Phase::kBackward;
  op.bytes = cmd.bytes;
  op.start_us = times->start_us;
  op.end_us = times->end_us;
  op.wait_us = times->wait_us();
  ops_[static_cast<std::size_t>(cmd.stream)].push_back(std::move(op));
  return Status::Ok();
}

// The fp32 accumulation of the reduced shards only feeds the check: without it the stream goes
// straight on to its next collective, as a device stream would.
void HostExecutor::AccumulateReduced(const PlanOp& cmd, const std::vector<PlaneBuffer>& outs) {
  if (!Checked(cmd.origin)) return;
  const TimeUs begin = control_.NowUs();
  const std::vector<GroupLayout>& groups = data_.groups(cmd.unit);
  auto& reduced = reduced_[static_cast<std::size_t>(cmd.unit)];
  for (std::size_t g = 0; g < groups.size(); ++g) {
    const GroupLayout& gl = groups[g];
    std::vector<float>& acc = reduced[g];
    for (std::size_t i = 0; i < acc.size(); ++i) {
      acc[i] += LoadElement(gl.reduce_dtype, outs[g]->data(), i);
    }
  }
  CheckOp(cmd.origin, cmd.stream, cmd.unit, begin, stats_.check_reduce_us);
}

// hsdp: each rank's reduced shard summed over the replicas holding the same shard (its replica
// column), in replica order. Into a buffer of its own: the communicator reads every rank's
// input while others write their outputs (the plan's accounting, in place, is unaffected).
Status HostExecutor::RunReplicaAllReduce(const PlanOp& cmd, std::uint64_t gen) {
  const OpContext ctx = Context(cmd.origin, cmd.unit, "all_reduce (replicas)");
  const std::vector<GroupLayout>& groups = data_.groups(cmd.unit);
  std::vector<PlaneBuffer> ins;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = awaiting_all_reduce_.find({cmd.unit, gen});
    if (it == awaiting_all_reduce_.end()) {
      return InternalError(
          fmt::format("{}: no reduce-scatter output to all-reduce", ctx.Describe()));
    }
    ins = std::move(it->second);
    awaiting_all_reduce_.erase(it);
  }
  std::vector<PlaneBuffer> outs;
  std::vector<Segment> segments;
  for (const CollectivePart& part : cmd.parts) {
    const GroupLayout& gl = groups[static_cast<std::size_t>(part.group)];
    outs.push_back(pool_.Get(part.bytes));
    Segment seg;
    seg.input = ins[static_cast<std::size_t>(part.group)]->data();
    seg.output = outs.back()->data();
    seg.dtype = gl.reduce_dtype;
    seg.element_size = gl.grad_element_size;
    seg.shard_elements = gl.grad_shard_elements;
    seg.elements = gl.grad_shard_elements;
    segments.push_back(seg);
  }
  CollectiveDesc desc;
  desc.kind = CollectiveKind::kAllReduce;
  desc.unit = cmd.unit;
  desc.unit_name = std::string(model_.NameOf(cmd.unit));
  desc.bytes = cmd.bytes;
  StatusOr<CollectiveTimes> times = ar_comm_->Call(replica_rank_, desc, segments, ctx);
  if (!times.ok()) return times.status();
  AccumulateReduced(cmd, outs);
  TimelineOp op = NewOp(cmd.origin, Track::kAllReduce, OpKind::kAllReduce, cmd.unit);
  op.phase = Phase::kBackward;
  op.bytes = cmd.bytes;
  op.start_us = times->start_us;
  op.end_us = times->end_us;
  op.wait_us = times->wait_us();
  ops_[static_cast<std::size_t>(cmd.stream)].push_back(std::move(op));
  return Status::Ok();
}

// A check that ran on `stream` from `begin` to now: drawn on the stream's track (so that the
// checked step's window covers it and the timeline shows it) and added to `total`.
void HostExecutor::CheckOp(const CommandOrigin& origin, int stream, UnitId unit, TimeUs begin,
                           TimeUs& total) {
  TimelineOp op = NewOp(origin, TrackAt(stream), OpKind::kCheck, unit);
  op.start_us = begin;
  op.end_us = control_.NowUs();
  total += op.end_us - op.start_us;
  ops_[static_cast<std::size_t>(stream)].push_back(std::move(op));
}

Status HostExecutor::DrainStreams(const OpContext& ctx) {
  if (control_.aborted()) return control_.AbortedError(ctx);
  Status status = compute_->Drain(ctx);
  if (status.ok()) status = all_gather_->Drain(ctx);
  if (status.ok() && reduce_scatter_) status = reduce_scatter_->Drain(ctx);
  if (status.ok() && all_reduce_) status = all_reduce_->Drain(ctx);
  if (!status.ok() && !control_.aborted()) control_.Fail(rank_, status);
  return status;
}

Status HostExecutor::Finish(const OpContext& ctx) {
  const Status status = DrainStreams(ctx);
  compute_->Close();
  all_gather_->Close();
  if (reduce_scatter_) reduce_scatter_->Close();
  if (all_reduce_) all_reduce_->Close();
  compute_->Join();
  all_gather_->Join();
  if (reduce_scatter_) reduce_scatter_->Join();
  if (all_reduce_) all_reduce_->Join();
  return status;
}

std::vector<ExecutedOp> HostExecutor::TakeExecuted() {
  std::vector<ExecutedOp> all;
  for (auto& ops : executed_) {
    all.insert(all.end(), ops.begin(), ops.end());
    ops.clear();
  }
  return all;
}

std::vector<TimelineOp> HostExecutor::TakeOps() {
  std::vector<TimelineOp> all;
  for (auto& ops : ops_) {
    for (TimelineOp& op : ops) all.push_back(std::move(op));
    ops.clear();
  }
  return all;
}

std::vector<MemorySample> HostExecutor::TakeMemory() {
  std::lock_guard<std::mutex> lock(mu_);
  // Effects carry their streams' clocks (StreamNowUs), which can be earlier or later than when
  // they were recorded beside the other streams': put the samples in time order and rebuild each
  // one's totals from the changes, in that order. At one instant the frees come first, as in the
  // simulator: a free that a collective's end makes possible is not delayed behind another
  // stream's allocation at the same moment.
  std::vector<std::array<std::int64_t, kNumMemoryCategories>> change(samples_.size());
  std::vector<bool> frees(samples_.size(), false);
  for (std::size_t i = 1; i < samples_.size(); ++i) {
    std::int64_t total = 0;
    for (std::size_t c = 0; c < kNumMemoryCategories; ++c) {
      change[i][c] = static_cast<std::int64_t>(samples_[i].bytes[c]) -
                     static_cast<std::int64_t>(samples_[i - 1].bytes[c]);
      total += change[i][c];
    }
    frees[i] = total < 0;
  }
  std::vector<std::size_t> order(samples_.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin() + (order.empty() ? 0 : 1), order.end(),
                   [&](std::size_t a, std::size_t b) {
                     if (samples_[a].t_us != samples_[b].t_us) {
                       return samples_[a].t_us < samples_[b].t_us;
                     }
                     return frees[a] && !frees[b];
                   });
  std::vector<MemorySample> out;
  out.reserve(samples_.size());
  for (std::size_t i : order) {
    MemorySample m = samples_[i];
    if (!out.empty()) {
      for (std::size_t c = 0; c < kNumMemoryCategories; ++c) {
        const std::int64_t v = static_cast<std::int64_t>(out.back().bytes[c]) + change[i][c];
        m.bytes[c] = static_cast<Bytes>(std::max<std::int64_t>(0, v));
      }
    }
    out.push_back(m);
  }
  samples_.clear();
  return out;
}

}  // namespace fsdplab::host
