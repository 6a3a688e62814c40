// fi_internal.cuh: the FlashInfer instantiations the engine uses, shared by
// flashinfer_attn.cu (planning, dispatch) and the instantiation units
// (fi_decode_d*.cu, the generated fi_prefill_d*_q*.cu): bf16 everywhere,
// int32 indices, no positional encoding in the kernel (RoPE is applied
// before), no custom mask / sliding window / soft cap / ALiBi, causal prefill.
// Each kernel is compiled in exactly one unit, so that the units build in
// parallel and nothing is compiled twice.
#ifndef LOCKSTEP_CUDA_FI_INTERNAL_CUH
#define LOCKSTEP_CUDA_FI_INTERNAL_CUH

#include <cuda_bf16.h>

#include <flashinfer/attention/default_decode_params.cuh>
#include <flashinfer/attention/default_prefill_params.cuh>
#include <flashinfer/attention/scheduler.cuh>
#include <flashinfer/attention/variants.cuh>

namespace lockstep {
namespace fi {

using bf16 = __nv_bfloat16;
using Variant = flashinfer::DefaultAttention</*use_custom_mask=*/false, /*use_sliding_window=*/false,
                                             /*use_logits_soft_cap=*/false, /*use_alibi=*/false>;
using DecodeParams = flashinfer::BatchDecodeParams<bf16, bf16, bf16, int32_t>;
using PrefillParams = flashinfer::BatchPrefillPagedParams<bf16, bf16, bf16, int32_t>;
constexpr auto kNoPosEnc = flashinfer::PosEncodingMode::kNone;

// Decode plan (host; the work estimation needs the kernel, so it lives in the
// same unit as the run) and run, for head dim D (fi_decode_d<D>.cu).
template <int D>
cudaError_t decode_plan(void* float_ws, size_t float_bytes, void* int_ws, void* int_ws_host, size_t int_bytes,
                        flashinfer::DecodePlanInfo& info, int32_t* indptr_h, uint32_t batch,
                        uint32_t num_qo_heads, uint32_t num_kv_heads, uint32_t page_size, bool cuda_graph,
                        cudaStream_t stream);
template <int D>
cudaError_t decode_run(DecodeParams params, bf16* tmp_v, float* tmp_s, cudaStream_t stream);

// Paged prefill, causal, for head dim D and query tile CTA (FlashInfer's
// plan picks the tile: 16, 64 or 128).
template <int D, int CTA>
cudaError_t prefill_run(PrefillParams params, bf16* tmp_v, float* tmp_s, cudaStream_t stream);

// The instantiations (defined in their own units).
extern template cudaError_t decode_plan<64>(void*, size_t, void*, void*, size_t, flashinfer::DecodePlanInfo&,
                                            int32_t*, uint32_t, uint32_t, uint32_t, uint32_t, bool, cudaStream_t);
extern template cudaError_t decode_plan<128>(void*, size_t, void*, void*, size_t, flashinfer::DecodePlanInfo&,
                                             int32_t*, uint32_t, uint32_t, uint32_t, uint32_t, bool, cudaStream_t);
extern template cudaError_t decode_run<64>(DecodeParams, bf16*, float*, cudaStream_t);
extern template cudaError_t decode_run<128>(DecodeParams, bf16*, float*, cudaStream_t);
#define LOCKSTEP_FI_PREFILL(D, CTA) \
  template <>                       \
  cudaError_t prefill_run<D, CTA>(PrefillParams, bf16*, float*, cudaStream_t);
LOCKSTEP_FI_PREFILL(64, 16)
LOCKSTEP_FI_PREFILL(64, 64)
LOCKSTEP_FI_PREFILL(64, 128)
LOCKSTEP_FI_PREFILL(128, 16)
LOCKSTEP_FI_PREFILL(128, 64)
LOCKSTEP_FI_PREFILL(128, 128)
#undef LOCKSTEP_FI_PREFILL

}  // namespace fi
}  // namespace lockstep

#endif  // LOCKSTEP_CUDA_FI_INTERNAL_CUH
