// Move-only RAII owners of CUDA and NCCL resources: streams, events, device buffers,
// communicators and cuBLAS handles. Creation returns StatusOr; destructors are noexcept and log
// (never throw) when the release fails.
//
//   FSDP_ASSIGN_OR_RETURN(CudaStream s, CudaStream::Create(/*device=*/0));
//   FSDP_ASSIGN_OR_RETURN(DeviceBuffer b, DeviceBuffer::Allocate(0, 1 << 20));
//   FSDP_ASSIGN_OR_RETURN(CudaEvent e, CudaEvent::Create(0, /*timing=*/true));
//   FSDP_RETURN_IF_ERROR(e.Record(s.get()));
//
// A DeviceBuffer allocated on a stream (stream-ordered, cudaMallocAsync) is released on the
// stream given to FreeOn(): the caller orders that stream after every other user first (an event
// wait), so the memory is reused only after the last stream using it has passed that point.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <nccl.h>

#include <cstddef>
#include <span>
#include <vector>

#include "fsdplab/core/status.h"

namespace fsdplab::cuda {

// Makes `device` current for its lifetime and restores the previous device after.
class DeviceGuard final {
 public:
  explicit DeviceGuard(int device) noexcept;
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = -1;
};

class CudaStream final {
 public:
  CudaStream() = default;
  // A non-blocking stream (no implicit order with the legacy default stream).
  static StatusOr<CudaStream> Create(int device);
  ~CudaStream();
  CudaStream(CudaStream&& other) noexcept;
  CudaStream& operator=(CudaStream&& other) noexcept;
  CudaStream(const CudaStream&) = delete;
  CudaStream& operator=(const CudaStream&) = delete;

  cudaStream_t get() const { return stream_; }
  int device() const { return device_; }

 private:
  void Reset() noexcept;
  cudaStream_t stream_ = nullptr;
  int device_ = -1;
};

class CudaEvent final {
 public:
  CudaEvent() = default;
  // `timing`: the event can be used with cudaEventElapsedTime (slower to record).
  static StatusOr<CudaEvent> Create(int device, bool timing);
  ~CudaEvent();
  CudaEvent(CudaEvent&& other) noexcept;
  CudaEvent& operator=(CudaEvent&& other) noexcept;
  CudaEvent(const CudaEvent&) = delete;
  CudaEvent& operator=(const CudaEvent&) = delete;

  Status Record(cudaStream_t stream);
  // Makes `stream` wait for this event's last record.
  Status WaitOn(cudaStream_t stream) const;
  // True when the work before the last record has finished; never blocks.
  StatusOr<bool> Query() const;
  // Milliseconds from `start` to this event (both recorded and complete, same device).
  StatusOr<float> ElapsedMsSince(const CudaEvent& start) const;

  cudaEvent_t get() const { return event_; }
  bool valid() const { return event_ != nullptr; }

 private:
  void Reset() noexcept;
  cudaEvent_t event_ = nullptr;
  int device_ = -1;
};

class DeviceBuffer final {
 public:
  DeviceBuffer() = default;
  // Plain allocation (cudaMalloc), freed synchronously by the destructor.
  static StatusOr<DeviceBuffer> Allocate(int device, std::size_t bytes);
  // Stream-ordered allocation (cudaMallocAsync on `stream`); release with FreeOn().
  static StatusOr<DeviceBuffer> AllocateOn(int device, std::size_t bytes, cudaStream_t stream);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  // Releases the memory in the order of `stream` (cudaFreeAsync). The buffer is empty after.
  Status FreeOn(cudaStream_t stream);

  void* get() const { return ptr_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }
  std::size_t bytes() const { return bytes_; }
  int device() const { return device_; }
  bool empty() const { return ptr_ == nullptr; }

 private:
  void Reset() noexcept;
  void* ptr_ = nullptr;
  std::size_t bytes_ = 0;
  int device_ = -1;
  bool stream_ordered_ = false;
};

// One NCCL communicator (one rank). Destroyed normally, or aborted when a collective failed or
// timed out (ncclCommAbort never waits for outstanding work).
class NcclComm final {
 public:
  NcclComm() = default;
  // One communicator per device, created together by one process (ncclCommInitAll).
  static StatusOr<std::vector<NcclComm>> CreateAll(const std::vector<int>& devices);
  // One rank of `world_size` (one process per GPU), from a unique id every rank received.
  static StatusOr<NcclComm> CreateRank(int device, int world_size, int rank,
                                       const ncclUniqueId& id);
  // Sub-communicators (ncclCommSplit, one NCCL group over every parent this process holds, as
  // each parent rank must call it): parent i joins the communicator of colors[i], ranked there
  // by keys[i]. hsdp splits the world into shard groups (color rank / S, key rank mod S) and
  // replica columns (color rank mod S, key rank / S). A split keeps the parent's rank for
  // messages.
  static StatusOr<std::vector<NcclComm>> Split(std::span<const NcclComm> parents,
                                               std::span<const int> colors,
                                               std::span<const int> keys);
  ~NcclComm();
  NcclComm(NcclComm&& other) noexcept;
  NcclComm& operator=(NcclComm&& other) noexcept;
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;

  // The communicator's asynchronous error (a peer failed, a network error): Ok when none.
  Status AsyncError() const;
  // Aborts: outstanding collectives are abandoned; the communicator is unusable after.
  void Abort() noexcept;

  ncclComm_t get() const { return comm_; }
  int device() const { return device_; }
  int rank() const { return rank_; }
  bool valid() const { return comm_ != nullptr; }

 private:
  void Reset() noexcept;
  ncclComm_t comm_ = nullptr;
  int device_ = -1;
  int rank_ = -1;
};

class CublasHandle final {
 public:
  CublasHandle() = default;
  static StatusOr<CublasHandle> Create(int device, cudaStream_t stream);
  ~CublasHandle();
  CublasHandle(CublasHandle&& other) noexcept;
  CublasHandle& operator=(CublasHandle&& other) noexcept;
  CublasHandle(const CublasHandle&) = delete;
  CublasHandle& operator=(const CublasHandle&) = delete;

  cublasHandle_t get() const { return handle_; }

 private:
  void Reset() noexcept;
  cublasHandle_t handle_ = nullptr;
  int device_ = -1;
};

}  // namespace fsdplab::cuda
