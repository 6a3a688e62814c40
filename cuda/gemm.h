// gemm.h: the model's matrix products through cuBLAS, bf16 operands with
// float32 accumulation and float32 output.
//
// Every weight is stored input-major, W[i * out + o] (native/src/weights.h),
// and activations are row-major [rows][in], so Y = X · W is, in cuBLAS's
// column-major terms, Y^T (out x rows) = W^T (out x in) · X^T (in x rows)
// with no transposes: m = out, n = rows, k = in, lda = out, ldb = in, ldc = out.
#ifndef LOCKSTEP_CUDA_GEMM_H
#define LOCKSTEP_CUDA_GEMM_H

#include <cublas_v2.h>
#include <cuda_bf16.h>

#include <cstdint>

#include "device_buffer.h"

namespace lockstep {

class Gemm {
 public:
  // Creates the cuBLAS handle bound to stream (on the current device).
  explicit Gemm(cudaStream_t stream);
  ~Gemm();
  Gemm(const Gemm&) = delete;
  Gemm& operator=(const Gemm&) = delete;

  // Y[rows][out] = X[rows][in] · W[in][out] + beta * Y. beta = 1 fuses the
  // residual add into the product (Y is the hidden state).
  void bf16_f32(const __nv_bfloat16* X, int64_t rows, int64_t in, const __nv_bfloat16* W,
                int64_t out, float* Y, float beta);
  // One product per head (MLA's absorptions): for h < batch,
  //   Y_h[rows][out] = X_h[rows][in] · W_h[in][out],
  // with X_h row r at X + h * x_head + r * x_row, W_h = W + h * in * out
  // (packed input-major), Y_h row r at Y + h * y_head + r * y_row.
  void bf16_f32_heads(const __nv_bfloat16* X, int64_t x_row, int64_t x_head, int64_t rows, int64_t in,
                      const __nv_bfloat16* W, int64_t out, float* Y, int64_t y_row, int64_t y_head, int64_t batch);

 private:
  static constexpr size_t kWorkspaceBytes = size_t(32) << 20;  // cuBLAS's recommendation for sm_90
  DeviceBuffer workspace_;  // declared before the handle: freed after it
  cublasHandle_t handle_ = nullptr;
};

}  // namespace lockstep

#endif  // LOCKSTEP_CUDA_GEMM_H
