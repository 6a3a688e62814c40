// kv_append.cuh: writes the new tokens' K and V (float32 rows, RoPE already
// applied to K) into their page slots as bf16.
#ifndef LOCKSTEP_CUDA_KV_APPEND_CUH
#define LOCKSTEP_CUDA_KV_APPEND_CUH

#include "attn_common.cuh"

namespace lockstep {

// Row r goes to slot row_slot[r] of page row_page[r] of layer kv.layer:
// K from k[r * stride + h * D + d], V from v[r * stride + h * D + d].
// Rows write disjoint slots (engine.cpp rejects batches that would not). A
// row with row_page[r] < 0 (a decode graph's padding row) writes nothing.
void kv_append(const PagedKV& kv, const float* k, const float* v, int64_t stride,
               const int32_t* row_page, const int32_t* row_slot, int64_t rows,
               cudaStream_t stream);

}  // namespace lockstep

#endif  // LOCKSTEP_CUDA_KV_APPEND_CUH
