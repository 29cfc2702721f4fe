#include "fsdplab/cuda/resources.h"

#include <fmt/format.h>

#include <utility>

#include "fsdplab/cuda/check.h"

namespace fsdplab::cuda {

DeviceGuard::DeviceGuard(int device) noexcept {
  if (cudaGetDevice(&previous_) != cudaSuccess) previous_ = -1;
  if (device != previous_) FSDP_CUDA_CHECK_LOG(cudaSetDevice(device));
}

DeviceGuard::~DeviceGuard() {
  if (previous_ >= 0) FSDP_CUDA_CHECK_LOG(cudaSetDevice(previous_));
}

// ---- CudaStream

StatusOr<CudaStream> CudaStream::Create(int device) {
  DeviceGuard guard(device);
  CudaStream s;
  FSDP_CUDA_CHECK(cudaStreamCreateWithFlags(&s.stream_, cudaStreamNonBlocking));
  s.device_ = device;
  return s;
}

CudaStream::~CudaStream() { Reset(); }

CudaStream::CudaStream(CudaStream&& other) noexcept
    : stream_(std::exchange(other.stream_, nullptr)), device_(other.device_) {}

CudaStream& CudaStream::operator=(CudaStream&& other) noexcept {
  if (this != &other) {
    Reset();
    stream_ = std::exchange(other.stream_, nullptr);
    device_ = other.device_;
  }
  return *this;
}

void CudaStream::Reset() noexcept {
  if (stream_ == nullptr) return;
  DeviceGuard guard(device_);
  FSDP_CUDA_CHECK_LOG(cudaStreamDestroy(stream_));
  stream_ = nullptr;
}

// ---- CudaEvent

StatusOr<CudaEvent> CudaEvent::Create(int device, bool timing) {
  DeviceGuard guard(device);
  CudaEvent e;
  FSDP_CUDA_CHECK(
      cudaEventCreateWithFlags(&e.event_, timing ? cudaEventDefault : cudaEventDisableTiming));
  e.device_ = device;
  return e;
}

CudaEvent::~CudaEvent() { Reset(); }

CudaEvent::CudaEvent(CudaEvent&& other) noexcept
    : event_(std::exchange(other.event_, nullptr)), device_(other.device_) {}

CudaEvent& CudaEvent::operator=(CudaEvent&& other) noexcept {
  if (this != &other) {
    Reset();
    event_ = std::exchange(other.event_, nullptr);
    device_ = other.device_;
  }
  return *this;
}

void CudaEvent::Reset() noexcept {
  if (event_ == nullptr) return;
  DeviceGuard guard(device_);
  FSDP_CUDA_CHECK_LOG(cudaEventDestroy(event_));
  event_ = nullptr;
}

Status CudaEvent::Record(cudaStream_t stream) {
  FSDP_CUDA_CHECK(cudaEventRecord(event_, stream));
  return Status::Ok();
}

Status CudaEvent::WaitOn(cudaStream_t stream) const {
  FSDP_CUDA_CHECK(cudaStreamWaitEvent(stream, event_, 0));
  return Status::Ok();
}

StatusOr<bool> CudaEvent::Query() const {
  const cudaError_t err = cudaEventQuery(event_);
  if (err == cudaSuccess) return true;
  if (err == cudaErrorNotReady) {
    (void)cudaGetLastError();  // not an error: clear it so later checks do not see it
    return false;
  }
  return CudaError(err, "cudaEventQuery(event)", __FILE__, __LINE__);
}

StatusOr<float> CudaEvent::ElapsedMsSince(const CudaEvent& start) const {
  float ms = 0;
  FSDP_CUDA_CHECK(cudaEventElapsedTime(&ms, start.event_, event_));
  return ms;
}

// ---- DeviceBuffer

StatusOr<DeviceBuffer> DeviceBuffer::Allocate(int device, std::size_t bytes) {
  DeviceGuard guard(device);
  DeviceBuffer b;
  b.device_ = device;
  b.bytes_ = bytes;
  if (bytes > 0) FSDP_CUDA_CHECK(cudaMalloc(&b.ptr_, bytes));
  return b;
}

StatusOr<DeviceBuffer> DeviceBuffer::AllocateOn(int device, std::size_t bytes,
                                                cudaStream_t stream) {
  DeviceGuard guard(device);
  DeviceBuffer b;
  b.device_ = device;
  b.bytes_ = bytes;
  b.stream_ordered_ = true;
  if (bytes > 0) FSDP_CUDA_CHECK(cudaMallocAsync(&b.ptr_, bytes, stream));
  return b;
}

Status DeviceBuffer::FreeOn(cudaStream_t stream) {
  if (ptr_ == nullptr) return Status::Ok();
  DeviceGuard guard(device_);
  void* p = std::exchange(ptr_, nullptr);
  bytes_ = 0;
  FSDP_CUDA_CHECK(cudaFreeAsync(p, stream));
  return Status::Ok();
}

DeviceBuffer::~DeviceBuffer() { Reset(); }

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : ptr_(std::exchange(other.ptr_, nullptr)),
      bytes_(std::exchange(other.bytes_, 0)),
      device_(other.device_),
      stream_ordered_(other.stream_ordered_) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    Reset();
    ptr_ = std::exchange(other.ptr_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
    device_ = other.device_;
    stream_ordered_ = other.stream_ordered_;
  }
  return *this;
}

void DeviceBuffer::Reset() noexcept {
  if (ptr_ == nullptr) return;
  DeviceGuard guard(device_);
  // A stream-ordered buffer still held at destruction: the device is synchronised first so no
  // stream can still be using it.
  if (stream_ordered_) {
    FSDP_CUDA_CHECK_LOG(cudaDeviceSynchronize());
    FSDP_CUDA_CHECK_LOG(cudaFreeAsync(ptr_, nullptr));
  } else {
    FSDP_CUDA_CHECK_LOG(cudaFree(ptr_));
  }
  ptr_ = nullptr;
  bytes_ = 0;
}

// ---- NcclComm

StatusOr<std::vector<NcclComm>> NcclComm::CreateAll(const std::vector<int>& devices) {
  std::vector<ncclComm_t> raw(devices.size(), nullptr);
  FSDP_NCCL_CHECK(ncclCommInitAll(raw.data(), static_cast<int>(devices.size()), devices.data()));
  std::vector<NcclComm> comms(devices.size());
  for (std::size_t i = 0; i < devices.size(); ++i) {
    comms[i].comm_ = raw[i];
    comms[i].device_ = devices[i];
    comms[i].rank_ = static_cast<int>(i);
  }
  return comms;
}

StatusOr<NcclComm> NcclComm::CreateRank(int device, int world_size, int rank,
                                        const ncclUniqueId& id) {
  DeviceGuard guard(device);
  NcclComm c;
  FSDP_NCCL_CHECK(ncclCommInitRank(&c.comm_, world_size, id, rank));
  c.device_ = device;
  c.rank_ = rank;
  return c;
}

StatusOr<std::vector<NcclComm>> NcclComm::Split(std::span<const NcclComm> parents,
                                                std::span<const int> colors,
                                                std::span<const int> keys) {
  if (colors.size() != parents.size() || keys.size() != parents.size()) {
    return InternalError("NcclComm::Split: one color and one key per parent communicator");
  }
  std::vector<ncclComm_t> raw(parents.size(), nullptr);
  FSDP_NCCL_CHECK(ncclGroupStart());
  for (std::size_t i = 0; i < parents.size(); ++i) {
    DeviceGuard guard(parents[i].device_);
    const ncclResult_t res =
        ncclCommSplit(parents[i].comm_, colors[i], keys[i], &raw[i], /*config=*/nullptr);
    if (res != ncclSuccess) {
      (void)ncclGroupEnd();
      return NcclError(res, fmt::format("ncclCommSplit(color {}, key {})", colors[i], keys[i]),
                       __FILE__, __LINE__);
    }
  }
  FSDP_NCCL_CHECK(ncclGroupEnd());
  std::vector<NcclComm> out(parents.size());
  for (std::size_t i = 0; i < parents.size(); ++i) {
    out[i].comm_ = raw[i];
    out[i].device_ = parents[i].device_;
    out[i].rank_ = parents[i].rank_;
  }
  return out;
}

NcclComm::~NcclComm() { Reset(); }

NcclComm::NcclComm(NcclComm&& other) noexcept
    : comm_(std::exchange(other.comm_, nullptr)), device_(other.device_), rank_(other.rank_) {}

NcclComm& NcclComm::operator=(NcclComm&& other) noexcept {
  if (this != &other) {
    Reset();
    comm_ = std::exchange(other.comm_, nullptr);
    device_ = other.device_;
    rank_ = other.rank_;
  }
  return *this;
}

Status NcclComm::AsyncError() const {
  if (comm_ == nullptr) return Status::Ok();
  ncclResult_t async = ncclSuccess;
  FSDP_NCCL_CHECK(ncclCommGetAsyncError(comm_, &async));
  if (async != ncclSuccess && async != ncclInProgress) {
    return NcclError(async, fmt::format("communicator of rank {} (asynchronous error)", rank_),
                     __FILE__, __LINE__);
  }
  return Status::Ok();
}

void NcclComm::Abort() noexcept {
  if (comm_ == nullptr) return;
  DeviceGuard guard(device_);
  FSDP_NCCL_CHECK_LOG(ncclCommAbort(comm_));
  comm_ = nullptr;
}

void NcclComm::Reset() noexcept {
  if (comm_ == nullptr) return;
  DeviceGuard guard(device_);
  FSDP_NCCL_CHECK_LOG(ncclCommDestroy(comm_));
  comm_ = nullptr;
}

// ---- CublasHandle

StatusOr<CublasHandle> CublasHandle::Create(int device, cudaStream_t stream) {
  DeviceGuard guard(device);
  CublasHandle h;
  FSDP_CUBLAS_CHECK(cublasCreate(&h.handle_));
  h.device_ = device;
  FSDP_CUBLAS_CHECK(cublasSetStream(h.handle_, stream));
  return h;
}

CublasHandle::~CublasHandle() { Reset(); }

CublasHandle::CublasHandle(CublasHandle&& other) noexcept
    : handle_(std::exchange(other.handle_, nullptr)), device_(other.device_) {}

CublasHandle& CublasHandle::operator=(CublasHandle&& other) noexcept {
  if (this != &other) {
    Reset();
    handle_ = std::exchange(other.handle_, nullptr);
    device_ = other.device_;
  }
  return *this;
}

void CublasHandle::Reset() noexcept {
  if (handle_ == nullptr) return;
  DeviceGuard guard(device_);
  FSDP_CUBLAS_CHECK_LOG(cublasDestroy(handle_));
  handle_ = nullptr;
}

}  // namespace fsdplab::cuda
