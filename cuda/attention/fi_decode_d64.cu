// fi_decode_d64.cu: FlashInfer paged decode, head dim 64 (see fi_internal.cuh).
#include "fi_decode.cuh"

namespace lockstep {
namespace fi {
template cudaError_t decode_plan<64>(void*, size_t, void*, void*, size_t, flashinfer::DecodePlanInfo&, int32_t*,
                                     uint32_t, uint32_t, uint32_t, uint32_t, bool, cudaStream_t);
template cudaError_t decode_run<64>(DecodeParams, bf16*, float*, cudaStream_t);
}  // namespace fi
}  // namespace lockstep
