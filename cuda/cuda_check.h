// cuda_check.h: error handling for the CUDA backend.
//
// Every CUDA runtime, cuBLAS and NCCL call goes through one of the *_CHECK
// macros. A failure throws lockstep::EngineError with ENG_DEVICE_ERROR (or
// ENG_OUT_OF_MEMORY for an allocation that does not fit, ENG_COMM_ERROR for
// NCCL) and a message naming the call, the file and line, and the CUDA error.
// engine.cpp turns it into the call's status and last-error string; the CUDA
// backend additionally remembers a sticky device error and refuses further
// work (DESIGN.md §4: a sticky CUDA error is fatal).
#ifndef LOCKSTEP_CUDA_CHECK_H
#define LOCKSTEP_CUDA_CHECK_H

#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdint>
#include <string>

#include "status.h"

namespace lockstep {

// Throws EngineError for a failed CUDA runtime call; `what` is the call text.
[[noreturn]] inline void throw_cuda_error(cudaError_t err, const char* what, const char* file,
                                          int line) {
  const eng_status status =
      err == cudaErrorMemoryAllocation ? ENG_OUT_OF_MEMORY : ENG_DEVICE_ERROR;
  throw EngineError(status, std::string("CUDA error at ") + file + ":" + std::to_string(line) +
                                ": " + what + ": " + cudaGetErrorName(err) + " (" +
                                cudaGetErrorString(err) + ")");
}

}  // namespace lockstep

#define CUDA_CHECK(call)                                                            \
  do {                                                                              \
    const cudaError_t lockstep_err_ = (call);                                       \
    if (lockstep_err_ != cudaSuccess)                                               \
      ::lockstep::throw_cuda_error(lockstep_err_, #call, __FILE__, __LINE__);       \
  } while (0)

// After a kernel launch: reports a bad launch configuration at once. (An
// asynchronous fault inside the kernel surfaces at the next synchronising call,
// which is checked too.) Define LOCKSTEP_CUDA_SYNC_CHECK to also synchronise
// after every launch, so that a fault is attributed to the kernel that caused it.
#ifdef LOCKSTEP_CUDA_SYNC_CHECK
#define CUDA_CHECK_LAUNCH()                     \
  do {                                          \
    CUDA_CHECK(cudaGetLastError());             \
    CUDA_CHECK(cudaDeviceSynchronize());        \
  } while (0)
#else
#define CUDA_CHECK_LAUNCH() CUDA_CHECK(cudaGetLastError())
#endif

namespace lockstep {

// Runs configure() once per device for one call site (`done` is that site's
// static bitmask of devices already configured). Function attributes such as
// cudaFuncAttributeMaxDynamicSharedMemorySize belong to a device's context,
// so a process driving several GPUs (in-process ranks) must set them on each;
// configure() is idempotent, so two threads racing here are harmless.
template <class Configure>
void once_per_device(std::atomic<uint64_t>& done, Configure&& configure) {
  int dev = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  const uint64_t bit = dev < 64 ? uint64_t{1} << dev : 0;
  if (bit != 0 && (done.load(std::memory_order_acquire) & bit)) return;
  configure();
  done.fetch_or(bit, std::memory_order_release);
}

}  // namespace lockstep

#endif  // LOCKSTEP_CUDA_CHECK_H
