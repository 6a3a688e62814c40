// fi_mla.cu: see fi_mla.h. The one instantiation of FlashInfer's MLA kernel
// (causal, latent 512, rope 64, bf16 q/kv/o, int32 indices).
#include "fi_mla.h"

#include <string>

#include <flashinfer/attention/mla.cuh>
#include <flashinfer/attention/scheduler.cuh>

#include "../cuda_check.h"
#include "../device_buffer.h"

namespace lockstep {
namespace {

using bf16 = __nv_bfloat16;
using MlaParams = flashinfer::MLAParams<bf16, bf16, bf16, int32_t>;
constexpr size_t kFloatWorkspace = size_t(128) << 20;  // split-KV partials
constexpr size_t kIntWorkspace = size_t(8) << 20;

template <class Call>
void mla_call(const char* what, Call&& call) {
  cudaError_t err;
  try {
    err = call();
  } catch (const std::exception& e) {
    throw EngineError(ENG_INTERNAL, std::string("FlashInfer MLA ") + what + ": " + e.what());
  }
  if (err != cudaSuccess)
    throw EngineError(err == cudaErrorMemoryAllocation ? ENG_OUT_OF_MEMORY : ENG_DEVICE_ERROR,
                      std::string("FlashInfer MLA ") + what + ": " + cudaGetErrorName(err) + " (" +
                          cudaGetErrorString(err) + ")");
}

}  // namespace

struct FlashInferMla::Impl {
  int32_t heads, page_size;
  int64_t page_elems;
  cudaStream_t stream;
  DeviceBuffer float_ws, int_ws, dev_list;
  PinnedBuffer int_ws_host, host_list;
  FiMlaList list;
  flashinfer::MLAPlanInfo info{};
  template <class T>
  T* iws(int64_t off) const { return reinterpret_cast<T*>(int_ws.as<char>() + off); }
};

FlashInferMla::FlashInferMla(int32_t num_heads, int32_t page_size, int64_t page_elems, cudaStream_t stream)
    : impl_(std::make_unique<Impl>()) {
  if (page_elems > int64_t(UINT32_MAX))
    throw EngineError(ENG_UNSUPPORTED, "FlashInfer MLA: a page of " + std::to_string(page_elems) +
                                           " elements exceeds its 32-bit page stride");
  Impl& m = *impl_;
  m.heads = num_heads;
  m.page_size = page_size;
  m.page_elems = page_elems;
  m.stream = stream;
  m.float_ws.reserve(kFloatWorkspace);
  m.int_ws.reserve(kIntWorkspace);
  m.int_ws_host.reserve(kIntWorkspace);
}

FlashInferMla::~FlashInferMla() = default;

void FlashInferMla::plan(const FiSeq* decode, int32_t nd, const FiSeq* chunks, int32_t nc) {
  Impl& m = *impl_;
  m.list = size_fi_mla_list(decode, nd, chunks, nc, m.page_size);
  const size_t bytes = m.list.total * sizeof(int32_t);
  m.host_list.reserve(bytes);
  m.dev_list.reserve(bytes);
  int32_t* h = m.host_list.as<int32_t>();
  fill_fi_mla_list(decode, nd, chunks, nc, m.page_size, m.list, h);
  CUDA_CHECK(cudaMemcpyAsync(m.dev_list.as<void>(), h, bytes, cudaMemcpyHostToDevice, m.stream));
  if (m.list.batch == 0) return;
  size_t staged = 0;
  mla_call("plan", [&] {
    return flashinfer::MLAPlan<int32_t>(m.float_ws.as<void>(), kFloatWorkspace, m.int_ws.as<void>(),
                                        m.int_ws_host.as<void>(), kIntWorkspace, m.info, staged,
                                        h + m.list.off_qo_indptr, h + m.list.off_kv_indptr, h + m.list.off_kv_len,
                                        uint32_t(m.list.batch), uint32_t(m.heads), uint32_t(kLatent),
                                        /*causal=*/true, m.stream);
  });
  // The plan is staged in the page-locked twin; the kernel reads the device one.
  CUDA_CHECK(cudaMemcpyAsync(m.int_ws.as<void>(), m.int_ws_host.as<void>(), staged, cudaMemcpyHostToDevice,
                             m.stream));
}

void FlashInferMla::run(const __nv_bfloat16* slab, int32_t layer, const __nv_bfloat16* q_nope,
                        const __nv_bfloat16* q_pe, int64_t q_stride_n, int64_t q_stride_h, float sm_scale,
                        __nv_bfloat16* out) {
  Impl& m = *impl_;
  if (m.list.batch == 0) return;
  const FiMlaView v = fi_mla_view(layer, m.page_size, kLatent, kRope, m.page_elems);
  bf16* base = const_cast<bf16*>(slab);
  const flashinfer::MLAPlanInfo& info = m.info;
  MlaParams p{};
  p.q_nope = const_cast<bf16*>(q_nope);
  p.q_pe = const_cast<bf16*>(q_pe);
  p.ckv = base + v.ckv_offset;
  p.kpe = base + v.kpe_offset;
  p.q_indptr = m.iws<int32_t>(info.q_indptr_offset);
  p.kv_indptr = m.iws<int32_t>(info.kv_indptr_offset);
  p.partial_indptr = m.iws<int32_t>(info.partial_indptr_offset);
  p.kv_indices = m.dev_list.as<int32_t>() + m.list.off_indices;
  p.q_len = m.iws<int32_t>(info.q_len_offset);
  p.kv_len = m.iws<int32_t>(info.kv_len_offset);
  p.q_start = m.iws<int32_t>(info.q_start_offset);
  p.kv_start = m.iws<int32_t>(info.kv_start_offset);
  p.kv_end = m.iws<int32_t>(info.kv_end_offset);
  p.work_indptr = m.iws<int32_t>(info.work_indptr_offset);
  p.merge_packed_offset_start = m.iws<int32_t>(info.merge_packed_offset_start_offset);
  p.merge_packed_offset_end = m.iws<int32_t>(info.merge_packed_offset_end_offset);
  p.merge_partial_packed_offset_start = m.iws<int32_t>(info.merge_partial_packed_offset_start_offset);
  p.merge_partial_packed_offset_end = m.iws<int32_t>(info.merge_partial_packed_offset_end_offset);
  p.merge_partial_stride = m.iws<int32_t>(info.merge_partial_stride_offset);
  p.final_o = out;
  p.final_lse = nullptr;
  p.partial_o = reinterpret_cast<bf16*>(m.float_ws.as<char>() + info.partial_o_offset);
  p.partial_lse = reinterpret_cast<float*>(m.float_ws.as<char>() + info.partial_lse_offset);
  p.num_heads = flashinfer::uint_fastdiv(uint32_t(m.heads));
  p.block_size = flashinfer::uint_fastdiv(uint32_t(m.page_size));
  p.q_nope_stride_n = uint32_t(q_stride_n);
  p.q_nope_stride_h = uint32_t(q_stride_h);
  p.q_pe_stride_n = uint32_t(q_stride_n);
  p.q_pe_stride_h = uint32_t(q_stride_h);
  p.ckv_stride_page = uint32_t(v.stride_page);
  p.ckv_stride_n = uint32_t(v.stride_n);
  p.kpe_stride_page = uint32_t(v.stride_page);
  p.kpe_stride_n = uint32_t(v.stride_n);
  p.o_stride_n = uint32_t(m.heads * kLatent);
  p.o_stride_h = uint32_t(kLatent);
  p.sm_scale = sm_scale;
  p.ckv_scale = 1.0f;
  p.kpe_scale = 1.0f;
  p.ckv_scale_arr = nullptr;
  p.return_lse_base_on_e = true;
  mla_call("run", [&] {
    return flashinfer::mla::BatchMLAPagedAttention<flashinfer::MaskMode::kCausal, kLatent, kRope>(
        p, uint32_t(info.num_blks_x), uint32_t(info.num_blks_y), m.stream);
  });
}

}  // namespace lockstep
