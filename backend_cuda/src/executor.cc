#include "fsdplab/cuda/executor.h"

#include <cuda_bf16.h>
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstring>
#include <map>
#include <thread>
#include <utility>

#include "fsdplab/core/param_layout.h"
#include "fsdplab/core/stream_plan.h"
#include "fsdplab/cuda/check.h"
#include "fsdplab/cuda/internal/kernels.h"

namespace fsdplab::cuda {
namespace {

using Clock = std::chrono::steady_clock;

ncclDataType_t NcclType(DType dtype) {
  switch (dtype) {
    case DType::kFp32: return ncclFloat32;
    case DType::kFp16: return ncclFloat16;
    case DType::kBf16: return ncclBfloat16;
    case DType::kMxfp8: return ncclUint8;
  }
  return ncclUint8;
}

std::string_view CollectiveOpName(CollectiveKind kind) { return CollectiveKindName(kind); }

constexpr std::uint64_t kGradSeedSalt = 0x6772616473ull;  // "grads"

// One local GPU: its streams, communicator, buffers, events and GEMM scratch.
struct RankState {
  int rank = 0;
  int device = 0;
  std::unique_ptr<StreamPlanner> program;
  std::array<CudaStream, kPlanStreams> streams;
  NcclComm comm;
  // hsdp (more than one replica): the shard group's and the replica column's sub-communicators.
  NcclComm shard_comm;
  NcclComm replica_comm;
  // The communicator a collective on plan stream `stream` runs on.
  ncclComm_t CommFor(int stream) const {
    if (!replica_comm.valid()) return comm.get();
    return stream == kPlanAllReduce ? replica_comm.get() : shard_comm.get();
  }
  CublasHandle cublas;
  std::vector<DeviceBuffer> buffers;
  std::vector<CudaEvent> events;
  DeviceBuffer counters;  // [0] wrong gathered bytes, [1] wrong grad elements, [2] max err bits
  DeviceBuffer emu_scratch;
  DeviceBuffer x, y, dw, deq;  // GEMM operands
  std::vector<PlanOp> pending;
};

}  // namespace

class CudaExecutor::Impl {
 public:
  Impl(const Model& model, ModelLayout layout, ExecutorConfig config)
      : model_(model), layout_(std::move(layout)), config_(std::move(config)) {}

  Status Setup(const Trace& trace, std::vector<NcclComm> comms);
  Status Execute(const Command& command);
  Status Finish();
  void Abort() noexcept;

  const Timeline& timeline() const { return timeline_; }
  LiveCheck check() const { return check_; }
  const std::vector<std::string>& notes() const { return notes_; }

 private:
  Status RunOps();
  Status RunOp(RankState& r, const PlanOp& op);
  Status RunCollective(RankState& r, const PlanOp& op);
  Status RunPart(RankState& r, const PlanOp& op, const CollectivePart& part);
  Status RunCompute(RankState& r, const PlanOp& op);
  Status Gemm(RankState& r, Phase phase, DType dtype, const void* w, std::int64_t rows,
              std::int64_t cols, std::int64_t tokens, bool w_is_transposed);
  Status EnsureEvent(RankState& r, int slot);
  // Polls until every (rank, slot) has completed; on timeout or a communicator error aborts
  // and names the first unfinished op.
  Status WaitSlots(const std::vector<std::pair<int, int>>& slots, std::string_view what);
  std::string DescribeStuck(std::size_t rank_index) const;
  Status CalibrateGemm(RankState& r);
  std::int64_t TokensFor(const PlanOp& op) const;

  const Model& model_;
  ModelLayout layout_;  // the plan's byte counts, computed once
  ExecutorConfig config_;
  std::vector<RankState> ranks_;
  Timeline timeline_;
  LiveCheck check_;
  std::vector<std::string> notes_;
  double gemm_flops_per_s_ = 0;
  std::int64_t max_tokens_ = 16;
  std::vector<Elements> unit_gemm_elems_;  // per unit: sum of rows*cols of its matrices
  bool aborted_ = false;
  bool finished_ = false;
  int last_step_end_ = -1;
};

// ---- setup

Status CudaExecutor::Impl::Setup(const Trace& trace, std::vector<NcclComm> comms) {
  const std::size_t n = config_.devices.size();
  if (n == 0) return InternalError("CudaExecutor needs at least one device");
  if (!config_.emulated && comms.size() != n) {
    return InternalError("CudaExecutor: one communicator per device is needed");
  }
  ranks_.resize(n);
  Bytes max_plane = 0;
  unit_gemm_elems_.assign(static_cast<std::size_t>(model_.num_units()), 0);
  std::int64_t max_rows = 1, max_cols = 1;
  for (const Unit& u : model_.units()) {
    for (const ParamGroup& g : u.groups()) {
      max_plane = std::max({max_plane, g.rowwise_bytes, g.columnwise_bytes});
    }
    for (const GroupLayout& gl : layout_.groups(u.id())) {
      for (const ParamLayout& pl : gl.params) {
        if (!pl.matrix || pl.rows <= 1) continue;
        unit_gemm_elems_[static_cast<std::size_t>(u.id())] +=
            static_cast<Elements>(pl.rows * pl.cols);
        max_rows = std::max(max_rows, pl.rows);
        max_cols = std::max(max_cols, pl.cols);
      }
    }
  }
  for (std::size_t i = 0; i < n; ++i) {
    RankState& r = ranks_[i];
    r.rank = config_.ranks[i];
    r.device = config_.devices[i];
    DeviceGuard guard(r.device);
    for (auto& s : r.streams) {
      FSDP_ASSIGN_OR_RETURN(s, CudaStream::Create(r.device));
    }
    if (!config_.emulated) r.comm = std::move(comms[i]);
    FSDP_ASSIGN_OR_RETURN(r.cublas, CublasHandle::Create(r.device, r.streams[0].get()));
    FSDP_ASSIGN_OR_RETURN(r.counters, DeviceBuffer::Allocate(r.device, 64));
    FSDP_CUDA_CHECK(cudaMemset(r.counters.get(), 0, 64));
    if (config_.emulated) {
      const Bytes scratch = 2 * max_plane + 64;
      FSDP_ASSIGN_OR_RETURN(r.emu_scratch, DeviceBuffer::Allocate(r.device, scratch));
    }
    // The stream-ordered pool keeps freed memory for reuse; its high-water mark is the peak
    // reserved memory reported.
    cudaMemPool_t pool = nullptr;
    FSDP_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, r.device));
    std::uint64_t threshold = UINT64_MAX;
    FSDP_CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold));
    std::uint64_t zero = 0;
    FSDP_CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReservedMemHigh, &zero));
    PlanConfig pc{.rank = r.rank,
                  .unified_comm_stream = config_.unified_comm_stream,
                  .emulated = config_.emulated,
                  .check = config_.check,
                  .check_step = 0,
                  .fault = config_.fault,
                  .gather_copy_out_us = config_.gather_copy_out_us};
    r.program = std::make_unique<StreamPlanner>(model_, layout_, pc);
    FSDP_RETURN_IF_ERROR(r.program->Begin());
  }
  // hsdp: gathers and reduce-scatters within the shard group, the replica all-reduce across the
  // replicas: NCCL sub-communicators split from the world's (every rank of a parent calls the
  // split, so the whole process splits in one group).
  if (!config_.emulated && layout_.replicas() > 1) {
    std::vector<NcclComm> parents;
    std::vector<int> row, column, in_row, in_column;
    for (RankState& r : ranks_) {
      parents.push_back(std::move(r.comm));
      row.push_back(layout_.shard_group_of(r.rank));
      in_row.push_back(layout_.shard_rank_of(r.rank));
      column.push_back(layout_.shard_rank_of(r.rank));
      in_column.push_back(layout_.shard_group_of(r.rank));
    }
    StatusOr<std::vector<NcclComm>> shards = NcclComm::Split(parents, row, in_row);
    StatusOr<std::vector<NcclComm>> replicas =
        shards.ok() ? NcclComm::Split(parents, column, in_column) : shards.status();
    for (std::size_t i = 0; i < n; ++i) ranks_[i].comm = std::move(parents[i]);
    FSDP_RETURN_IF_ERROR(shards.status());
    FSDP_RETURN_IF_ERROR(replicas.status());
    for (std::size_t i = 0; i < n; ++i) {
      ranks_[i].shard_comm = std::move((*shards)[i]);
      ranks_[i].replica_comm = std::move((*replicas)[i]);
    }
    notes_.push_back(fmt::format(
        "hsdp: NCCL sub-communicators split from the world's: {} shard groups of {} ranks "
        "(all-gathers, reduce-scatters) and {} replica columns of {} ranks (all-reduces)",
        layout_.replicas(), layout_.shard_group_size(), layout_.shard_group_size(),
        layout_.replicas()));
  }
  if (config_.compute == ComputeMode::kGemm) {
    FSDP_RETURN_IF_ERROR(CalibrateGemm(ranks_[0]));
    // Tokens per compute: enough that the GEMMs take the trace's duration.
    TimeUs longest = 0;
    std::vector<TimeUs> unit_longest(static_cast<std::size_t>(model_.num_units()), 0);
    for (const Step& step : trace.steps) {
      for (const Microbatch& mb : step.microbatches) {
        for (const Event& e : mb.events) {
          if (e.op != Op::kCompute || e.unit == kNoUnit) continue;
          auto& l = unit_longest[static_cast<std::size_t>(e.unit)];
          l = std::max(l, e.us);
          longest = std::max(longest, e.us);
        }
      }
    }
    for (UnitId u = 0; u < model_.num_units(); ++u) {
      PlanOp probe;
      probe.kind = PlanOpKind::kCompute;
      probe.unit = u;
      probe.phase = Phase::kForward;
      probe.us = unit_longest[static_cast<std::size_t>(u)];
      max_tokens_ = std::max(max_tokens_, TokensFor(probe));
    }
    const std::int64_t big = std::max(max_rows, max_cols);
    for (RankState& r : ranks_) {
      DeviceGuard guard(r.device);
      const auto operand = static_cast<std::size_t>(big * max_tokens_ * 4);
      const auto weight = static_cast<std::size_t>(max_rows * max_cols * 4);
      FSDP_ASSIGN_OR_RETURN(r.x, DeviceBuffer::Allocate(r.device, operand));
      FSDP_ASSIGN_OR_RETURN(r.y, DeviceBuffer::Allocate(r.device, operand));
      FSDP_ASSIGN_OR_RETURN(r.dw, DeviceBuffer::Allocate(r.device, weight));
      FSDP_ASSIGN_OR_RETURN(r.deq, DeviceBuffer::Allocate(r.device, weight));
      FSDP_CUDA_CHECK(
          internal::FillGrad(r.x.get(), DType::kBf16, operand / 2, 1, 0, r.streams[0].get()));
      FSDP_CUDA_CHECK(
          internal::FillGrad(r.y.get(), DType::kBf16, operand / 2, 2, 0, r.streams[0].get()));
    }
    notes_.push_back(fmt::format(
        "compute: cuBLAS GEMMs sized from the unit shapes (forward: 1 GEMM per matrix; backward: "
        "input and weight gradients; recompute: forward), tokens per compute chosen so the GEMMs "
        "last the trace's duration at the measured {:.0f} TFLOP/s (at most {} tokens); bf16, "
        "fp16 and fp32 (TF32) weights used as gathered; mxfp8 planes dequantized from the plane "
        "the phase needs (E4M3 data x E8M0 block scales) to bf16 and multiplied in bf16 (no FP8 "
        "GEMM path in this build)",
        gemm_flops_per_s_ / 1e12, max_tokens_));
  } else {
    notes_.push_back(fmt::format(
        "compute: timed kernels occupy the compute stream for the trace's durations x {}",
        config_.compute_scale));
  }
  if (config_.emulated) {
    notes_.push_back(fmt::format(
        "collectives emulated as device-to-device copies of the bytes a rank receives in a "
        "{}-rank ring (one GPU); gathered contents and reductions are not checked",
        config_.world_size));
  } else {
    notes_.push_back(fmt::format("collectives: NCCL {}.{}.{} over {} local GPU(s), world size {}",
                                 NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH, n, config_.world_size));
  }
  // Persistent buffers, then a device synchronisation so the time base precedes all work.
  for (RankState& r : ranks_) FSDP_RETURN_IF_ERROR(r.program->Begin());
  FSDP_RETURN_IF_ERROR(RunOps());
  for (RankState& r : ranks_) {
    DeviceGuard guard(r.device);
    FSDP_CUDA_CHECK(cudaDeviceSynchronize());
  }
  return Status::Ok();
}

Status CudaExecutor::Impl::CalibrateGemm(RankState& r) {
  DeviceGuard guard(r.device);
  constexpr std::int64_t kN = 4096;
  const auto bytes = static_cast<std::size_t>(kN * kN * 2);
  FSDP_ASSIGN_OR_RETURN(DeviceBuffer a, DeviceBuffer::Allocate(r.device, bytes));
  FSDP_ASSIGN_OR_RETURN(DeviceBuffer b, DeviceBuffer::Allocate(r.device, bytes));
  FSDP_ASSIGN_OR_RETURN(DeviceBuffer c, DeviceBuffer::Allocate(r.device, bytes));
  cudaStream_t s = r.streams[0].get();
  FSDP_CUDA_CHECK(internal::FillGrad(a.get(), DType::kBf16, bytes / 2, 3, 0, s));
  FSDP_CUDA_CHECK(internal::FillGrad(b.get(), DType::kBf16, bytes / 2, 4, 0, s));
  FSDP_ASSIGN_OR_RETURN(CudaEvent e0, CudaEvent::Create(r.device, true));
  FSDP_ASSIGN_OR_RETURN(CudaEvent e1, CudaEvent::Create(r.device, true));
  const float alpha = 1, beta = 0;
  auto run = [&]() -> Status {
    FSDP_CUBLAS_CHECK(cublasGemmEx(r.cublas.get(), CUBLAS_OP_N, CUBLAS_OP_N, kN, kN, kN, &alpha,
                                   a.get(), CUDA_R_16BF, kN, b.get(), CUDA_R_16BF, kN, &beta,
                                   c.get(), CUDA_R_16BF, kN, CUBLAS_COMPUTE_32F,
                                   CUBLAS_GEMM_DEFAULT));
    return Status::Ok();
  };
  for (int i = 0; i < 3; ++i) FSDP_RETURN_IF_ERROR(run());
  constexpr int kIters = 10;
  FSDP_RETURN_IF_ERROR(e0.Record(s));
  for (int i = 0; i < kIters; ++i) FSDP_RETURN_IF_ERROR(run());
  FSDP_RETURN_IF_ERROR(e1.Record(s));
  FSDP_CUDA_CHECK(cudaStreamSynchronize(s));
  FSDP_ASSIGN_OR_RETURN(float ms, e1.ElapsedMsSince(e0));
  gemm_flops_per_s_ = 2.0 * kN * kN * kN * kIters / (static_cast<double>(ms) * 1e-3);
  return Status::Ok();
}

std::int64_t CudaExecutor::Impl::TokensFor(const PlanOp& op) const {
  if (op.unit == kNoUnit) return 0;
  const Elements elems = unit_gemm_elems_[static_cast<std::size_t>(op.unit)];
  if (elems == 0 || gemm_flops_per_s_ <= 0) return 0;
  const double mult = op.phase == Phase::kBackward ? 2.0 : 1.0;  // dgrad + wgrad
  const double flops = op.us * config_.compute_scale * 1e-6 * gemm_flops_per_s_;
  auto t = static_cast<std::int64_t>(flops / (2.0 * mult * static_cast<double>(elems)));
  t = (t + 15) / 16 * 16;
  return std::clamp<std::int64_t>(t, 16, 65536);
}

// ---- issuing

Status CudaExecutor::Impl::Execute(const Command& command) {
  if (aborted_) return InternalError("the CUDA executor was aborted after an earlier failure");
  for (RankState& r : ranks_) {
    Status s = r.program->Lower(command);
    if (!s.ok()) {
      Abort();
      return s;
    }
  }
  FSDP_RETURN_IF_ERROR(RunOps());
  if (std::holds_alternative<StepEndCmd>(command.body)) {
    // Run ahead by at most one step: wait for the previous step's end markers.
    const int step = command.origin.step;
    if (step > 0) {
      std::vector<std::pair<int, int>> slots;
      for (std::size_t i = 0; i < ranks_.size(); ++i) {
        const auto& ends = ranks_[i].program->step_end_slots();
        if (static_cast<std::size_t>(step - 1) < ends.size()) {
          for (int slot : ends[static_cast<std::size_t>(step - 1)]) {
            slots.emplace_back(static_cast<int>(i), slot);
          }
        }
      }
      FSDP_RETURN_IF_ERROR(WaitSlots(slots, fmt::format("step {}", step - 1)));
    }
    last_step_end_ = step;
  }
  return Status::Ok();
}

Status CudaExecutor::Impl::RunOps() {
  for (RankState& r : ranks_) r.pending = r.program->TakeNewOps();
  std::size_t n = 0;
  for (const RankState& r : ranks_) n = std::max(n, r.pending.size());
  auto is_nccl = [&](std::size_t i) {
    for (const RankState& r : ranks_) {
      if (i < r.pending.size() && r.pending[i].kind == PlanOpKind::kCollective &&
          !r.pending[i].emulated) {
        return true;
      }
    }
    return false;
  };
  std::size_t i = 0;
  while (i < n) {
    if (!is_nccl(i)) {
      for (RankState& r : ranks_) {
        if (i < r.pending.size()) {
          Status s = RunOp(r, r.pending[i]);
          if (!s.ok()) {
            Abort();
            return s;
          }
        }
      }
      ++i;
      continue;
    }
    // Consecutive collectives of every local rank go into one NCCL group.
    std::size_t j = i;
    while (j < n && is_nccl(j)) ++j;
    FSDP_NCCL_CHECK(ncclGroupStart());
    Status failed;
    for (std::size_t k = i; k < j && failed.ok(); ++k) {
      for (RankState& r : ranks_) {
        if (k < r.pending.size()) {
          failed = RunOp(r, r.pending[k]);
          if (!failed.ok()) break;
        }
      }
    }
    const ncclResult_t end = ncclGroupEnd();
    if (!failed.ok()) {
      Abort();
      return failed;
    }
    if (end != ncclSuccess) {
      const PlanOp& op = ranks_[0].pending[i];
      Status s =
          NcclError(end, "ncclGroupEnd()", __FILE__, __LINE__)
              .WithContext(fmt::format("step {}, unit '{}', {}", op.origin.step,
                                       model_.NameOf(op.unit), CollectiveOpName(op.collective)));
      Abort();
      return s;
    }
    i = j;
  }
  for (RankState& r : ranks_) r.pending.clear();
  return Status::Ok();
}

Status CudaExecutor::Impl::EnsureEvent(RankState& r, int slot) {
  const auto s = static_cast<std::size_t>(slot);
  while (r.events.size() <= s) {
    const bool timed = r.program->slot_timed(static_cast<int>(r.events.size()));
    FSDP_ASSIGN_OR_RETURN(CudaEvent e, CudaEvent::Create(r.device, timed));
    r.events.push_back(std::move(e));
  }
  return Status::Ok();
}

Status CudaExecutor::Impl::RunOp(RankState& r, const PlanOp& op) {
  std::optional<DeviceGuard> guard;
  if (ranks_.size() > 1) guard.emplace(r.device);
  cudaStream_t stream = r.streams[static_cast<std::size_t>(op.stream)].get();
  const auto buffer = [&](int id) -> DeviceBuffer& {
    return r.buffers[static_cast<std::size_t>(id)];
  };
  if (op.buffer >= 0 && r.buffers.size() <= static_cast<std::size_t>(op.buffer)) {
    r.buffers.resize(r.program->buffers().size());
  }
  auto* counters = r.counters.as<unsigned long long>();
  switch (op.kind) {
    case PlanOpKind::kRecord:
      FSDP_RETURN_IF_ERROR(EnsureEvent(r, op.slot));
      return r.events[static_cast<std::size_t>(op.slot)].Record(stream);
    case PlanOpKind::kWait:
      FSDP_RETURN_IF_ERROR(EnsureEvent(r, op.slot));
      return r.events[static_cast<std::size_t>(op.slot)].WaitOn(stream);
    case PlanOpKind::kAlloc: {
      if (op.buffer < 0) return Status::Ok();  // accounting only (activations, outputs)
      const Bytes bytes = r.program->buffers()[static_cast<std::size_t>(op.buffer)].bytes;
      FSDP_ASSIGN_OR_RETURN(buffer(op.buffer), DeviceBuffer::AllocateOn(r.device, bytes, stream));
      return Status::Ok();
    }
    case PlanOpKind::kFree:
      if (op.buffer < 0) return Status::Ok();
      return buffer(op.buffer).FreeOn(stream);
    case PlanOpKind::kFillShard: {
      // Rank r holds bytes [r*S, (r+1)*S) of the padded plane; not sharded, all of it.
      const Bytes offset = layout_.sharded() ? static_cast<Bytes>(r.rank) * op.bytes : 0;
      FSDP_CUDA_CHECK(internal::FillPattern(
          buffer(op.buffer).get(), op.bytes, offset,
          internal::PatternKey(config_.seed, op.unit, op.group, op.plane), stream));
      return Status::Ok();
    }
    case PlanOpKind::kCollective: return RunCollective(r, op);
    case PlanOpKind::kCompute: return RunCompute(r, op);
    case PlanOpKind::kFillGrad: {
      const PlanBuffer& info = r.program->buffers()[static_cast<std::size_t>(op.buffer)];
      FSDP_CUDA_CHECK(internal::FillGrad(
          buffer(op.buffer).get(), info.dtype, info.elements,
          internal::PatternKey(config_.seed ^ kGradSeedSalt, op.unit, op.group, 0), r.rank,
          stream));
      return Status::Ok();
    }
    case PlanOpKind::kCheckGather:
      FSDP_CUDA_CHECK(internal::CheckPattern(
          buffer(op.buffer).get(), op.bytes,
          internal::PatternKey(config_.seed, op.unit, op.group, op.plane), counters + 0, stream));
      return Status::Ok();
    case PlanOpKind::kCheckReduce: {
      const PlanBuffer& info = r.program->buffers()[static_cast<std::size_t>(op.buffer)];
      const ParamGroup& g = model_.unit(op.unit).groups()[static_cast<std::size_t>(op.group)];
      // A reduce-scatter's shard is the rank's place in its shard group (hsdp: rank mod S);
      // after the replica all-reduce it holds the sum over the whole world.
      const Elements offset =
          op.collective == CollectiveKind::kAllReduce
              ? 0
              : static_cast<Elements>(layout_.shard_rank_of(r.rank)) * info.elements;
      FSDP_CUDA_CHECK(internal::CheckReduced(
          buffer(op.buffer).get(), info.dtype, info.elements, offset, g.numel,
          internal::PatternKey(config_.seed ^ kGradSeedSalt, op.unit, op.group, 0),
          config_.world_size, counters + 1, reinterpret_cast<unsigned int*>(counters + 2), stream));
      return Status::Ok();
    }
  }
  return Status::Ok();
}

// One collective of the plan: a call per part (plane or group), inside the NCCL group RunOps
// opened around consecutive collectives.
Status CudaExecutor::Impl::RunCollective(RankState& r, const PlanOp& op) {
  if (op.skip) return Status::Ok();  // fault injection: this rank never calls it
  for (const CollectivePart& part : op.parts) FSDP_RETURN_IF_ERROR(RunPart(r, op, part));
  return Status::Ok();
}

Status CudaExecutor::Impl::RunPart(RankState& r, const PlanOp& op, const CollectivePart& part) {
  cudaStream_t stream = r.streams[static_cast<std::size_t>(op.stream)].get();
  DeviceBuffer& out = r.buffers[static_cast<std::size_t>(part.buffer)];
  DeviceBuffer& in = r.buffers[static_cast<std::size_t>(part.src_buffer)];
  const std::string where =
      DescribePosition(r.rank, op.origin, model_.NameOf(op.unit), CollectiveOpName(op.collective));
  if (op.emulated) {
    auto* o = out.as<unsigned char>();
    const auto* i = in.as<unsigned char>();
    auto* scratch = r.emu_scratch.as<unsigned char>();
    switch (op.collective) {
      case CollectiveKind::kAllGather:
        FSDP_CUDA_CHECK(cudaMemcpyAsync(o, i, part.shard_bytes, cudaMemcpyDeviceToDevice, stream));
        FSDP_CUDA_CHECK(cudaMemcpyAsync(o + part.shard_bytes, scratch, part.copy_bytes,
                                        cudaMemcpyDeviceToDevice, stream));
        break;
      case CollectiveKind::kReduceScatter:
      case CollectiveKind::kAllReduce:
        FSDP_CUDA_CHECK(
            cudaMemcpyAsync(scratch, i, part.copy_bytes, cudaMemcpyDeviceToDevice, stream));
        FSDP_CUDA_CHECK(cudaMemcpyAsync(o, i, out.bytes(), cudaMemcpyDeviceToDevice, stream));
        break;
    }
    return Status::Ok();
  }
  ncclComm_t comm = r.CommFor(op.stream);
  switch (op.collective) {
    case CollectiveKind::kAllGather: {
      std::size_t count = part.shard_bytes;
      if (op.mismatch && count > 1) count -= 1;
      const ncclResult_t res = ncclAllGather(in.get(), out.get(), count, ncclUint8, comm, stream);
      if (res != ncclSuccess) {
        return NcclError(res, "ncclAllGather(...)", __FILE__, __LINE__).WithContext(where);
      }
      return Status::Ok();
    }
    case CollectiveKind::kReduceScatter:
    case CollectiveKind::kAllReduce: {
      const PlanBuffer& info = r.program->buffers()[static_cast<std::size_t>(part.buffer)];
      std::size_t count = info.elements;
      if (op.mismatch && count > 1) count -= 1;
      const ncclResult_t res = op.collective == CollectiveKind::kAllReduce
                                   ? ncclAllReduce(in.get(), out.get(), count, NcclType(info.dtype),
                                                   ncclSum, comm, stream)
                                   : ncclReduceScatter(in.get(), out.get(), count,
                                                       NcclType(info.dtype), ncclSum, comm, stream);
      if (res != ncclSuccess) {
        return NcclError(res, "ncclReduceScatter(...)", __FILE__, __LINE__).WithContext(where);
      }
      return Status::Ok();
    }
  }
  return Status::Ok();
}

Status CudaExecutor::Impl::Gemm(RankState& r, Phase phase, DType dtype, const void* w,
                                std::int64_t rows, std::int64_t cols, std::int64_t tokens,
                                bool w_is_transposed) {
  // Column-major view: W (rows x cols, row-major) is a cols x rows matrix with ld = cols; a
  // transposed plane (columnwise) is rows x cols with ld = rows.
  cudaDataType_t type = CUDA_R_16BF;
  cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
  if (dtype == DType::kFp16) type = CUDA_R_16F;
  if (dtype == DType::kFp32) {
    type = CUDA_R_32F;
    compute = CUBLAS_COMPUTE_32F_FAST_TF32;
  }
  const float alpha = 1, beta = 0;
  cublasHandle_t h = r.cublas.get();
  const auto R = static_cast<int>(rows), C = static_cast<int>(cols), T = static_cast<int>(tokens);
  const cublasOperation_t as_w = w_is_transposed ? CUBLAS_OP_N : CUBLAS_OP_T;   // gives R x C
  const cublasOperation_t as_wt = w_is_transposed ? CUBLAS_OP_T : CUBLAS_OP_N;  // gives C x R
  const int ldw = w_is_transposed ? R : C;
  if (phase != Phase::kBackward) {
    // Y[R x T] = W[R x C] X[C x T]
    FSDP_CUBLAS_CHECK(cublasGemmEx(h, as_w, CUBLAS_OP_N, R, T, C, &alpha, w, type, ldw, r.x.get(),
                                   type, C, &beta, r.y.get(), type, R, compute,
                                   CUBLAS_GEMM_DEFAULT));
    return Status::Ok();
  }
  // Input gradient: dX[C x T] = W^T[C x R] dY[R x T]
  FSDP_CUBLAS_CHECK(cublasGemmEx(h, as_wt, CUBLAS_OP_N, C, T, R, &alpha, w, type, ldw, r.y.get(),
                                 type, R, &beta, r.x.get(), type, C, compute, CUBLAS_GEMM_DEFAULT));
  // Weight gradient: dW[C x R] = X[C x T] dY^T[T x R]
  FSDP_CUBLAS_CHECK(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_T, C, R, T, &alpha, r.x.get(), type, C,
                                 r.y.get(), type, R, &beta, r.dw.get(), type, C, compute,
                                 CUBLAS_GEMM_DEFAULT));
  return Status::Ok();
}

Status CudaExecutor::Impl::RunCompute(RankState& r, const PlanOp& op) {
  cudaStream_t stream = r.streams[kPlanCompute].get();
  const std::int64_t tokens = config_.compute == ComputeMode::kGemm ? TokensFor(op) : 0;
  if (tokens == 0) {
    const auto ns = static_cast<std::uint64_t>(std::llround(op.us * config_.compute_scale * 1e3));
    FSDP_CUDA_CHECK(internal::Spin(ns, stream));
    return Status::Ok();
  }
  const Unit& unit = model_.unit(op.unit);
  const bool no_shard = !layout_.sharded();
  for (int g = 0; g < static_cast<int>(unit.groups().size()); ++g) {
    const ParamGroup& group = unit.groups()[static_cast<std::size_t>(g)];
    // The plane this phase reads: rowwise for forward and recompute, columnwise for backward.
    const int plane = group.multi_plane() && op.phase == Phase::kBackward ? 1 : 0;
    int id = -1;
    for (int b : op.reads) {
      const PlanBuffer& info = r.program->buffers()[static_cast<std::size_t>(b)];
      if (info.group == g && info.plane == plane) id = b;
    }
    if (id < 0 && no_shard) id = r.program->sharded_buffer(op.unit, g, plane);
    const GroupLayout& gl = layout_.group(op.unit, g);
    if (id < 0) {
      return StepFailed(
          fmt::format("{}: no unsharded {} plane of group {}",
                      DescribePosition(r.rank, op.origin, unit.name(),
                                       fmt::format("compute ({})", PhaseName(op.phase))),
                      PlaneName(gl, plane), g));
    }
    const auto* base = r.buffers[static_cast<std::size_t>(id)].as<unsigned char>();
    for (const ParamLayout& pl : gl.params) {
      if (!pl.matrix || pl.rows <= 1) continue;
      const struct { std::int64_t rows, cols; } shape{pl.rows, pl.cols};
      const unsigned char* w = base + pl.offset[static_cast<std::size_t>(plane)];
      DType dtype = group.dtype;
      if (group.multi_plane()) {
        // Rowwise: [rows, cols]; columnwise: the transpose [cols, rows], scales along its rows.
        const std::int64_t pr = plane == 0 ? shape.rows : shape.cols;
        const std::int64_t pc = plane == 0 ? shape.cols : shape.rows;
        FSDP_CUDA_CHECK(
            internal::DequantizeMxfp8(w, w + pl.data_bytes, pr, pc, r.deq.get(), stream));
        w = r.deq.as<unsigned char>();
        dtype = DType::kBf16;
      }
      FSDP_RETURN_IF_ERROR(Gemm(r, op.phase, dtype, w, shape.rows, shape.cols, tokens,
                                group.multi_plane() && plane == 1));
    }
  }
  return Status::Ok();
}

// ---- waiting

std::string CudaExecutor::Impl::DescribeStuck(std::size_t rank_index) const {
  const RankState& r = ranks_[rank_index];
  const auto& ops = r.program->timeline_ops();
  const auto& slots = r.program->op_slots();
  for (std::size_t i = 0; i < ops.size(); ++i) {
    const int end = slots[i].end;
    if (end < 0 || static_cast<std::size_t>(end) >= r.events.size()) continue;
    if (cudaEventQuery(r.events[static_cast<std::size_t>(end)].get()) == cudaSuccess) continue;
    (void)cudaGetLastError();
    const TimelineOp& op = ops[i];
    return DescribePosition(r.rank, CommandOrigin{.step = op.step, .microbatch = op.microbatch},
                            model_.NameOf(op.unit), OpKindName(op.kind));
  }
  return fmt::format("rank {}", r.rank);
}

Status CudaExecutor::Impl::WaitSlots(const std::vector<std::pair<int, int>>& slots,
                                     std::string_view what) {
  const auto start = Clock::now();
  const auto limit = std::chrono::microseconds(static_cast<std::int64_t>(config_.timeout_us));
  std::vector<bool> done(slots.size(), false);
  std::size_t left = slots.size();
  while (left > 0) {
    for (std::size_t k = 0; k < slots.size(); ++k) {
      if (done[k]) continue;
      RankState& r = ranks_[static_cast<std::size_t>(slots[k].first)];
      std::optional<DeviceGuard> guard;
      if (ranks_.size() > 1) guard.emplace(r.device);
      StatusOr<bool> q = r.events[static_cast<std::size_t>(slots[k].second)].Query();
      if (!q.ok()) {
        Status s = q.status().WithContext(DescribeStuck(static_cast<std::size_t>(slots[k].first)));
        Abort();
        return s;
      }
      if (*q) {
        done[k] = true;
        --left;
      }
    }
    if (left == 0) break;
    for (std::size_t i = 0; i < ranks_.size(); ++i) {
      Status async = ranks_[i].comm.AsyncError();
      if (async.ok()) async = ranks_[i].shard_comm.AsyncError();
      if (async.ok()) async = ranks_[i].replica_comm.AsyncError();
      if (!async.ok()) {
        Status s = async.WithContext(DescribeStuck(i));
        Abort();
        return StepFailed(s.message() + "; communicators aborted");
      }
    }
    if (Clock::now() - start > limit) {
      std::string stuck;
      for (std::size_t k = 0; k < slots.size(); ++k) {
        if (!done[k]) {
          stuck = DescribeStuck(static_cast<std::size_t>(slots[k].first));
          break;
        }
      }
      Abort();
      return TimeoutError(
          fmt::format("{}: did not complete within {:.1f} s while waiting for {}; "
                      "communicators aborted",
                      stuck, config_.timeout_us / 1e6, what));
    }
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  return Status::Ok();
}

Status CudaExecutor::Impl::Finish() {
  if (finished_) return Status::Ok();
  if (aborted_) return InternalError("the CUDA executor was aborted after an earlier failure");
  std::vector<std::pair<int, int>> all;
  for (std::size_t i = 0; i < ranks_.size(); ++i) {
    // Every event recorded: their completion is what the timeline reads.
    for (int slot = 0; slot < static_cast<int>(ranks_[i].events.size()); ++slot) {
      all.emplace_back(static_cast<int>(i), slot);
    }
  }
  FSDP_RETURN_IF_ERROR(WaitSlots(all, "the end of the run"));
  timeline_ = Timeline{};
  timeline_.source = "live-cuda";
  timeline_.world_size = config_.world_size;
  timeline_.ranks_recorded = static_cast<int>(ranks_.size());
  std::uint64_t wrong_bytes = 0, wrong_grads = 0;
  float max_err = 0;
  for (RankState& r : ranks_) {
    DeviceGuard guard(r.device);
    const StreamPlanner& p = *r.program;
    const CudaEvent& base = r.events[0];
    auto at = [&](int slot) -> StatusOr<TimeUs> {
      FSDP_ASSIGN_OR_RETURN(float ms,
                            r.events[static_cast<std::size_t>(slot)].ElapsedMsSince(base));
      return static_cast<TimeUs>(ms) * 1e3;
    };
    const std::int64_t id_base = static_cast<std::int64_t>(timeline_.ops.size());
    for (std::size_t i = 0; i < p.timeline_ops().size(); ++i) {
      TimelineOp op = p.timeline_ops()[i];
      op.id += id_base;
      for (auto& w : op.waited_on) w += id_base;
      FSDP_ASSIGN_OR_RETURN(op.start_us, at(p.op_slots()[i].start));
      FSDP_ASSIGN_OR_RETURN(op.end_us, at(p.op_slots()[i].end));
      timeline_.ops.push_back(std::move(op));
    }
    for (const PendingSample& s : p.memory_samples()) {
      if (s.slot < 0) continue;  // after the last event of its stream: never timed
      MemorySample m = s.sample;
      FSDP_ASSIGN_OR_RETURN(m.t_us, at(s.slot));
      timeline_.memory.push_back(m);
    }
    std::array<unsigned long long, 3> host{};
    FSDP_CUDA_CHECK(cudaMemcpy(host.data(), r.counters.get(), sizeof host, cudaMemcpyDeviceToHost));
    wrong_bytes += host[0];
    wrong_grads += host[1];
    unsigned int bits = static_cast<unsigned int>(host[2]);
    float err = 0;
    std::memcpy(&err, &bits, sizeof err);
    max_err = std::max(max_err, err);
    check_.gathered_bytes_checked += p.gathered_bytes_checked();
    check_.grad_elements_checked += p.grad_elements_checked();
    for (const std::string& w : p.warnings()) timeline_.warnings.push_back(w);
    cudaMemPool_t pool = nullptr;
    FSDP_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, r.device));
    std::uint64_t reserved_high = 0;
    FSDP_CUDA_CHECK(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemHigh, &reserved_high));
    notes_.push_back(fmt::format(
        "memory rank {}: executor accounting peak {} bytes; device stream-ordered pool peak "
        "reserved {} bytes (persistent shards and grads included, GEMM scratch excluded)",
        r.rank, p.peak_memory(), reserved_high));
  }
  // Memory samples in time order per rank, as the timeline promises.
  std::stable_sort(timeline_.memory.begin(), timeline_.memory.end(),
                   [](const MemorySample& a, const MemorySample& b) {
                     return a.rank != b.rank ? a.rank < b.rank : a.t_us < b.t_us;
                   });
  check_.gathered_bytes_wrong = wrong_bytes;
  check_.grad_elements_wrong = wrong_grads;
  check_.grad_max_abs_error = max_err;
  check_.tolerance = config_.emulated || !config_.check
                         ? "not checked"
                         : "exact (seeded gradients k/8, |k| <= 16: sums over up to 16 ranks "
                           "are exact in bf16, fp16 and fp32)";
  for (const std::string& n : notes_) timeline_.notes.push_back(n);
  finished_ = true;
  return Status::Ok();
}

void CudaExecutor::Impl::Abort() noexcept {
  if (aborted_) return;
  aborted_ = true;
  for (RankState& r : ranks_) {
    r.replica_comm.Abort();
    r.shard_comm.Abort();
    r.comm.Abort();
  }
}

// ---- public

CudaExecutor::CudaExecutor(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CudaExecutor::~CudaExecutor() = default;

StatusOr<std::unique_ptr<CudaExecutor>> CudaExecutor::Create(const Model& model, ModelLayout layout,
                                                             const Trace& trace,
                                                             ExecutorConfig config,
                                                             std::vector<NcclComm> comms) {
  config.gather_copy_out_us = GatherCopyOutUs(trace);
  auto impl = std::make_unique<Impl>(model, std::move(layout), std::move(config));
  FSDP_RETURN_IF_ERROR(impl->Setup(trace, std::move(comms)));
  return std::unique_ptr<CudaExecutor>(new CudaExecutor(std::move(impl)));
}

Status CudaExecutor::Execute(const Command& command) { return impl_->Execute(command); }
Status CudaExecutor::Finish() { return impl_->Finish(); }
void CudaExecutor::Abort() noexcept { impl_->Abort(); }
const Timeline& CudaExecutor::timeline() const { return impl_->timeline(); }
LiveCheck CudaExecutor::check() const { return impl_->check(); }
const std::vector<std::string>& CudaExecutor::notes() const { return impl_->notes(); }

}  // namespace fsdplab::cuda
