// weights_gen.cuh: the synthetic model's weights generated on the device,
// element for element the values of the CPU backend's generator
// (native/src/weights.h: splitmix64 keyed by (seed, tensor id, index),
// u = (h >> 40) * 2^-23 - 1, then bias + u * scale in float32), rounded to the
// storage type. Matrices are stored bf16, norm gains float32.
#ifndef LOCKSTEP_CUDA_WEIGHTS_GEN_CUH
#define LOCKSTEP_CUDA_WEIGHTS_GEN_CUH

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace lockstep {

// One generated tensor placed in a (possibly wider) destination matrix:
// element (i, o) of the rows x cols tensor -- generator index i * cols + o --
// goes to dst[i * ld + col_off + o]. This is how the fused QKV and gate/up
// matrices are built from the CPU's separate tensors.
struct GenTensor {
  uint64_t seed = 0;
  uint64_t tensor_id = 0;  // lockstep::tensor_id(kind, layer)
  int64_t rows = 0, cols = 0;
  int64_t ld = 0, col_off = 0;
  float scale = 1.0f;      // value = bias + u * scale
  float bias = 0.0f;
};

void generate_bf16(const GenTensor& t, __nv_bfloat16* dst, cudaStream_t stream);
void generate_f32(const GenTensor& t, float* dst, cudaStream_t stream);

}  // namespace lockstep

#endif  // LOCKSTEP_CUDA_WEIGHTS_GEN_CUH
