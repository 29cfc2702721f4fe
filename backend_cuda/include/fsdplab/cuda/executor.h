// The CUDA executor: a CommandSink that carries the scheduler's commands out on CUDA streams,
// one set of three streams (compute, all-gather, reduce-scatter) per local GPU, with NCCL
// collectives and cuBLAS GEMMs. Each command is lowered once into the core stream plan
// (core/stream_plan.h), which this executor only carries out. One executor drives every GPU of the
// process: each command is lowered for every local rank and issued in lockstep, collectives of all
// local ranks inside one NCCL group.
//
// The host runs ahead of the devices by at most one step: at the end of step s it waits (polling
// with a timeout, checking each communicator's asynchronous error) for step s-1. On a timeout or
// an error the communicators are aborted and the error names the rank, the step, the unit and the
// op that did not finish.
//
//   FSDP_ASSIGN_OR_RETURN(auto exec, CudaExecutor::Create(model, std::move(layout), trace,
//                                                        config, std::move(comms)));
//                                                        FSDP_RETURN_IF_ERROR(ReplaySteps(trace,
//                                                        steps, scheduler, *exec));
//   FSDP_RETURN_IF_ERROR(exec->Finish());
//   Timeline t = exec->timeline();
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "fsdplab/core/command.h"
#include "fsdplab/core/model.h"
#include "fsdplab/core/param_layout.h"
#include "fsdplab/core/status.h"
#include "fsdplab/core/stream_plan.h"
#include "fsdplab/core/timeline.h"
#include "fsdplab/core/trace.h"
#include "fsdplab/cuda/resources.h"
#include "fsdplab/live/live.h"

namespace fsdplab::cuda {

struct ExecutorConfig final {
  std::vector<int> devices;  // local GPUs, one rank each
  std::vector<int> ranks;    // the global rank of each local GPU
  int world_size = 1;        // what the scheduler shards for (the emulated size when emulating)
  bool emulated = false;     // collectives replaced by device copies (one GPU)
  bool unified_comm_stream = false;
  ComputeMode compute = ComputeMode::kTimed;
  double compute_scale = 1.0;
  TimeUs timeout_us = 30e6;
  std::uint64_t seed = 2026;
  bool check = true;
  FaultInjection fault;
  // PlanConfig::gather_copy_out_us: Create fills it from the trace (GatherCopyOutUs), as the
  // simulator's plan has it.
  std::vector<TimeUs> gather_copy_out_us;
};

class CudaExecutor final : public CommandSink {
 public:
  // `comms` has one communicator per device (empty when emulated). `trace` sizes the GEMM
  // scratch buffers (the longest compute of each unit).
  static StatusOr<std::unique_ptr<CudaExecutor>> Create(const Model& model, ModelLayout layout,
                                                        const Trace& trace, ExecutorConfig config,
                                                        std::vector<NcclComm> comms);
  ~CudaExecutor() override;
  CudaExecutor(const CudaExecutor&) = delete;
  CudaExecutor& operator=(const CudaExecutor&) = delete;

  Status Execute(const Command& command) override;
  // Waits for all issued work (with the timeout) and reads every event: the timeline, memory
  // and checks are valid after it.
  Status Finish();
  // Aborts the communicators (after a failure elsewhere); idempotent.
  void Abort() noexcept;

  const Timeline& timeline() const;
  LiveCheck check() const;
  const std::vector<std::string>& notes() const;

 private:
  class Impl;
  explicit CudaExecutor(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace fsdplab::cuda
