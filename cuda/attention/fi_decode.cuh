// fi_decode.cuh: the decode plan and run of one head dim (included by
// fi_decode_d64.cu and fi_decode_d128.cu only).
#ifndef LOCKSTEP_CUDA_FI_DECODE_CUH
#define LOCKSTEP_CUDA_FI_DECODE_CUH

#include <flashinfer/attention/decode.cuh>

#include "fi_internal.cuh"

namespace lockstep {
namespace fi {

template <int D>
cudaError_t decode_plan(void* float_ws, size_t float_bytes, void* int_ws, void* int_ws_host, size_t int_bytes,
                        flashinfer::DecodePlanInfo& info, int32_t* indptr_h, uint32_t batch,
                        uint32_t num_qo_heads, uint32_t num_kv_heads, uint32_t page_size, bool cuda_graph,
                        cudaStream_t stream) {
  cudaError_t status = cudaErrorInvalidValue;  // an unsupported group size
  DISPATCH_GQA_GROUP_SIZE(num_qo_heads / num_kv_heads, GROUP_SIZE, {
    auto work = flashinfer::BatchDecodeWithPagedKVCacheWorkEstimationDispatched<GROUP_SIZE, D, kNoPosEnc,
                                                                                 Variant, DecodeParams>;
    status = flashinfer::DecodePlan<D, kNoPosEnc, Variant, DecodeParams>(
        float_ws, float_bytes, int_ws, int_ws_host, int_bytes, info, indptr_h, batch, num_qo_heads,
        page_size, cuda_graph, stream, work);
  });
  return status;
}

template <int D>
cudaError_t decode_run(DecodeParams params, bf16* tmp_v, float* tmp_s, cudaStream_t stream) {
  return flashinfer::BatchDecodeWithPagedKVCacheDispatched<D, kNoPosEnc, Variant>(params, tmp_v, tmp_s,
                                                                                 /*enable_pdl=*/false, stream);
}

}  // namespace fi
}  // namespace lockstep

#endif  // LOCKSTEP_CUDA_FI_DECODE_CUH
