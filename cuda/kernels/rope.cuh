// rope.cuh: rotary position embedding, the CPU backend's convention
// (model_cpu.h): rotate-half pairs (i, i + D/2) of each head, angle =
// pos * inv_freq[i] in double with inv_freq[i] = theta^(-2i/D) computed on the
// host in double, cos and sin rounded to float, (x0, x1) -> (x0 c - x1 s,
// x1 c + x0 s) rounded in float32 (no fused multiply-add).
#ifndef LOCKSTEP_CUDA_ROPE_CUH
#define LOCKSTEP_CUDA_ROPE_CUH

#include <cuda_runtime.h>

#include <cstdint>

namespace lockstep {

// In place on x[r * stride + h * head_stride + i] (head_stride 0: D) for
// rows r < rows, heads h < heads, i < D, at position pos[r]. inv_freq is a
// device array of D/2 doubles. mag multiplies cos and sin in double before
// their rounding (YaRN's magnitude on MLA shapes; 1 leaves them exact).
void rope(float* x, int64_t stride, int32_t heads, int32_t head_dim, const int32_t* pos,
          const double* inv_freq, int64_t rows, cudaStream_t stream, int64_t head_stride = 0, double mag = 1.0);

}  // namespace lockstep

#endif  // LOCKSTEP_CUDA_ROPE_CUH
