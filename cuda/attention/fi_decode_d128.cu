// fi_decode_d128.cu: FlashInfer paged decode, head dim 128 (see fi_internal.cuh).
#include "fi_decode.cuh"

namespace lockstep {
namespace fi {
template cudaError_t decode_plan<128>(void*, size_t, void*, void*, size_t, flashinfer::DecodePlanInfo&, int32_t*,
                                     uint32_t, uint32_t, uint32_t, uint32_t, bool, cudaStream_t);
template cudaError_t decode_run<128>(DecodeParams, bf16*, float*, cudaStream_t);
}  // namespace fi
}  // namespace lockstep
