// model_cuda_internal.h: what the CUDA backend's units share (model_cuda.cu,
// moe_cuda.cu, helix_cuda.cu, mla_cuda.cu): element pointers into device
// buffers, the generated-tensor descriptor, the guard of every entry point,
// and the NCCL bootstrap through an exchange group. Not part of any ABI.
#ifndef LOCKSTEP_CUDA_MODEL_CUDA_INTERNAL_H
#define LOCKSTEP_CUDA_MODEL_CUDA_INTERNAL_H

#include <cmath>
#include <cstdint>
#include <memory>
#include <string>

#include "cp_group.h"
#include "kernels/weights_gen.cuh"
#include "model_cuda.h"

namespace lockstep {
namespace cuda_internal {

template <class T>
inline T* at(const DeviceBuffer& b, size_t off_elems = 0) { return b.as<T>() + off_elems; }

inline size_t round_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

// A generated rows x cols tensor (weights_gen.cuh) placed at column col_off
// of rows of ld: u / sqrt(fan_in), or a norm gain 1 + u/8 when fan_in is 0
// (the CPU generator's values, weights.cpp).
inline GenTensor gen_tensor(uint64_t seed, uint64_t id, int64_t rows, int64_t cols, int64_t ld, int64_t col_off,
                            int64_t fan_in) {
  GenTensor t;
  t.seed = seed;
  t.tensor_id = id;
  t.rows = rows;
  t.cols = cols;
  t.ld = ld;
  t.col_off = col_off;
  if (fan_in == 0) {
    t.scale = 0.125f;
    t.bias = 1.0f;
  } else {
    t.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(fan_in)));
  }
  return t;
}

#ifdef ENGINE_HAVE_NCCL
// An NCCL communicator over the members of `group` on this engine's device
// and stream: member 0's unique id reaches the others through the group's
// own exchange (tag `tag`), each opens a non-blocking communicator with
// bounded waits (timeout_ms). `what` names the group in errors.
std::unique_ptr<NcclComm> open_group_nccl(Exchange* group, const ExchangeTag& tag, int device, cudaStream_t stream,
                                          int timeout_ms, const char* what);
#endif

}  // namespace cuda_internal

template <class Body>
void CudaBackend::guarded(const char* what, Body&& body) {
  if (!broken_.empty())
    throw EngineError(ENG_DEVICE_ERROR, std::string("CUDA backend unusable after an earlier device error (") +
                                            broken_ + "); " + what + " refused: restart the worker");
  CUDA_CHECK(cudaSetDevice(device_));
  try {
    body();
  } catch (const EngineError& e) {
    if (e.status() == ENG_DEVICE_ERROR) broken_ = e.what();
    throw;
  }
}


}  // namespace lockstep

#endif  // LOCKSTEP_CUDA_MODEL_CUDA_INTERNAL_H
