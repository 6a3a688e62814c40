// weights_gen.cu: see weights_gen.cuh. The arithmetic repeats weights.h's
// inline functions on the device; keep them in step.
#include "../cuda_check.h"
#include "weights_gen.cuh"

namespace lockstep {
namespace {

__device__ inline uint64_t splitmix64_d(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

template <class T>
__device__ inline T convert(float v);
template <>
__device__ inline float convert<float>(float v) { return v; }
template <>
__device__ inline __nv_bfloat16 convert<__nv_bfloat16>(float v) { return __float2bfloat16(v); }

template <class T>
__global__ void generate_kernel(GenTensor t, T* dst) {
  const uint64_t key = splitmix64_d(t.seed ^ splitmix64_d(t.tensor_id));
  const int64_t n = t.rows * t.cols;
  for (int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; idx < n;
       idx += int64_t(gridDim.x) * blockDim.x) {
    const uint64_t h = splitmix64_d(key + uint64_t(idx));
    const float u = __fsub_rn(__fmul_rn(float(h >> 40), 1.0f / 8388608.0f), 1.0f);
    // bias + u * scale as two roundings, like the CPU (u * scale is exact
    // for the norms' power-of-two scale, so bias + u*scale matches too).
    const float v = __fadd_rn(t.bias, __fmul_rn(u, t.scale));
    const int64_t i = idx / t.cols, o = idx % t.cols;
    dst[i * t.ld + t.col_off + o] = convert<T>(v);
  }
}

template <class T>
void launch(const GenTensor& t, T* dst, cudaStream_t stream) {
  const int64_t n = t.rows * t.cols;
  if (n == 0) return;
  const int64_t blocks = (n + 255) / 256;
  generate_kernel<T><<<unsigned(blocks < 65535 * 16 ? blocks : 65535 * 16), 256, 0, stream>>>(t, dst);
  CUDA_CHECK_LAUNCH();
}

}  // namespace

void generate_bf16(const GenTensor& t, __nv_bfloat16* dst, cudaStream_t stream) {
  launch(t, dst, stream);
}
void generate_f32(const GenTensor& t, float* dst, cudaStream_t stream) { launch(t, dst, stream); }

}  // namespace lockstep
