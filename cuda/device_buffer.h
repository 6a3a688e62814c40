// device_buffer.h: RAII owners of device and pinned host memory.
#ifndef LOCKSTEP_CUDA_DEVICE_BUFFER_H
#define LOCKSTEP_CUDA_DEVICE_BUFFER_H

#include <cuda_runtime_api.h>

#include <cstddef>
#include <string>
#include <utility>

#include "cuda_check.h"

namespace lockstep {

// Device memory from cudaMalloc. Grows on demand (reserve) and never shrinks,
// so per-step scratch is allocated once in steady state. Not thread-safe: the
// backend is driven by one thread.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes) { reserve(bytes); }
  ~DeviceBuffer() { if (ptr_) cudaFree(ptr_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(std::exchange(o.ptr_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    std::swap(ptr_, o.ptr_);
    std::swap(bytes_, o.bytes_);
    return *this;
  }

  // Ensures capacity for `bytes`; the old contents are lost when it grows.
  // The caller must make sure no queued work still uses the old memory
  // (cudaFree synchronises the device, so this holds).
  void reserve(size_t bytes) {
    if (bytes <= bytes_) return;
    if (ptr_) CUDA_CHECK(cudaFree(ptr_));
    ptr_ = nullptr;
    bytes_ = 0;
    const cudaError_t err = cudaMalloc(&ptr_, bytes);
    if (err != cudaSuccess) {
      cudaGetLastError();  // an allocation failure is not sticky; clear it
      throw EngineError(err == cudaErrorMemoryAllocation ? ENG_OUT_OF_MEMORY : ENG_DEVICE_ERROR,
                        "cudaMalloc of " + std::to_string(bytes >> 20) + " MiB failed: " +
                            cudaGetErrorString(err));
    }
    bytes_ = bytes;
  }
  template <class T>
  T* as() const { return static_cast<T*>(ptr_); }
  size_t bytes() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

// Page-locked host memory from cudaHostAlloc: the only host memory an
// asynchronous copy really overlaps with device work.
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  ~PinnedBuffer() { if (ptr_) cudaFreeHost(ptr_); }
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;

  void reserve(size_t bytes) {
    if (bytes <= bytes_) return;
    if (ptr_) CUDA_CHECK(cudaFreeHost(ptr_));
    ptr_ = nullptr;
    bytes_ = 0;
    const cudaError_t err = cudaHostAlloc(&ptr_, bytes, cudaHostAllocDefault);
    if (err != cudaSuccess) {
      cudaGetLastError();
      throw EngineError(ENG_OUT_OF_MEMORY, "cudaHostAlloc of " + std::to_string(bytes >> 20) +
                                               " MiB of pinned host memory failed: " +
                                               cudaGetErrorString(err));
    }
    bytes_ = bytes;
  }
  template <class T>
  T* as() const { return static_cast<T*>(ptr_); }
  size_t bytes() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

// A CUDA stream (non-blocking) owned for the object's lifetime. As a member
// it is destroyed even when the owner's constructor throws later on (a raw
// handle would leak then).
class CudaStream {
 public:
  CudaStream() { CUDA_CHECK(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking)); }
  ~CudaStream() { if (s_) cudaStreamDestroy(s_); }
  CudaStream(const CudaStream&) = delete;
  CudaStream& operator=(const CudaStream&) = delete;
  cudaStream_t get() const { return s_; }

 private:
  cudaStream_t s_ = nullptr;
};

// A CUDA event (timing enabled) owned for the object's lifetime.
class CudaEvent {
 public:
  CudaEvent() { CUDA_CHECK(cudaEventCreate(&e_)); }
  ~CudaEvent() { if (e_) cudaEventDestroy(e_); }
  CudaEvent(const CudaEvent&) = delete;
  CudaEvent& operator=(const CudaEvent&) = delete;
  cudaEvent_t get() const { return e_; }

 private:
  cudaEvent_t e_ = nullptr;
};

}  // namespace lockstep

#endif  // LOCKSTEP_CUDA_DEVICE_BUFFER_H
