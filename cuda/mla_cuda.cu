// mla_cuda.cu: the CUDA backend's multi-head latent attention: its synthetic weights
// and the attention block of a layer (model_cuda.h).
#include "model_cuda.h"
#include "model_cuda_internal.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/mla.cuh"
#include "kernels/q_pack.cuh"
#include "kernels/rmsnorm.cuh"
#include "kernels/rope.cuh"
#include "weights.h"

namespace lockstep {

using cuda_internal::at;
using cuda_internal::gen_tensor;

// Layer l's MLA attention weights, generated as the CPU backend generates
// them (weights.cpp generate_mla: the MLA tensors keyed by mla_tensor_id,
// norms 1 + u/8, projections u / sqrt(fan_in); wq and wo as ordinary
// tensors).
void CudaBackend::generate_mla(uint64_t seed, int l) {
  const int64_t H = shape_.hidden_size, heads = shape_.num_heads, QL = shape_.q_lora_rank;
  const int64_t KL = shape_.kv_lora_rank, R = shape_.qk_rope_head_dim, N = shape_.qk_nope_head_dim;
  const int64_t Vd = shape_.v_head_dim, q_in = QL > 0 ? QL : H, qf = heads * (N + R);
  const size_t bf = sizeof(__nv_bfloat16);
  CudaLayer& L = layers_[size_t(l)];
  // An [in][out] tensor (generator index i * out + o), packed.
  auto mla = [&](TensorKind kind, int64_t in, int64_t out, int64_t fan_in) {
    return gen_tensor(seed, mla_tensor_id(kind, l), in, out, out, 0, fan_in);
  };
  auto plain = [&](TensorKind kind, int64_t in, int64_t out) {
    GenTensor t = mla(kind, in, out, in);
    t.tensor_id = tensor_id(kind, l);
    return t;
  };
  if (QL > 0) {
    L.wqa.reserve(size_t(H * QL) * bf);
    generate_bf16(mla(TensorKind::kQA, H, QL, H), L.wqa.as<__nv_bfloat16>(), stream_);
    L.qa_norm.reserve(size_t(QL) * sizeof(float));
    generate_f32(mla(TensorKind::kQANorm, 1, QL, 0), L.qa_norm.as<float>(), stream_);
  }
  L.wqb.reserve(size_t(q_in * qf) * bf);
  generate_bf16(plain(TensorKind::kWq, q_in, qf), L.wqb.as<__nv_bfloat16>(), stream_);
  L.wkva.reserve(size_t(H * (KL + R)) * bf);
  generate_bf16(mla(TensorKind::kKVA, H, KL + R, H), L.wkva.as<__nv_bfloat16>(), stream_);
  L.kva_norm.reserve(size_t(KL) * sizeof(float));
  generate_f32(mla(TensorKind::kKVANorm, 1, KL, 0), L.kva_norm.as<float>(), stream_);
  L.wkb.reserve(size_t(heads * N * KL) * bf);
  generate_bf16(mla(TensorKind::kKB, heads * N, KL, KL), L.wkb.as<__nv_bfloat16>(), stream_);
  L.wvb.reserve(size_t(heads * KL * Vd) * bf);
  generate_bf16(mla(TensorKind::kVB, heads * KL, Vd, KL), L.wvb.as<__nv_bfloat16>(), stream_);
  L.wo.reserve(size_t(heads * Vd * H) * bf);
  generate_bf16(plain(TensorKind::kWo, heads * Vd, H), L.wo.as<__nv_bfloat16>(), stream_);
}

// The MLA attention block of layer `layer` over the step's rows (xb_ holds
// their normed inputs): model_cuda.h says the stages; adds W_o's output to
// hidden_.
void CudaBackend::mla_attention_block(int32_t layer) {
  const CudaLayer& L = layers_[size_t(layer)];
  const int64_t R = desc_.rows, H = shape_.hidden_size, heads = shape_.num_heads;
  const int64_t QL = shape_.q_lora_rank, KL = shape_.kv_lora_rank, Rr = shape_.qk_rope_head_dim;
  const int64_t N = shape_.qk_nope_head_dim, Vd = shape_.v_head_dim;
  const int64_t qh = N + Rr, qf = heads * qh, W = KL + Rr, qa = heads * W;
  const int32_t* pos = at<int32_t>(dev_desc_, desc_.off_pos);
  const __nv_bfloat16* x = xb_.as<__nv_bfloat16>();
  float* q = mla_q_.as<float>();
  // q: through the q LoRA and its norm, or straight from x.
  if (QL > 0) {
    gemm_->bf16_f32(x, R, H, L.wqa.as<__nv_bfloat16>(), QL, mla_cq_.as<float>(), 0.0f);
    rmsnorm(mla_cq_.as<float>(), nullptr, L.qa_norm.as<float>(), int32_t(QL), shape_.rms_eps, R,
            mla_cqb_.as<__nv_bfloat16>(), nullptr, stream_);
    gemm_->bf16_f32(mla_cqb_.as<__nv_bfloat16>(), R, QL, L.wqb.as<__nv_bfloat16>(), qf, q, 0.0f);
  } else {
    gemm_->bf16_f32(x, R, H, L.wqb.as<__nv_bfloat16>(), qf, q, 0.0f);
  }
  // The latent [c | k_pe]: normed, roped, into the pages.
  gemm_->bf16_f32(x, R, H, L.wkva.as<__nv_bfloat16>(), W, mla_kv_.as<float>(), 0.0f);
  rope(q + N, qf, int32_t(heads), int32_t(Rr), pos, inv_freq_.as<double>(), R, stream_, qh, rope_mag_);
  LatentPages lp;
  lp.slab = pages_->device_page(0);
  lp.page_elems = pages_->page_elems();
  lp.tokens_per_page = tokens_per_page_;
  lp.kv_lora = int32_t(KL);
  lp.rope = int32_t(Rr);
  lp.layer = layer;
  mla_latent_append(lp, mla_kv_.as<float>(), W, L.kva_norm.as<float>(), shape_.rms_eps, pos, inv_freq_.as<double>(),
                    rope_mag_, at<int32_t>(dev_desc_, desc_.off_page), at<int32_t>(dev_desc_, desc_.off_slot), R,
                    stream_);
  // Absorption: q_lat[r][h] = q_nope[r][h] · W_kb[h], beside q_pe: [R][heads][W].
  q_pack(q, qf, R, int32_t(qf), mla_qb_.as<__nv_bfloat16>(), stream_);
  gemm_->bf16_f32_heads(mla_qb_.as<__nv_bfloat16>(), qf, qh, R, N, L.wkb.as<__nv_bfloat16>(), KL,
                        mla_qa_.as<float>(), qa, W, heads);
  copy_heads(q + N, qf, qh, mla_qa_.as<float>() + KL, qa, W, int32_t(heads), int32_t(Rr), R, stream_);
  // Attention over the latents: o_lat [R][heads][KL].
  __nv_bfloat16* o = mla_o_.as<__nv_bfloat16>();
  if (cp_ != nullptr) {
    // Helix: this member's partial of every (row, head) over its own latent
    // pages (the per-row list holds its keys), then the members' merge.
    const int64_t items = R * heads;
    float* mine = helix_parts_.as<float>() + cp_share_.rank * items * (KL + 1);
    mla_attention(lp, mla_qa_.as<float>(), int32_t(heads), at<int32_t>(dev_desc_, desc_.off_blocks),
                  reinterpret_cast<const AttnSeq*>(at<int32_t>(dev_desc_, desc_.off_hseqs)), R, attn_scale_,
                  nullptr, stream_, mine, mine + items * KL);
    exchange_and_merge(layer, int32_t(KL), o);
  } else if (fi_mla_) {
    q_pack(mla_qa_.as<float>(), qa, R, int32_t(qa), mla_qab_.as<__nv_bfloat16>(), stream_);
    const __nv_bfloat16* qb = mla_qab_.as<__nv_bfloat16>();
    fi_mla_->run(pages_->device_page(0), layer, qb, qb + KL, qa, W, attn_scale_, o);
  } else {
    mla_attention(lp, mla_qa_.as<float>(), int32_t(heads), at<int32_t>(dev_desc_, desc_.off_blocks),
                  reinterpret_cast<const AttnSeq*>(at<int32_t>(dev_desc_, desc_.off_hseqs)), R, attn_scale_, o,
                  stream_);
  }
  // Values: o_lat[r][h] · W_vb[h], then W_o.
  gemm_->bf16_f32_heads(o, heads * KL, KL, R, KL, L.wvb.as<__nv_bfloat16>(), Vd, mla_v_.as<float>(), heads * Vd, Vd,
                        heads);
  q_pack(mla_v_.as<float>(), heads * Vd, R, int32_t(heads * Vd), attn_.as<__nv_bfloat16>(), stream_);
  gemm_->bf16_f32(attn_.as<__nv_bfloat16>(), R, heads * Vd, L.wo.as<__nv_bfloat16>(), H, hidden_.as<float>(), 1.0f);
}

}  // namespace lockstep
