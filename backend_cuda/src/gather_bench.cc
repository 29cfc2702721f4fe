// bench-gather on CUDA: the hooks of the shared harness (live/gather_bench.h) on CUDA streams,
// NCCL collectives and cuBLAS GEMMs, timed with CUDA events.
#include "fsdplab/live/gather_bench.h"

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
namespace {

ncclDataType_t NcclDType(const BenchType& type) {
  if (!type.dtype) return ncclUint8;
  switch (*type.dtype) {
    case DType::kFp16: return ncclFloat16;
    case DType::kFp32: return ncclFloat32;
    default: return ncclBfloat16;
  }
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

// The hooks of the CUDA benchmark: every local GPU a rank, collectives of all of them in one NCCL
// group, times from CUDA events (the slowest rank). Emulated: one GPU copies what a rank of a
// W-rank ring receives.
class CudaGatherBench final {
 public:
  explicit CudaGatherBench(bool emulated) : emulated_(emulated) {}

  // Streams, communicators, cuBLAS handles and buffers for `local` GPUs; buffers fit the
  // largest message of `max_size` bytes.
  Status Open(int local, std::uint64_t max_size) {
    std::vector<int> devs;
    for (int i = 0; i < local; ++i) devs.push_back(i);
    std::vector<NcclComm> comms;
    if (!emulated_) {
      FSDP_ASSIGN_OR_RETURN(comms, NcclComm::CreateAll(devs));
    }
    ranks_ = std::vector<BenchRank>(static_cast<std::size_t>(local));
    for (int i = 0; i < local; ++i) {
      BenchRank& r = ranks_[static_cast<std::size_t>(i)];
      r.rank = i;
      r.device = i;
      DeviceGuard guard(i);
      FSDP_ASSIGN_OR_RETURN(r.comm_stream, CudaStream::Create(i));
      FSDP_ASSIGN_OR_RETURN(r.compute_stream, CudaStream::Create(i));
      if (!emulated_) r.comm = std::move(comms[static_cast<std::size_t>(i)]);
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
    return Status::Ok();
  }

  Status Init(const BenchCase& c) {
    c_ = c;
    FSDP_RETURN_IF_ERROR(SyncAll());
    for (BenchRank& r : ranks_) {
      DeviceGuard guard(r.device);
      FSDP_CUDA_CHECK(cudaMemset(r.counter.get(), 0, 16));
      cudaStream_t s = r.comm_stream.get();
      if (c.all_gather) {
        FSDP_CUDA_CHECK(internal::FillPattern(r.send.get(), c.shard_bytes,
                                              c.shard_bytes * static_cast<std::uint64_t>(r.rank),
                                              c.key, s));
      } else {
        FSDP_CUDA_CHECK(internal::FillGrad(r.send.get(), *c.type.dtype, c.size_bytes / c.type.bytes,
                                           c.key, r.rank, s));
      }
    }
    return Status::Ok();
  }

  StatusOr<TimeUs> Time(BenchWork work, std::int64_t gemm_n, int warmup, int iters) {
    if (work == BenchWork::kGemm) {
      FSDP_RETURN_IF_ERROR(EnsureGemmBuffers(gemm_n));
      return TimeLoop([&](BenchRank& r) { return Gemm(r, gemm_n); }, false, warmup, iters);
    }
    const bool in_place = work == BenchWork::kCollectiveInPlace;
    return TimeLoop([&](BenchRank& r) { return Collective(r, in_place); }, true, warmup, iters);
  }

  // Both streams start at e0 (recorded on the compute stream); e1 ends the collectives, e2 the
  // GEMMs.
  StatusOr<OverlapTimes> TimeTogether(std::int64_t gemm_n, int iters) {
    FSDP_RETURN_IF_ERROR(EnsureGemmBuffers(gemm_n));
    FSDP_RETURN_IF_ERROR(SyncAll());
    for (BenchRank& r : ranks_) {
      DeviceGuard guard(r.device);
      FSDP_RETURN_IF_ERROR(r.e0.Record(r.compute_stream.get()));
      FSDP_RETURN_IF_ERROR(r.e0.WaitOn(r.comm_stream.get()));
    }
    for (int i = 0; i < iters; ++i) {
      FSDP_RETURN_IF_ERROR(AllRanks([&](BenchRank& r) { return Collective(r, false); }));
      for (BenchRank& r : ranks_) {
        DeviceGuard guard(r.device);
        FSDP_RETURN_IF_ERROR(Gemm(r, gemm_n));
      }
    }
    for (BenchRank& r : ranks_) {
      DeviceGuard guard(r.device);
      FSDP_RETURN_IF_ERROR(r.e1.Record(r.comm_stream.get()));
      FSDP_RETURN_IF_ERROR(r.e2.Record(r.compute_stream.get()));
    }
    FSDP_RETURN_IF_ERROR(SyncAll());
    FSDP_ASSIGN_OR_RETURN(const TimeUs coll_total, ElapsedUs(&BenchRank::e0, &BenchRank::e1));
    FSDP_ASSIGN_OR_RETURN(const TimeUs gemm_total, ElapsedUs(&BenchRank::e0, &BenchRank::e2));
    return OverlapTimes{.collective_us = coll_total / iters,
                        .gemm_us = gemm_total / iters,
                        .together_us = std::max(coll_total, gemm_total) / iters};
  }

  // Out of place, on the GPU against the seeded pattern; in place and emulated runs are not
  // checked.
  StatusOr<std::optional<std::uint64_t>> Check(bool in_place) {
    if (in_place || emulated_) return std::optional<std::uint64_t>();
    if (!c_.all_gather) {
      // The timed loop reduced the same input repeatedly into recv: run once more cleanly.
      FSDP_RETURN_IF_ERROR(AllRanks([&](BenchRank& r) { return Collective(r, false); }));
    }
    for (BenchRank& r : ranks_) {
      DeviceGuard guard(r.device);
      cudaStream_t s = r.comm_stream.get();
      auto* wrong = r.counter.as<unsigned long long>();
      if (c_.all_gather) {
        FSDP_CUDA_CHECK(internal::CheckPattern(r.recv.get(), c_.size_bytes, c_.key, wrong, s));
      } else {
        const std::uint64_t count = c_.shard_bytes / c_.type.bytes;
        FSDP_CUDA_CHECK(internal::CheckReduced(
            r.recv.get(), *c_.type.dtype, count, count * static_cast<std::uint64_t>(r.rank),
            c_.size_bytes / c_.type.bytes, c_.key, c_.world_size, wrong,
            reinterpret_cast<unsigned int*>(wrong + 1), s));
      }
    }
    FSDP_RETURN_IF_ERROR(SyncAll());
    std::uint64_t total = 0;
    for (BenchRank& r : ranks_) {
      unsigned long long wrong = 0;
      FSDP_CUDA_CHECK(cudaMemcpy(&wrong, r.counter.get(), sizeof wrong, cudaMemcpyDeviceToHost));
      total += wrong;
    }
    return std::optional<std::uint64_t>(total);
  }

 private:
  Status Collective(BenchRank& r, bool in_place) {
    cudaStream_t s = r.comm_stream.get();
    const std::uint64_t part = c_.shard_bytes;
    if (emulated_) {
      // What one rank of an n-rank ring receives: n-1 parts.
      FSDP_CUDA_CHECK(cudaMemcpyAsync(r.recv.get(), r.send.get(), part * (c_.world_size - 1),
                                      cudaMemcpyDeviceToDevice, s));
      return Status::Ok();
    }
    auto* recv = r.recv.as<unsigned char>();
    auto* send = r.send.as<unsigned char>();
    const std::uint64_t count = part / c_.type.bytes;
    const ncclDataType_t type = NcclDType(c_.type);
    if (c_.all_gather) {
      const void* in = in_place ? recv + part * static_cast<std::uint64_t>(r.rank) : send;
      FSDP_NCCL_CHECK(ncclAllGather(in, recv, count, type, r.comm.get(), s));
    } else {
      const void* in = in_place ? static_cast<const void*>(recv) : send;
      void* out = in_place ? recv + part * static_cast<std::uint64_t>(r.rank) : recv;
      FSDP_NCCL_CHECK(ncclReduceScatter(in, out, count, type, ncclSum, r.comm.get(), s));
    }
    return Status::Ok();
  }

  Status Gemm(BenchRank& r, std::int64_t n) {
    const float alpha = 1, beta = 0;
    const int k = static_cast<int>(n);
    FSDP_CUBLAS_CHECK(cublasGemmEx(r.cublas.get(), CUBLAS_OP_N, CUBLAS_OP_N, k, k, k, &alpha,
                                   r.a.get(), CUDA_R_16BF, k, r.b.get(), CUDA_R_16BF, k, &beta,
                                   r.c.get(), CUDA_R_16BF, k, CUBLAS_COMPUTE_32F,
                                   CUBLAS_GEMM_DEFAULT));
    return Status::Ok();
  }

  Status EnsureGemmBuffers(std::int64_t n) {
    const auto bytes = static_cast<std::size_t>(n * n * 2);
    for (BenchRank& r : ranks_) {
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
  }

  // Runs `body` for every rank inside one NCCL group (collectives of all local GPUs together).
  Status AllRanks(const std::function<Status(BenchRank&)>& body) {
    if (!emulated_) FSDP_NCCL_CHECK(ncclGroupStart());
    Status st;
    for (BenchRank& r : ranks_) {
      DeviceGuard guard(r.device);
      st = body(r);
      if (!st.ok()) break;
    }
    if (!emulated_) FSDP_NCCL_CHECK(ncclGroupEnd());
    return st;
  }

  Status SyncAll() {
    for (BenchRank& r : ranks_) {
      DeviceGuard guard(r.device);
      FSDP_CUDA_CHECK(cudaDeviceSynchronize());
    }
    return Status::Ok();
  }

  // Longest elapsed time over ranks between two of their events.
  StatusOr<TimeUs> ElapsedUs(CudaEvent BenchRank::*from, CudaEvent BenchRank::*to) {
    TimeUs worst = 0;
    for (BenchRank& r : ranks_) {
      FSDP_ASSIGN_OR_RETURN(float ms, (r.*to).ElapsedMsSince(r.*from));
      worst = std::max(worst, static_cast<TimeUs>(ms) * 1e3);
    }
    return worst;
  }

  // Times `iters` launches of `launch` on each rank's communication or compute stream after
  // `warmup` of them: collectives of all local ranks in one group, compute rank by rank.
  StatusOr<TimeUs> TimeLoop(const std::function<Status(BenchRank&)>& launch, bool comm, int warmup,
                            int iters) {
    auto stream_of = [&](BenchRank& r) {
      return comm ? r.comm_stream.get() : r.compute_stream.get();
    };
    auto launch_once = [&]() -> Status {
      if (comm) return AllRanks(launch);
      for (BenchRank& r : ranks_) {
        DeviceGuard guard(r.device);
        FSDP_RETURN_IF_ERROR(launch(r));
      }
      return Status::Ok();
    };
    for (int i = 0; i < warmup; ++i) FSDP_RETURN_IF_ERROR(launch_once());
    for (BenchRank& r : ranks_) FSDP_RETURN_IF_ERROR(r.e0.Record(stream_of(r)));
    for (int i = 0; i < iters; ++i) FSDP_RETURN_IF_ERROR(launch_once());
    for (BenchRank& r : ranks_) FSDP_RETURN_IF_ERROR(r.e1.Record(stream_of(r)));
    FSDP_RETURN_IF_ERROR(SyncAll());
    FSDP_ASSIGN_OR_RETURN(TimeUs total, ElapsedUs(&BenchRank::e0, &BenchRank::e1));
    return total / iters;
  }

  bool emulated_;
  BenchCase c_;
  std::vector<BenchRank> ranks_;
};

}  // namespace

StatusOr<std::vector<GatherBenchRow>> RunGatherBench(const GatherBenchOptions& options) {
  return RunGatherBench(options, std::nullopt);
}

StatusOr<std::vector<GatherBenchRow>> RunGatherBench(const GatherBenchOptions& opt,
                                                     std::optional<int> emulate_world_size) {
  FSDP_RETURN_IF_ERROR(CheckGatherBenchOptions(opt));
  FSDP_ASSIGN_OR_RETURN(const BenchType type, FindBenchType(opt.dtype));
  FSDP_ASSIGN_OR_RETURN(std::vector<DeviceInfo> devices, VisibleDevices());
  const bool emulated = emulate_world_size.has_value();
  const int w = emulated ? *emulate_world_size : opt.world_size;
  if (w < 1) return UsageError(fmt::format("emulate_world_size: {} must be at least 1", w));
  const int local = emulated ? 1 : w;
  if (local > static_cast<int>(devices.size())) {
    return Unavailable(
        fmt::format("bench-gather with world size {} needs {} GPUs, {} visible: "
                    "emulate_world_size {} runs it on one GPU",
                    w, w, devices.size(), w));
  }
  // Buffers for the largest message, rounded up to a multiple of ranks x element size.
  const std::uint64_t unit = type.bytes * static_cast<std::uint64_t>(w);
  const std::uint64_t max_size = (opt.max_bytes + unit - 1) / unit * unit;
  CudaGatherBench bench(emulated);
  FSDP_RETURN_IF_ERROR(bench.Open(local, max_size));
  // The GEMM: bf16 on cuBLAS, sized in multiples of 128.
  const GemmSizing gemm{
      .probe_n = 2048, .probe_iters = 20, .min_n = 256, .max_n = 16384, .multiple = 128};
  return fsdplab::RunGatherBench(opt, w, HooksOf(bench, gemm));
}

}  // namespace fsdplab::cuda
