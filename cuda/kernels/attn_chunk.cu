// attn_chunk.cu: tiled paged attention for context chunks (see attn_chunk.cuh).
//
// FlashAttention-2 structure on the tensor cores through WMMA (bf16 in,
// float32 accumulate), one block of 4 warps per (64-row query tile, kv head,
// split, sequence):
//   Q tile (64 rows = tokens x GQA heads of one kv head) staged once in bf16;
//   per 64-key tile: K, V staged from the pages; S = Q K^T (each warp its 16
//   rows); online softmax per row in float32 with the causal mask; P rounded
//   to bf16; O = O * alpha + P V with O kept in shared memory (float32).
// The online-softmax sum l adds the bf16-rounded probabilities, so that the
// normalisation matches the P actually multiplied into V.
//
// Performance notes: this is the portable sm_80+ path. The Hopper path
// (wgmma with O in registers, K/V tiles by the tensor copy engine, ping-pong
// warpgroups) is the next step once timings on the device exist.
#include <mma.h>

#include "../cuda_check.h"
#include "attn_chunk.cuh"

namespace lockstep {
namespace {

using namespace nvcuda;

constexpr int kThreads = 128;  // 4 warps x 16 query rows
constexpr int kM = 64;         // query rows per tile
constexpr int kN = 64;         // keys per tile

// Shared-memory plan for head_dim D (byte offsets, each 128-byte aligned).
template <int D>
struct ChunkSmem {
  static constexpr int DP = D + 8;   // bf16 row pitch of Q, K, V
  static constexpr int SP = kN + 4;  // float pitch of S
  static constexpr int PP = kN + 8;  // bf16 pitch of P
  static constexpr int OP = D + 4;   // float pitch of O
  static constexpr size_t align(size_t x) { return (x + 127) / 128 * 128; }
  static constexpr size_t q = 0;
  static constexpr size_t k = q + align(kM * DP * 2);
  static constexpr size_t v = k + align(kN * DP * 2);
  static constexpr size_t s = v + align(kN * DP * 2);
  static constexpr size_t p = s + align(kM * SP * 4);
  static constexpr size_t o = p + align(kM * PP * 2);
  static constexpr size_t stats = o + align(kM * OP * 4);  // m, l, alpha [kM] float, pos [kM] int
  static constexpr size_t total = stats + 4 * kM * 4;
};

template <int D>
__global__ void __launch_bounds__(kThreads) attn_chunk_kernel(AttnArgs a) {
  using L = ChunkSmem<D>;
  constexpr int DP = L::DP, SP = L::SP, PP = L::PP, OP = L::OP;
  const AttnSeq s = a.seqs[blockIdx.z];
  const int G = a.num_heads / a.kv.num_kv_heads;
  const int split = blockIdx.y % a.num_splits, kvh = blockIdx.y / a.num_splits;
  const int rows_total = s.num_tokens * G;
  const int r0 = blockIdx.x * kM;
  if (r0 >= rows_total) return;  // this sequence has fewer row tiles than the grid
  const int32_t* blocks = a.block_tables + s.block_off;

  extern __shared__ __align__(128) unsigned char smem[];
  __nv_bfloat16* Qs = reinterpret_cast<__nv_bfloat16*>(smem + L::q);
  __nv_bfloat16* Ks = reinterpret_cast<__nv_bfloat16*>(smem + L::k);
  __nv_bfloat16* Vs = reinterpret_cast<__nv_bfloat16*>(smem + L::v);
  float* Ss = reinterpret_cast<float*>(smem + L::s);
  __nv_bfloat16* Ps = reinterpret_cast<__nv_bfloat16*>(smem + L::p);
  float* Os = reinterpret_cast<float*>(smem + L::o);
  float* ms = reinterpret_cast<float*>(smem + L::stats);
  float* ls = ms + kM;
  float* alphas = ls + kM;
  int32_t* rpos = reinterpret_cast<int32_t*>(alphas + kM);

  // Q tile (bf16), O = 0, row state. Row r is token (r0 + r) / G, head g.
  for (int i = threadIdx.x; i < kM * D; i += kThreads) {
    const int r = i / D, d = i % D, pr = r0 + r;
    float qv = 0.0f;
    if (pr < rows_total) {
      const int t = pr / G, g = pr % G;
      qv = a.q[int64_t(s.q_row + t) * a.q_stride + int64_t(kvh * G + g) * D + d];
    }
    Qs[r * DP + d] = __float2bfloat16(qv);
    Os[r * OP + d] = 0.0f;
  }
  for (int r = threadIdx.x; r < kM; r += kThreads) {
    const int pr = r0 + r;
    ms[r] = -INFINITY;
    ls[r] = 0.0f;
    rpos[r] = pr < rows_total ? s.start_pos + pr / G : -1;  // -1: padding row, no keys
  }

  // Keys this block visits: the split's slice, up to the last row's position.
  const int last_row = min(rows_total, r0 + kM) - 1;
  int32_t k0 = s.kv_begin, k1 = min(s.kv_end, s.start_pos + last_row / G + 1);
  if (a.num_splits > 1) {
    k0 = s.kv_begin + split * a.split_tokens;
    k1 = min(k1, k0 + a.split_tokens);
  }
  __syncthreads();

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int wr = warp * 16;  // this warp's first row
  for (int32_t t0 = k0; t0 < k1; t0 += kN) {
    load_kv_tile<D, kN, kThreads>(a.kv, blocks, kvh, t0, k1, Ks, Vs);
    __syncthreads();

    // S[wr .. wr+16)[0 .. kN) = Q K^T.
#pragma unroll
    for (int nb = 0; nb < kN / 16; ++nb) {
      wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
      wmma::fill_fragment(acc, 0.0f);
#pragma unroll
      for (int kb = 0; kb < D / 16; ++kb) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> qa;
        wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> kb_;
        wmma::load_matrix_sync(qa, Qs + wr * DP + kb * 16, DP);
        wmma::load_matrix_sync(kb_, Ks + nb * 16 * DP + kb * 16, DP);  // K^T
        wmma::mma_sync(acc, qa, kb_, acc);
      }
      wmma::store_matrix_sync(Ss + wr * SP + nb * 16, acc, SP, wmma::mem_row_major);
    }
    __syncwarp();

    // Online softmax of the warp's rows; each lane holds keys lane, lane + 32.
    for (int rr = 0; rr < 16; ++rr) {
      const int r = wr + rr;
      const int32_t pos = rpos[r];
      const int32_t ka = t0 + lane, kb = t0 + lane + 32;
      const float v0 = (ka < k1 && ka <= pos) ? Ss[r * SP + lane] * a.scale : -INFINITY;
      const float v1 = (kb < k1 && kb <= pos) ? Ss[r * SP + lane + 32] * a.scale : -INFINITY;
      const float m_old = ms[r];
      const float m_new = fmaxf(m_old, warp_max(fmaxf(v0, v1)));
      __nv_bfloat16 p0 = __float2bfloat16(0.0f), p1 = p0;
      float alpha = 1.0f;
      if (m_new != -INFINITY) {  // else: no key visible to this row yet
        p0 = __float2bfloat16(__expf(v0 - m_new));
        p1 = __float2bfloat16(__expf(v1 - m_new));
        alpha = __expf(m_old - m_new);
      }
      const float sum = warp_sum(__bfloat162float(p0) + __bfloat162float(p1));
      Ps[r * PP + lane] = p0;
      Ps[r * PP + lane + 32] = p1;
      if (lane == 0) {
        ls[r] = ls[r] * alpha + sum;
        ms[r] = m_new;
        alphas[r] = alpha;
      }
    }
    __syncwarp();
    for (int rr = 0; rr < 16; ++rr) {
      const float alpha = alphas[wr + rr];
      for (int d = lane; d < D; d += 32) Os[(wr + rr) * OP + d] *= alpha;
    }
    __syncwarp();

    // O[wr .. wr+16) += P V.
#pragma unroll
    for (int db = 0; db < D / 16; ++db) {
      wmma::fragment<wmma::accumulator, 16, 16, 16, float> oc;
      wmma::load_matrix_sync(oc, Os + wr * OP + db * 16, OP, wmma::mem_row_major);
#pragma unroll
      for (int kb = 0; kb < kN / 16; ++kb) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> pa;
        wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::row_major> vb;
        wmma::load_matrix_sync(pa, Ps + wr * PP + kb * 16, PP);
        wmma::load_matrix_sync(vb, Vs + kb * 16 * DP + db * 16, DP);
        wmma::mma_sync(oc, pa, vb, oc);
      }
      wmma::store_matrix_sync(Os + wr * OP + db * 16, oc, OP, wmma::mem_row_major);
    }
    __syncthreads();  // K / V are overwritten by the next tile
  }

  // Write the warp's valid rows.
  for (int rr = 0; rr < 16; ++rr) {
    const int r = wr + rr, pr = r0 + r;
    if (pr >= rows_total) break;
    const int t = pr / G, head = kvh * G + pr % G;
    const float l = ls[r];
    const float inv = l > 0.0f ? 1.0f / l : 0.0f;
    if (a.o_part != nullptr) {
      const int64_t prow = int64_t(split) * a.part_rows + s.part_row + t;
      for (int d = lane; d < D; d += 32)
        a.o_part[(prow * a.num_heads + head) * D + d] = Os[r * OP + d] * inv;
      if (lane == 0)
        a.lse_part[prow * a.num_heads + head] = l > 0.0f ? ms[r] + logf(l) : -INFINITY;
    } else {
      __nv_bfloat16* out = a.out + int64_t(s.q_row + t) * a.out_stride + int64_t(head) * D;
      for (int d = lane; d < D; d += 32) out[d] = __float2bfloat16(Os[r * OP + d] * inv);
    }
  }
}

template <int D>
void launch(const AttnArgs& a, int32_t max_tokens, cudaStream_t stream) {
  const int G = a.num_heads / a.kv.num_kv_heads;
  const size_t smem = ChunkSmem<D>::total;
  static std::atomic<uint64_t> configured{0};  // per D instantiation and device
  once_per_device(configured, [&] {
    CUDA_CHECK(cudaFuncSetAttribute(attn_chunk_kernel<D>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  });
  const int64_t tiles = (int64_t(max_tokens) * G + kM - 1) / kM;
  const dim3 grid(unsigned(tiles), unsigned(a.kv.num_kv_heads * a.num_splits), unsigned(a.num_seqs));
  attn_chunk_kernel<D><<<grid, kThreads, smem, stream>>>(a);
  CUDA_CHECK_LAUNCH();
}

}  // namespace

bool attn_chunk_supported(int32_t head_dim) {
  return head_dim == 16 || head_dim == 32 || head_dim == 64 || head_dim == 128;
}

void attn_chunk(const AttnArgs& a, int32_t max_tokens, cudaStream_t stream) {
  if (a.num_seqs == 0 || max_tokens <= 0) return;
  switch (a.kv.head_dim) {
    case 16: return launch<16>(a, max_tokens, stream);
    case 32: return launch<32>(a, max_tokens, stream);
    case 64: return launch<64>(a, max_tokens, stream);
    case 128: return launch<128>(a, max_tokens, stream);
    default:
      throw EngineError(ENG_UNSUPPORTED, "chunk attention: head_dim " +
                                             std::to_string(a.kv.head_dim) +
                                             " is not built (16, 32, 64, 128)");
  }
}

}  // namespace lockstep
