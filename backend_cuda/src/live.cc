#include "fsdplab/cuda/live.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <tuple>
#include <utility>

#include "fsdplab/core/scheduler.h"
#include "fsdplab/cuda/check.h"
#include "fsdplab/cuda/device.h"
#include "fsdplab/cuda/executor.h"
#include "fsdplab/cuda/launch.h"
#include "fsdplab/live/launch.h"
#include "fsdplab/live/mpi.h"
#include "fsdplab/live/trace_recorder.h"

namespace fsdplab::cuda {
namespace {

struct Topology {
  ExecutorConfig config;
  std::vector<NcclComm> comms;
  std::vector<std::string> notes;
};

StatusOr<Topology> Connect(const LiveOptions& options, const CudaRunOptions& cuda_options,
                           const std::vector<DeviceInfo>& devices) {
  Topology t;
  FSDP_ASSIGN_OR_RETURN(LaunchInfo launch, DetectLaunch());
  const int visible = static_cast<int>(devices.size());
  if (cuda_options.emulate_world_size.has_value()) {
    const int w = *cuda_options.emulate_world_size;
    if (w < 1) return UsageError(fmt::format("emulate_world_size: {} must be at least 1", w));
    if (launch.multi_process()) {
      return UsageError(
          "emulate_world_size: runs on one GPU in one process; it cannot be combined with a "
          "multi-process launch");
    }
    t.config.devices = {0};
    t.config.ranks = {0};
    t.config.world_size = w;
    t.config.emulated = true;
    return t;
  }
  if (!launch.multi_process()) {
    const int w = options.world_size;
    if (w < 1) return UsageError(fmt::format("world_size: {} must be at least 1", w));
    if (w > visible) {
      return Unavailable(fmt::format(
          "world size {} needs {} GPUs in one process, {} visible: use emulate_world_size {} "
          "on one GPU, or one process per GPU (mpirun, srun, or torchrun's or fsdplab's "
          "variables)",
          w, w, visible, w));
    }
    for (int i = 0; i < w; ++i) {
      t.config.devices.push_back(i);
      t.config.ranks.push_back(i);
    }
    t.config.world_size = w;
    FSDP_ASSIGN_OR_RETURN(t.comms, NcclComm::CreateAll(t.config.devices));
    t.notes.push_back(fmt::format("launch: one process driving {} GPU(s)", w));
    return t;
  }
  // One process per GPU.
  const int device = launch.local_rank >= 0 ? launch.local_rank : launch.rank % visible;
  if (device >= visible) {
    return InvalidInput(fmt::format("local rank {} names GPU {}, but {} are visible",
                                    launch.local_rank, device, visible));
  }
  ncclUniqueId id{};
  if (launch.rank == 0) FSDP_NCCL_CHECK(ncclGetUniqueId(&id));
  std::vector<char> bytes(reinterpret_cast<const char*>(&id),
                          reinterpret_cast<const char*>(&id) + sizeof id);
  if (launch.launcher == Launcher::kMpi || launch.launcher == Launcher::kSlurm) {
    FSDP_RETURN_IF_ERROR(mpi::Init(launch));
    FSDP_ASSIGN_OR_RETURN(bytes, mpi::Broadcast(std::move(bytes), sizeof id));
  } else {
    FSDP_ASSIGN_OR_RETURN(bytes, TcpBroadcast(launch, std::move(bytes), options.timeout_us));
  }
  if (bytes.size() != sizeof id) {
    return InternalError(fmt::format("rank {} received a {}-byte NCCL id, expected {}", launch.rank,
                                     bytes.size(), sizeof id));
  }
  std::memcpy(&id, bytes.data(), sizeof id);
  FSDP_ASSIGN_OR_RETURN(NcclComm comm,
                        NcclComm::CreateRank(device, launch.world_size, launch.rank, id));
  t.comms.push_back(std::move(comm));
  t.config.devices = {device};
  t.config.ranks = {launch.rank};
  t.config.world_size = launch.world_size;
  t.notes.push_back(fmt::format("launch: {} rank {} of {} on GPU {}", LauncherName(launch.launcher),
                                launch.rank, launch.world_size, device));
  if (options.world_size != launch.world_size) {
    t.notes.push_back(fmt::format("world size {} from the launcher (the option said {})",
                                  launch.world_size, options.world_size));
  }
  return t;
}

}  // namespace

StatusOr<LiveResult> RunLiveSteps(const Trace& trace, const LiveOptions& options,
                                  const CudaRunOptions& cuda_options) {
  {
    // The ranks this run will have: emulated on one GPU, the launcher's, or the option's.
    FSDP_ASSIGN_OR_RETURN(const LaunchInfo launch, DetectLaunch());
    LiveOptions checked = options;
    if (cuda_options.emulate_world_size.value_or(0) >= 1) {
      checked.world_size = *cuda_options.emulate_world_size;
    } else if (launch.multi_process()) {
      checked.world_size = launch.world_size;
    }
    FSDP_RETURN_IF_ERROR(ValidateLiveOptions(
        trace, checked, "die ends a rank's process, which only the host backend does"));
  }
  FSDP_ASSIGN_OR_RETURN(const UnitId fault_unit, FaultUnit(trace.model, options));
  FSDP_ASSIGN_OR_RETURN(std::vector<DeviceInfo> devices, VisibleDevices());
  FSDP_ASSIGN_OR_RETURN(Topology topo, Connect(options, cuda_options, devices));
  ExecutorConfig& cfg = topo.config;
  cfg.compute = options.compute;
  cfg.compute_scale = options.compute_scale;
  cfg.timeout_us = options.timeout_us;
  cfg.seed = options.seed;
  cfg.check = options.check;
  cfg.fault.rank = options.fail_rank;
  cfg.fault.op = options.fail_op;
  cfg.fault.step = options.fail_step;
  cfg.fault.unit = fault_unit;
  cfg.unified_comm_stream = options.policy.unified_comm_stream;
  FSDP_ASSIGN_OR_RETURN(ModelLayout layout,
                        ModelLayout::Create(trace.model, options.policy, cfg.world_size));
  FSDP_ASSIGN_OR_RETURN(
      std::unique_ptr<CudaExecutor> exec,
      CudaExecutor::Create(trace.model, std::move(layout), trace, cfg, std::move(topo.comms)));
  Scheduler scheduler(trace.model, options.policy, cfg.world_size);
  Status replay = ReplaySteps(trace, options.steps, scheduler, *exec);
  if (!replay.ok()) {
    exec->Abort();
    return replay;
  }
  FSDP_RETURN_IF_ERROR(exec->Finish());
  LiveResult result;
  result.timeline = exec->timeline();
  result.order = scheduler.order();
  result.divergences = scheduler.divergences();
  result.check = exec->check();
  result.notes = topo.notes;
  for (const DeviceInfo& d : devices) {
    if (std::find(cfg.devices.begin(), cfg.devices.end(), d.index) == cfg.devices.end()) continue;
    result.notes.push_back(fmt::format("GPU {}: {} ({}, {} SMs, {:.1f} GiB)", d.index, d.name,
                                       ArchName(d), d.multiprocessors,
                                       static_cast<double>(d.memory_bytes) / (1ull << 30)));
  }
  for (const std::string& n : exec->notes()) result.notes.push_back(n);
  if (result.check.gathered_bytes_wrong > 0) {
    result.timeline.errors.push_back(
        fmt::format("{} of {} gathered bytes differ from the unsharded parameters",
                    result.check.gathered_bytes_wrong, result.check.gathered_bytes_checked));
  }
  if (result.check.grad_elements_wrong > 0) {
    result.timeline.errors.push_back(fmt::format(
        "{} of {} reduced gradient elements differ from the reference (max abs error {})",
        result.check.grad_elements_wrong, result.check.grad_elements_checked,
        result.check.grad_max_abs_error));
  }
  LiveRecording rec;
  rec.source = "live-cuda";
  rec.world_size = cfg.world_size;
  rec.ranks = cfg.ranks;
  rec.steps = options.steps;
  result.recorded = RecordLiveTraces(trace, result.timeline, rec);
  return result;
}

}  // namespace fsdplab::cuda
