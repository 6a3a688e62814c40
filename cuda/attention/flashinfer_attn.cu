// flashinfer_attn.cu: see flashinfer_attn.h.
#include "flashinfer_attn.h"

#include <cmath>
#include <string>
#include <vector>

#include "../cuda_check.h"
#include "../device_buffer.h"
#include "fi_internal.cuh"

namespace lockstep {
namespace {

constexpr size_t kFloatWorkspace = size_t(256) << 20;  // split-KV partials (FlashInfer's default is 128 MiB)
constexpr size_t kIntWorkspace = size_t(8) << 20;      // one plan's index arrays

// Runs a FlashInfer call: its errors (a cudaError_t or a thrown
// flashinfer::Error) become EngineError naming the call.
template <class Call>
void fi_call(const char* what, Call&& call) {
  cudaError_t err;
  try {
    err = call();
  } catch (const std::exception& e) {
    throw EngineError(ENG_INTERNAL, std::string("FlashInfer ") + what + ": " + e.what());
  }
  if (err != cudaSuccess)
    throw EngineError(err == cudaErrorMemoryAllocation ? ENG_OUT_OF_MEMORY : ENG_DEVICE_ERROR,
                      std::string("FlashInfer ") + what + ": " + cudaGetErrorName(err) + " (" +
                          cudaGetErrorString(err) + ")");
}

// lse_e = lse_2 * ln 2 (FlashInfer's LSE is base 2; see the header).
__global__ void lse_to_natural(float* lse, int64_t n) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) lse[i] = lse_base2_to_natural(lse[i]);
}

static_assert(uint32_t(flashinfer::QKVLayout::kNHD) == uint32_t(FiKVLayout::kNHD) &&
                  uint32_t(flashinfer::QKVLayout::kHND) == uint32_t(FiKVLayout::kHND),
              "FiKVLayout must mirror flashinfer::QKVLayout");

}  // namespace

// Per-plan-kind state: the device int workspace and its page-locked host
// twin (FlashInfer plans into the host one and queues a copy to the device
// one, so each kind needs its own pair), and the plan itself.
struct PlanState {
  DeviceBuffer int_ws;
  PinnedBuffer int_ws_host;
  int32_t batch = 0;
  int64_t rows = 0;
};

struct FlashInferAttention::Impl {
  int32_t hq, hkv, d, page_size;
  int64_t page_elems;
  cudaStream_t stream;
  DeviceBuffer float_ws;
  PlanState dec, pre;
  flashinfer::DecodePlanInfo dec_info;
  flashinfer::PrefillPlanInfo pre_info;
  // Page lists of the step: built in pinned memory (fill_fi_lists), copied in
  // one transfer.
  PinnedBuffer host_lists;
  DeviceBuffer dev_lists;
  FiLists lists;  // this step's layout of host_lists / dev_lists (step_layout.h)
  uint64_t generation = 0;

  int32_t* dev(size_t off) const { return dev_lists.as<int32_t>() + off; }
  // paged_kv_t over layer `layer` of the slab as fi_kv_view describes it.
  flashinfer::paged_kv_t<fi::bf16, int32_t> paged_kv(const fi::bf16* slab, int32_t layer, int32_t batch,
                                                     size_t indices, size_t indptr, size_t last) const {
    const FiKVView v = fi_kv_view(layer, hkv, page_size, d, page_elems);
    fi::bf16* base = const_cast<fi::bf16*>(slab);
    return flashinfer::paged_kv_t<fi::bf16, int32_t>(uint32_t(hkv), uint32_t(page_size), uint32_t(d),
                                                     uint32_t(batch), static_cast<flashinfer::QKVLayout>(v.layout),
                                                     base + v.k_offset, base + v.v_offset, v.strides, dev(indices),
                                                     dev(indptr), dev(last));
  }
};

bool FlashInferAttention::supported(int32_t head_dim, int32_t group) {
  const bool g = group == 1 || group == 2 || group == 3 || group == 4 || group == 6 || group == 8 || group == 16;
  return (head_dim == 64 || head_dim == 128) && g;
}

FlashInferAttention::FlashInferAttention(int32_t num_qo_heads, int32_t num_kv_heads, int32_t head_dim,
                                         int32_t page_size, int64_t page_elems, cudaStream_t stream)
    : impl_(std::make_unique<Impl>()) {
  if (!supported(head_dim, num_qo_heads / num_kv_heads) || num_qo_heads % num_kv_heads != 0)
    throw EngineError(ENG_UNSUPPORTED, "FlashInfer attention: head_dim " + std::to_string(head_dim) + " with " +
                                           std::to_string(num_qo_heads) + " q heads over " +
                                           std::to_string(num_kv_heads) +
                                           " kv heads is not instantiated (head_dim 64 or 128; group 1, 2, 3, "
                                           "4, 6, 8 or 16)");
  if (page_elems > int64_t(UINT32_MAX))
    throw EngineError(ENG_UNSUPPORTED, "FlashInfer attention: a page of " + std::to_string(page_elems) +
                                           " elements exceeds paged_kv_t's 32-bit page stride");
  Impl& m = *impl_;
  m.hq = num_qo_heads;
  m.hkv = num_kv_heads;
  m.d = head_dim;
  m.page_size = page_size;
  m.page_elems = page_elems;
  m.stream = stream;
  m.float_ws.reserve(kFloatWorkspace);
  for (PlanState* p : {&m.dec, &m.pre}) {
    p->int_ws.reserve(kIntWorkspace);
    p->int_ws_host.reserve(kIntWorkspace);
  }
}

FlashInferAttention::~FlashInferAttention() = default;

uint64_t FlashInferAttention::generation() const { return impl_->generation; }

void FlashInferAttention::plan(const FiSeq* decode, int32_t nd, const FiSeq* chunks, int32_t nc,
                               bool graph_safe) {
  Impl& m = *impl_;
  const int32_t P = m.page_size;
  m.lists = size_fi_lists(decode, nd, chunks, nc, P);
  const size_t total = m.lists.total;
  // The device lists' address is captured by a CUDA graph of run(); when it
  // has to grow, generation() changes and the backend drops its graphs.
  const void* before = m.dev_lists.as<void>();
  // Graph steps grow the lists with headroom (twice the need), so that
  // contexts growing step by step re-capture a few times, not every page.
  const size_t want = total * sizeof(int32_t) > m.dev_lists.bytes() && graph_safe ? 2 * total : total;
  m.host_lists.reserve(want * sizeof(int32_t));
  m.dev_lists.reserve(want * sizeof(int32_t));
  if (m.dev_lists.as<void>() != before) ++m.generation;
  int32_t* h = m.host_lists.as<int32_t>();
  fill_fi_lists(decode, nd, chunks, nc, P, m.lists, h);
  CUDA_CHECK(cudaMemcpyAsync(m.dev_lists.as<void>(), h, total * sizeof(int32_t), cudaMemcpyHostToDevice, m.stream));
  m.dec.batch = nd;
  m.dec.rows = nd;
  m.pre.batch = nc;
  m.pre.rows = m.lists.pre_rows;
  const uint32_t rows = uint32_t(m.lists.pre_rows);

  if (nd > 0) {
    fi_call("decode plan", [&] {
      auto plan = m.d == 64 ? fi::decode_plan<64> : fi::decode_plan<128>;
      return plan(m.float_ws.as<void>(), m.float_ws.bytes(), m.dec.int_ws.as<void>(),
                  m.dec.int_ws_host.as<void>(), kIntWorkspace, m.dec_info, h + m.lists.off_dec_indptr, uint32_t(nd),
                  uint32_t(m.hq), uint32_t(m.hkv), uint32_t(P), graph_safe, m.stream);
    });
  }
  if (nc > 0) {
    fi_call("prefill plan", [&] {
      return flashinfer::PrefillPlan<int32_t>(
          m.float_ws.as<void>(), m.float_ws.bytes(), m.pre.int_ws.as<void>(), m.pre.int_ws_host.as<void>(),
          kIntWorkspace, m.pre_info, h + m.lists.off_pre_qo, h + m.lists.off_pre_indptr, rows, uint32_t(nc),
          uint32_t(m.hq), uint32_t(m.hkv), uint32_t(m.d), uint32_t(m.d), uint32_t(P),
          /*enable_cuda_graph=*/false, /*sizeof_dtype_o=*/2, /*window_left=*/-1, /*fixed_split_size=*/-1,
          /*disable_split_kv=*/false, /*num_colocated_ctas=*/0, /*uniform_q_len=*/0, m.stream);
    });
  }
}

void FlashInferAttention::run(const __nv_bfloat16* slab, int32_t layer, const __nv_bfloat16* q,
                              __nv_bfloat16* out, float* lse) {
  Impl& m = *impl_;
  const float sm_scale = float(1.0 / std::sqrt(double(m.d)));
  const int64_t q_stride_n = int64_t(m.hq) * m.d;
  char* fws = m.float_ws.as<char>();
  if (m.dec.batch > 0) {
    const flashinfer::DecodePlanInfo& info = m.dec_info;
    char* iws = m.dec.int_ws.as<char>();
    const FiLists& l = m.lists;
    fi::DecodeParams p(const_cast<fi::bf16*>(q), /*q_rope_offset=*/nullptr,
                       m.paged_kv(slab, layer, m.dec.batch, l.off_dec_idx, l.off_dec_indptr, l.off_dec_last), out,
                       lse, /*maybe_alibi_slopes=*/nullptr, uint32_t(m.hq), int32_t(q_stride_n), int32_t(m.d),
                       /*window_left=*/-1, /*logits_soft_cap=*/0.0f, sm_scale, /*rope_scale=*/1.0f,
                       /*rope_theta=*/1e4f);
    p.request_indices = reinterpret_cast<int32_t*>(iws + info.request_indices_offset);
    p.kv_tile_indices = reinterpret_cast<int32_t*>(iws + info.kv_tile_indices_offset);
    p.o_indptr = reinterpret_cast<int32_t*>(iws + info.o_indptr_offset);
    p.kv_chunk_size_ptr = reinterpret_cast<int32_t*>(iws + info.kv_chunk_size_ptr_offset);
    p.padded_batch_size = uint32_t(info.padded_batch_size);
    fi::bf16* tmp_v = nullptr;
    float* tmp_s = nullptr;
    if (info.split_kv) {
      tmp_v = reinterpret_cast<fi::bf16*>(fws + info.v_offset);
      tmp_s = reinterpret_cast<float*>(fws + info.s_offset);
      if (info.enable_cuda_graph) p.block_valid_mask = reinterpret_cast<bool*>(iws + info.block_valid_mask_offset);
    }
    fi_call("decode", [&] {
      return m.d == 64 ? fi::decode_run<64>(p, tmp_v, tmp_s, m.stream) : fi::decode_run<128>(p, tmp_v, tmp_s, m.stream);
    });
  }
  if (m.pre.batch > 0) {
    const flashinfer::PrefillPlanInfo& info = m.pre_info;
    char* iws = m.pre.int_ws.as<char>();
    const int64_t row0 = m.lists.pre_row0;  // the chunks' rows follow the decode rows
    fi::PrefillParams p;
    p.q = const_cast<fi::bf16*>(q) + row0 * q_stride_n;
    const FiLists& l = m.lists;
    p.paged_kv = m.paged_kv(slab, layer, m.pre.batch, l.off_pre_idx, l.off_pre_indptr, l.off_pre_last);
    p.q_indptr = m.dev(m.lists.off_pre_qo);
    p.o = out + row0 * q_stride_n;
    p.lse = lse != nullptr ? lse + row0 * m.hq : nullptr;
    p.group_size = flashinfer::uint_fastdiv(uint32_t(m.hq / m.hkv));
    p.num_qo_heads = uint32_t(m.hq);
    p.q_stride_n = int32_t(q_stride_n);
    p.q_stride_h = m.d;
    p.window_left = -1;
    p.logits_soft_cap = 0.0f;
    p.sm_scale = sm_scale;
    p.rope_rcp_scale = 1.0f;
    p.rope_rcp_theta = 1e-4f;
    p.request_indices = reinterpret_cast<int32_t*>(iws + info.request_indices_offset);
    p.qo_tile_indices = reinterpret_cast<int32_t*>(iws + info.qo_tile_indices_offset);
    p.kv_tile_indices = reinterpret_cast<int32_t*>(iws + info.kv_tile_indices_offset);
    p.o_indptr = reinterpret_cast<int32_t*>(iws + info.o_indptr_offset);
    p.kv_chunk_size_ptr = reinterpret_cast<int32_t*>(iws + info.kv_chunk_size_ptr_offset);
    p.padded_batch_size = uint32_t(info.padded_batch_size);
    p.max_total_num_rows = uint32_t(info.total_num_rows);
    fi::bf16* tmp_v = nullptr;
    float* tmp_s = nullptr;
    if (info.split_kv) {
      p.merge_indptr = reinterpret_cast<int32_t*>(iws + info.merge_indptr_offset);
      tmp_v = reinterpret_cast<fi::bf16*>(fws + info.v_offset);
      tmp_s = reinterpret_cast<float*>(fws + info.s_offset);
    }
    fi_call("prefill", [&] {
      const int cta = int(info.cta_tile_q);
      if (m.d == 64) {
        if (cta == 16) return fi::prefill_run<64, 16>(p, tmp_v, tmp_s, m.stream);
        if (cta == 64) return fi::prefill_run<64, 64>(p, tmp_v, tmp_s, m.stream);
        if (cta == 128) return fi::prefill_run<64, 128>(p, tmp_v, tmp_s, m.stream);
      } else {
        if (cta == 16) return fi::prefill_run<128, 16>(p, tmp_v, tmp_s, m.stream);
        if (cta == 64) return fi::prefill_run<128, 64>(p, tmp_v, tmp_s, m.stream);
        if (cta == 128) return fi::prefill_run<128, 128>(p, tmp_v, tmp_s, m.stream);
      }
      throw EngineError(ENG_INTERNAL, "FlashInfer prefill plan chose query tile " + std::to_string(cta) +
                                          ", which is not instantiated (16, 64, 128)");
    });
  }
  if (lse != nullptr) {
    const int64_t n = (m.dec.rows + m.pre.rows) * m.hq;
    if (n > 0) {
      lse_to_natural<<<unsigned((n + 255) / 256), 256, 0, m.stream>>>(lse, n);
      CUDA_CHECK_LAUNCH();
    }
  }
}

}  // namespace lockstep
