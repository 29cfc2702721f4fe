// bench-gather on CUDA: nccl-tests-style all-gather / reduce-scatter timing, alone, next to a
// GEMM, and together. Each collective is a thin table of hooks (bytes, init, run, check); the
// timing loop is shared.
#include <cuda_bf16.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <optional>

#include "fsdplab/cuda/check.h"
#include "fsdplab/cuda/device.h"
#include "fsdplab/cuda/internal/kernels.h"
#include "fsdplab/cuda/live.h"
#include "fsdplab/cuda/resources.h"

namespace fsdplab::cuda {

std::vector<std::uint64_t> BenchSizes(std::uint64_t min_bytes, std::uint64_t max_bytes,
                                      std::uint64_t factor) {
  std::vector<std::uint64_t> out;
  if (min_bytes == 0) min_bytes = 1;
  if (max_bytes < min_bytes) max_bytes = min_bytes;
  for (std::uint64_t s = min_bytes; s < max_bytes; s *= factor) {
    out.push_back(s);
    if (factor <= 1) break;
  }
  out.push_back(max_bytes);
  return out;
}

double BusBandwidthFactor(std::string_view op, int world_size) {
  (void)op;  // all-gather and reduce-scatter share (n-1)/n
  if (world_size <= 0) return 0;
  return static_cast<double>(world_size - 1) / world_size;
}

StatusOr<std::uint64_t> BenchElementBytes(std::string_view dtype) {
  if (dtype == "bf16" || dtype == "fp16") return std::uint64_t{2};
  if (dtype == "fp32") return std::uint64_t{4};
  if (dtype == "uint8" || dtype == "int8") return std::uint64_t{1};
  return InvalidInput(fmt::format("-d {}: expected bf16, fp16, fp32 or uint8", dtype));
}

void FillDerivedColumns(GatherBenchRow& row, std::string_view op, int world_size) {
  auto bw = [&](TimeUs us) {
    return us > 0 ? static_cast<double>(row.size_bytes) / (us * 1e3) : 0;
  };
  row.algbw_GBps = bw(row.time_us);
  row.busbw_GBps = row.algbw_GBps * BusBandwidthFactor(op, world_size);
  row.inplace_algbw_GBps = bw(row.inplace_time_us);
  row.inplace_busbw_GBps = row.inplace_algbw_GBps * BusBandwidthFactor(op, world_size);
  const TimeUs shorter = std::min(row.time_us, row.gemm_alone_us);
  row.overlap_efficiency =
      shorter > 0 ? (row.time_us + row.gemm_alone_us - row.together_us) / shorter : 0;
  row.compute_slowdown =
      row.gemm_alone_us > 0 ? row.gemm_under_overlap_us / row.gemm_alone_us - 1 : 0;
}

namespace {

ncclDataType_t NcclDType(std::string_view dtype) {
  if (dtype == "bf16") return ncclBfloat16;
  if (dtype == "fp16") return ncclFloat16;
  if (dtype == "fp32") return ncclFloat32;
  return ncclUint8;
}

DType CoreDType(std::string_view dtype) {
  if (dtype == "fp16") return DType::kFp16;
  if (dtype == "fp32") return DType::kFp32;
  return DType::kBf16;
}

struct BenchRank {
  int rank = 0;
  int device = 0;
  CudaStream comm_stream, compute_stream;
  NcclComm comm;
  CublasHandle cublas;
  DeviceBuffer send, recv, a, b, c, counter;
  CudaEvent e0, e1, e2;
};

// One measured collective: how many bytes each rank sends and receives, how to fill the input,
// how to run it, and how to check the output.
struct CollectiveHooks {
  std::string_view name;
  std::function<std::uint64_t(std::uint64_t size, int w)> send_bytes;
  std::function<std::uint64_t(std::uint64_t size, int w)> recv_bytes;
  std::function<Status(BenchRank&, std::uint64_t size, int w, std::uint64_t key)> init;
  std::function<Status(BenchRank&, std::uint64_t size, int w, bool in_place)> run;
  std::function<Status(BenchRank&, std::uint64_t size, int w, std::uint64_t key)> check;
};

}  // namespace

StatusOr<std::vector<GatherBenchRow>> RunGatherBench(const GatherBenchOptions& options) {
  return RunGatherBench(options, std::nullopt);
}

StatusOr<std::vector<GatherBenchRow>> RunGatherBench(const GatherBenchOptions& opt,
                                                     std::optional<int> emulate_world_size) {
  if (opt.op != "all_gather" && opt.op != "reduce_scatter") {
    return UsageError(fmt::format("op '{}': expected all_gather or reduce_scatter", opt.op));
  }
  if (opt.iters < 1 || opt.warmup < 0) return UsageError("-n must be >= 1 and -w >= 0");
  FSDP_ASSIGN_OR_RETURN(const std::uint64_t elem, BenchElementBytes(opt.dtype));
  if (opt.op == "reduce_scatter" && elem == 1) {
    return UsageError("reduce_scatter needs a floating-point -d (bf16, fp16, fp32)");
  }
  FSDP_ASSIGN_OR_RETURN(std::vector<DeviceInfo> devices, VisibleDevices());
  const bool emulated = emulate_world_size.has_value();
  const int w = emulated ? *emulate_world_size : opt.world_size;
  if (w < 1) return UsageError(fmt::format("world size {} must be at least 1", w));
  const int local = emulated ? 1 : w;
  if (local > static_cast<int>(devices.size())) {
    return Unavailable(
        fmt::format("bench-gather with world size {} needs {} GPUs, {} visible: "
                    "use --emulate-world-size {} on one GPU",
                    w, w, devices.size(), w));
  }
  std::vector<int> devs;
  for (int i = 0; i < local; ++i) devs.push_back(i);
  std::vector<BenchRank> ranks(static_cast<std::size_t>(local));
  std::vector<NcclComm> comms;
  if (!emulated) {
    FSDP_ASSIGN_OR_RETURN(comms, NcclComm::CreateAll(devs));
  }
  const std::vector<std::uint64_t> sizes =
      BenchSizes(opt.min_bytes, opt.max_bytes, opt.step_factor);
  const std::uint64_t unit = elem * static_cast<std::uint64_t>(w);
  const std::uint64_t max_size = (sizes.back() + unit - 1) / unit * unit;
  const ncclDataType_t nccl_type = NcclDType(opt.dtype);
  const bool gather = opt.op == "all_gather";

  // GEMM size: the overlapped GEMM takes about as long as the collective unless -g was given.
  constexpr std::int64_t kMaxGemm = 16384;
  for (int i = 0; i < local; ++i) {
    BenchRank& r = ranks[static_cast<std::size_t>(i)];
    r.rank = i;
    r.device = i;
    DeviceGuard guard(i);
    FSDP_ASSIGN_OR_RETURN(r.comm_stream, CudaStream::Create(i));
    FSDP_ASSIGN_OR_RETURN(r.compute_stream, CudaStream::Create(i));
    if (!emulated) r.comm = std::move(comms[static_cast<std::size_t>(i)]);
    FSDP_ASSIGN_OR_RETURN(r.cublas, CublasHandle::Create(i, r.compute_stream.get()));
    // All-gather: send = size / w, recv = size; reduce-scatter the other way round. Emulation
    // also needs a scratch the size of the message.
    FSDP_ASSIGN_OR_RETURN(r.send, DeviceBuffer::Allocate(i, max_size));
    FSDP_ASSIGN_OR_RETURN(r.recv, DeviceBuffer::Allocate(i, max_size));
    FSDP_ASSIGN_OR_RETURN(r.counter, DeviceBuffer::Allocate(i, 16));
    FSDP_ASSIGN_OR_RETURN(r.e0, CudaEvent::Create(i, true));
    FSDP_ASSIGN_OR_RETURN(r.e1, CudaEvent::Create(i, true));
    FSDP_ASSIGN_OR_RETURN(r.e2, CudaEvent::Create(i, true));
  }
  const CollectiveHooks hooks{
      .name = opt.op,
      .send_bytes = [&](std::uint64_t size, int n) { return gather ? size / n : size; },
      .recv_bytes = [&](std::uint64_t size, int n) { return gather ? size : size / n; },
      .init = [&](BenchRank& r, std::uint64_t size, int n, std::uint64_t key) -> Status {
        cudaStream_t s = r.comm_stream.get();
        if (gather) {
          FSDP_CUDA_CHECK(internal::FillPattern(
              r.send.get(), size / n, size / n * static_cast<std::uint64_t>(r.rank), key, s));
        } else {
          FSDP_CUDA_CHECK(
              internal::FillGrad(r.send.get(), CoreDType(opt.dtype), size / elem, key, r.rank, s));
        }
        return Status::Ok();
      },
      .run = [&](BenchRank& r, std::uint64_t size, int n, bool in_place) -> Status {
        cudaStream_t s = r.comm_stream.get();
        const std::uint64_t part = size / static_cast<std::uint64_t>(n);
        if (emulated) {
          // What one rank of an n-rank ring receives: n-1 parts.
          FSDP_CUDA_CHECK(cudaMemcpyAsync(r.recv.get(), r.send.get(), part * (n - 1),
                                          cudaMemcpyDeviceToDevice, s));
          return Status::Ok();
        }
        auto* recv = r.recv.as<unsigned char>();
        auto* send = r.send.as<unsigned char>();
        if (gather) {
          const void* in = in_place ? recv + part * static_cast<std::uint64_t>(r.rank) : send;
          FSDP_NCCL_CHECK(ncclAllGather(in, recv, part / elem, nccl_type, r.comm.get(), s));
        } else {
          const void* in = in_place ? static_cast<const void*>(recv) : send;
          void* out = in_place ? recv + part * static_cast<std::uint64_t>(r.rank) : recv;
          FSDP_NCCL_CHECK(
              ncclReduceScatter(in, out, part / elem, nccl_type, ncclSum, r.comm.get(), s));
        }
        return Status::Ok();
      },
      .check = [&](BenchRank& r, std::uint64_t size, int n, std::uint64_t key) -> Status {
        cudaStream_t s = r.comm_stream.get();
        auto* wrong = r.counter.as<unsigned long long>();
        if (gather) {
          FSDP_CUDA_CHECK(internal::CheckPattern(r.recv.get(), size, key, wrong, s));
        } else {
          const std::uint64_t count = size / elem / static_cast<std::uint64_t>(n);
          FSDP_CUDA_CHECK(internal::CheckReduced(
              r.recv.get(), CoreDType(opt.dtype), count, count * static_cast<std::uint64_t>(r.rank),
              size / elem, key, n, wrong, reinterpret_cast<unsigned int*>(wrong + 1), s));
        }
        return Status::Ok();
      }};

  // Runs `body` for every rank inside one NCCL group (collectives of all local GPUs together).
  auto all_ranks = [&](const std::function<Status(BenchRank&)>& body) -> Status {
    if (!emulated) FSDP_NCCL_CHECK(ncclGroupStart());
    Status st;
    for (BenchRank& r : ranks) {
      DeviceGuard guard(r.device);
      st = body(r);
      if (!st.ok()) break;
    }
    if (!emulated) FSDP_NCCL_CHECK(ncclGroupEnd());
    return st;
  };
  auto sync_all = [&]() -> Status {
    for (BenchRank& r : ranks) {
      DeviceGuard guard(r.device);
      FSDP_CUDA_CHECK(cudaDeviceSynchronize());
    }
    return Status::Ok();
  };
  // Longest elapsed time over ranks between two of their events.
  auto elapsed_us = [&](CudaEvent BenchRank::*from, CudaEvent BenchRank::*to) -> StatusOr<TimeUs> {
    TimeUs worst = 0;
    for (BenchRank& r : ranks) {
      FSDP_ASSIGN_OR_RETURN(float ms, (r.*to).ElapsedMsSince(r.*from));
      worst = std::max(worst, static_cast<TimeUs>(ms) * 1e3);
    }
    return worst;
  };
  auto gemm = [&](BenchRank& r, std::int64_t n) -> Status {
    const float alpha = 1, beta = 0;
    const int k = static_cast<int>(n);
    FSDP_CUBLAS_CHECK(cublasGemmEx(r.cublas.get(), CUBLAS_OP_N, CUBLAS_OP_N, k, k, k, &alpha,
                                   r.a.get(), CUDA_R_16BF, k, r.b.get(), CUDA_R_16BF, k, &beta,
                                   r.c.get(), CUDA_R_16BF, k, CUBLAS_COMPUTE_32F,
                                   CUBLAS_GEMM_DEFAULT));
    return Status::Ok();
  };
  auto ensure_gemm_buffers = [&](std::int64_t n) -> Status {
    const auto bytes = static_cast<std::size_t>(n * n * 2);
    for (BenchRank& r : ranks) {
      if (r.a.bytes() >= bytes) continue;
      DeviceGuard guard(r.device);
      FSDP_CUDA_CHECK(cudaDeviceSynchronize());
      FSDP_ASSIGN_OR_RETURN(r.a, DeviceBuffer::Allocate(r.device, bytes));
      FSDP_ASSIGN_OR_RETURN(r.b, DeviceBuffer::Allocate(r.device, bytes));
      FSDP_ASSIGN_OR_RETURN(r.c, DeviceBuffer::Allocate(r.device, bytes));
      FSDP_CUDA_CHECK(
          internal::FillGrad(r.a.get(), DType::kBf16, bytes / 2, 7, 0, r.compute_stream.get()));
      FSDP_CUDA_CHECK(
          internal::FillGrad(r.b.get(), DType::kBf16, bytes / 2, 8, 0, r.compute_stream.get()));
    }
    return Status::Ok();
  };
  // Times `iters` launches of `launch` on each rank's `stream` after `warmup` of them.
  auto time_loop = [&](const std::function<Status(BenchRank&)>& launch,
                       bool comm) -> StatusOr<TimeUs> {
    auto stream_of = [&](BenchRank& r) {
      return comm ? r.comm_stream.get() : r.compute_stream.get();
    };
    // Collectives of all local ranks in one group; compute launched rank by rank.
    auto launch_once = [&]() -> Status {
      if (comm) return all_ranks(launch);
      for (BenchRank& r : ranks) {
        DeviceGuard guard(r.device);
        FSDP_RETURN_IF_ERROR(launch(r));
      }
      return Status::Ok();
    };
    for (int i = 0; i < opt.warmup; ++i) FSDP_RETURN_IF_ERROR(launch_once());
    for (BenchRank& r : ranks) FSDP_RETURN_IF_ERROR(r.e0.Record(stream_of(r)));
    for (int i = 0; i < opt.iters; ++i) FSDP_RETURN_IF_ERROR(launch_once());
    for (BenchRank& r : ranks) FSDP_RETURN_IF_ERROR(r.e1.Record(stream_of(r)));
    FSDP_RETURN_IF_ERROR(sync_all());
    FSDP_ASSIGN_OR_RETURN(TimeUs total, elapsed_us(&BenchRank::e0, &BenchRank::e1));
    return total / opt.iters;
  };

  // GEMM throughput, to size the overlapped GEMM.
  FSDP_RETURN_IF_ERROR(ensure_gemm_buffers(2048));
  FSDP_ASSIGN_OR_RETURN(TimeUs probe_us,
                        time_loop([&](BenchRank& r) { return gemm(r, 2048); }, false));
  const double flops_per_us = 2.0 * 2048.0 * 2048.0 * 2048.0 / std::max(probe_us, 1e-3);

  std::vector<GatherBenchRow> rows;
  for (std::uint64_t requested : sizes) {
    const std::uint64_t size = std::max(unit, requested / unit * unit);
    GatherBenchRow row;
    row.size_bytes = size;
    row.count = size / elem;
    row.type = opt.dtype;
    const std::uint64_t key = 0xb3e7c0deull ^ size;
    FSDP_RETURN_IF_ERROR(sync_all());
    for (BenchRank& r : ranks) {
      DeviceGuard guard(r.device);
      FSDP_CUDA_CHECK(cudaMemset(r.counter.get(), 0, 16));
      FSDP_RETURN_IF_ERROR(hooks.init(r, size, w, key));
    }
    // Out of place, then checked.
    FSDP_ASSIGN_OR_RETURN(
        row.time_us, time_loop([&](BenchRank& r) { return hooks.run(r, size, w, false); }, true));
    if (opt.check && !emulated) {
      if (!gather) {
        // The timed loop reduced the same input repeatedly into recv: run once more cleanly.
        FSDP_RETURN_IF_ERROR(all_ranks([&](BenchRank& r) { return hooks.run(r, size, w, false); }));
      }
      for (BenchRank& r : ranks) {
        DeviceGuard guard(r.device);
        FSDP_RETURN_IF_ERROR(hooks.check(r, size, w, key));
      }
      FSDP_RETURN_IF_ERROR(sync_all());
      for (BenchRank& r : ranks) {
        unsigned long long wrong = 0;
        FSDP_CUDA_CHECK(cudaMemcpy(&wrong, r.counter.get(), sizeof wrong, cudaMemcpyDeviceToHost));
        row.wrong += wrong;
      }
    }
    // In place (the input is this rank's slice of the output), not checked.
    FSDP_ASSIGN_OR_RETURN(
        row.inplace_time_us,
        time_loop([&](BenchRank& r) { return hooks.run(r, size, w, true); }, true));
    // The GEMM alone.
    std::int64_t n = static_cast<std::int64_t>(opt.gemm_n);
    if (n == 0) {
      n = static_cast<std::int64_t>(std::cbrt(row.time_us * flops_per_us / 2.0));
      n = std::clamp<std::int64_t>((n + 127) / 128 * 128, 256, kMaxGemm);
    }
    FSDP_RETURN_IF_ERROR(ensure_gemm_buffers(n));
    FSDP_ASSIGN_OR_RETURN(row.gemm_alone_us,
                          time_loop([&](BenchRank& r) { return gemm(r, n); }, false));
    // Together: both streams start at e0 (recorded on the compute stream); e1 ends the
    // collectives, e2 the GEMMs.
    FSDP_RETURN_IF_ERROR(sync_all());
    for (BenchRank& r : ranks) {
      DeviceGuard guard(r.device);
      FSDP_RETURN_IF_ERROR(r.e0.Record(r.compute_stream.get()));
      FSDP_RETURN_IF_ERROR(r.e0.WaitOn(r.comm_stream.get()));
    }
    for (int i = 0; i < opt.iters; ++i) {
      FSDP_RETURN_IF_ERROR(all_ranks([&](BenchRank& r) { return hooks.run(r, size, w, false); }));
      for (BenchRank& r : ranks) {
        DeviceGuard guard(r.device);
        FSDP_RETURN_IF_ERROR(gemm(r, n));
      }
    }
    for (BenchRank& r : ranks) {
      DeviceGuard guard(r.device);
      FSDP_RETURN_IF_ERROR(r.e1.Record(r.comm_stream.get()));
      FSDP_RETURN_IF_ERROR(r.e2.Record(r.compute_stream.get()));
    }
    FSDP_RETURN_IF_ERROR(sync_all());
    FSDP_ASSIGN_OR_RETURN(TimeUs coll_total, elapsed_us(&BenchRank::e0, &BenchRank::e1));
    FSDP_ASSIGN_OR_RETURN(TimeUs gemm_total, elapsed_us(&BenchRank::e0, &BenchRank::e2));
    row.collective_under_overlap_us = coll_total / opt.iters;
    row.gemm_under_overlap_us = gemm_total / opt.iters;
    row.together_us = std::max(coll_total, gemm_total) / opt.iters;
    FillDerivedColumns(row, opt.op, w);
    rows.push_back(row);
  }
  return rows;
}

}  // namespace fsdplab::cuda
