// gemm.cu: see gemm.h.
#include "gemm.h"

#include <string>

#include "cuda_check.h"

#define CUBLAS_CHECK(call)                                                                  \
  do {                                                                                      \
    const cublasStatus_t lockstep_st_ = (call);                                             \
    if (lockstep_st_ != CUBLAS_STATUS_SUCCESS)                                              \
      throw ::lockstep::EngineError(                                                        \
          lockstep_st_ == CUBLAS_STATUS_ALLOC_FAILED ? ENG_OUT_OF_MEMORY : ENG_DEVICE_ERROR, \
          std::string("cuBLAS error at " __FILE__ ":") + std::to_string(__LINE__) + ": " +  \
              #call + ": " + cublasGetStatusName(lockstep_st_));                            \
  } while (0)

namespace lockstep {

Gemm::Gemm(cudaStream_t stream) {
  CUBLAS_CHECK(cublasCreate(&handle_));
  try {
    CUBLAS_CHECK(cublasSetStream(handle_, stream));
    // Tensor-core algorithms are the default for bf16 inputs; keep the math
    // mode strict so that no reduced-precision accumulation is picked.
    CUBLAS_CHECK(cublasSetMathMode(handle_, CUBLAS_DEFAULT_MATH));
    // An explicit workspace (after cublasSetStream, which resets it): a
    // captured decode graph then uses the same memory and the same algorithm
    // choices as the eager path, instead of an allocation inside each capture.
    workspace_.reserve(kWorkspaceBytes);
    CUBLAS_CHECK(cublasSetWorkspace(handle_, workspace_.as<void>(), kWorkspaceBytes));
  } catch (...) {
    cublasDestroy(handle_);  // the destructor does not run for a throwing constructor
    handle_ = nullptr;
    throw;
  }
}

Gemm::~Gemm() {
  if (handle_) cublasDestroy(handle_);
}

void Gemm::bf16_f32(const __nv_bfloat16* X, int64_t rows, int64_t in, const __nv_bfloat16* W,
                    int64_t out, float* Y, float beta) {
  if (rows == 0) return;
  const float alpha = 1.0f;
  CUBLAS_CHECK(cublasGemmEx(handle_, CUBLAS_OP_N, CUBLAS_OP_N, int(out), int(rows), int(in), &alpha,
                            W, CUDA_R_16BF, int(out), X, CUDA_R_16BF, int(in), &beta, Y,
                            CUDA_R_32F, int(out), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

void Gemm::bf16_f32_heads(const __nv_bfloat16* X, int64_t x_row, int64_t x_head, int64_t rows, int64_t in,
                          const __nv_bfloat16* W, int64_t out, float* Y, int64_t y_row, int64_t y_head,
                          int64_t batch) {
  if (rows == 0 || batch == 0) return;
  const float alpha = 1.0f, beta = 0.0f;
  // Column-major, per head: Y_h^T (out x rows, ld y_row) = W_h^T (out x in,
  // ld out) · X_h^T (in x rows, ld x_row).
  CUBLAS_CHECK(cublasGemmStridedBatchedEx(handle_, CUBLAS_OP_N, CUBLAS_OP_N, int(out), int(rows), int(in), &alpha,
                                          W, CUDA_R_16BF, int(out), in * out, X, CUDA_R_16BF, int(x_row), x_head,
                                          &beta, Y, CUDA_R_32F, int(y_row), y_head, int(batch), CUBLAS_COMPUTE_32F,
                                          CUBLAS_GEMM_DEFAULT));
}

}  // namespace lockstep
