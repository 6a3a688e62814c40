// mla.cu: see mla.cuh.
#include <cfloat>

#include "../cuda_check.h"
#include "attn_common.cuh"
#include "mla.cuh"

namespace lockstep {
namespace {

constexpr int kThreads = 128;
constexpr int kTile = 128;      // keys per tile of mla_attention
constexpr int kMaxPerThread = 8;  // kv_lora <= kThreads * kMaxPerThread

// Block-wide sum (double) of one value per thread; every thread gets it.
__device__ double block_sum_d(double v, double* part) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  if (threadIdx.x % 32 == 0) part[threadIdx.x / 32] = v;
  __syncthreads();
  double tot = 0.0;
  for (int i = 0; i < kThreads / 32; ++i) tot += part[i];
  __syncthreads();  // part is reused
  return tot;
}

__device__ float block_max_f(float v, float* part) {
  v = warp_max(v);
  if (threadIdx.x % 32 == 0) part[threadIdx.x / 32] = v;
  __syncthreads();
  float m = -INFINITY;
  for (int i = 0; i < kThreads / 32; ++i) m = fmaxf(m, part[i]);
  __syncthreads();
  return m;
}

__device__ float block_sum_f(float v, float* part) {
  v = warp_sum(v);
  if (threadIdx.x % 32 == 0) part[threadIdx.x / 32] = v;
  __syncthreads();
  float t = 0.0f;
  for (int i = 0; i < kThreads / 32; ++i) t += part[i];
  __syncthreads();
  return t;
}

__global__ void __launch_bounds__(kThreads)
    latent_append_kernel(LatentPages lp, float* kv, int64_t stride, const float* w, float eps, const int32_t* pos,
                         const double* inv_freq, double mag, const int32_t* row_page, const int32_t* row_slot) {
  __shared__ double part[kThreads / 32];
  const int64_t r = blockIdx.x;
  float* x = kv + r * stride;
  const int KL = lp.kv_lora, R = lp.rope, half = R / 2;
  double ss = 0.0;
  for (int i = threadIdx.x; i < KL; i += kThreads) ss += double(x[i]) * double(x[i]);
  const double tot = block_sum_d(ss, part);
  const float inv = float(1.0 / sqrt(tot / KL + double(eps)));
  for (int i = threadIdx.x; i < KL; i += kThreads) x[i] = __fmul_rn(__fmul_rn(x[i], inv), w[i]);
  const double p = double(pos[r]);
  float* t = x + KL;
  for (int k = threadIdx.x; k < half; k += kThreads) {
    double sd, cd;
    sincos(p * inv_freq[k], &sd, &cd);
    const float c = float(cd * mag), s = float(sd * mag);
    const float x0 = t[k], x1 = t[half + k];
    t[k] = __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, s));
    t[half + k] = __fadd_rn(__fmul_rn(x1, c), __fmul_rn(x0, s));
  }
  __syncthreads();  // the whole row, normed and rotated, before the write
  const int32_t page = row_page[r];
  if (page < 0) return;
  __nv_bfloat16* dst =
      lp.slab + latent_offset(lp.page_elems, lp.tokens_per_page, KL + R, page, lp.layer, row_slot[r]);
  for (int i = threadIdx.x; i < KL + R; i += kThreads) dst[i] = __float2bfloat16(x[i]);
}

__global__ void copy_heads_kernel(const float* src, int64_t src_stride, int64_t src_head, float* dst,
                                  int64_t dst_stride, int64_t dst_head, int32_t heads, int32_t width) {
  const int64_t r = blockIdx.x;
  for (int i = threadIdx.x; i < heads * width; i += blockDim.x) {
    const int h = i / width, k = i % width;
    dst[r * dst_stride + h * dst_head + k] = src[r * src_stride + h * src_head + k];
  }
}

// One block per (row, head); keys in tiles of kTile: the scores (a warp per
// key, lanes over the W = kv_lora + rope dimensions), the online softmax
// state, and each thread's output dimensions (tid + k * kThreads < kv_lora)
// accumulated in registers.
__global__ void __launch_bounds__(kThreads)
    mla_attention_kernel(LatentPages lp, const float* q, int32_t heads, const int32_t* block_tables,
                         const AttnSeq* seqs, float scale, __nv_bfloat16* out, float* o_part, float* lse_part) {
  extern __shared__ __align__(16) unsigned char smem[];
  const int64_t r = blockIdx.x;
  const int h = blockIdx.y;
  const int KL = lp.kv_lora, W = KL + lp.rope, P = lp.tokens_per_page;
  float* qs = reinterpret_cast<float*>(smem);  // [W]
  float* ps = qs + W;                          // [kTile]
  __shared__ float part[kThreads / 32];
  const AttnSeq s = seqs[r];
  const int32_t* blocks = block_tables + s.block_off;
  const int32_t k0 = s.kv_begin, k1 = min(s.kv_end, s.start_pos + s.num_tokens);
  for (int i = threadIdx.x; i < W; i += kThreads) qs[i] = q[(r * heads + h) * int64_t(W) + i];
  float acc[kMaxPerThread];
#pragma unroll
  for (int k = 0; k < kMaxPerThread; ++k) acc[k] = 0.0f;
  float m = -INFINITY, l = 0.0f;
  __syncthreads();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int32_t t0 = k0; t0 < k1; t0 += kTile) {
    const int n = min(kTile, k1 - t0);
    for (int j = warp; j < n; j += kThreads / 32) {
      const int32_t p = t0 + j;
      const __nv_bfloat16* key = lp.slab + latent_offset(lp.page_elems, P, W, blocks[p / P], lp.layer, p % P);
      float d = 0.0f;
      for (int e = lane; e < W; e += 32) d += qs[e] * __bfloat162float(key[e]);
      d = warp_sum(d);
      if (lane == 0) ps[j] = d * scale;
    }
    __syncthreads();
    float mt = -INFINITY;
    for (int j = threadIdx.x; j < n; j += kThreads) mt = fmaxf(mt, ps[j]);
    const float m_new = fmaxf(m, block_max_f(mt, part));  // finite: n >= 1
    float st = 0.0f;
    for (int j = threadIdx.x; j < n; j += kThreads) {
      const float e = __expf(ps[j] - m_new);
      ps[j] = e;
      st += e;
    }
    const float sum = block_sum_f(st, part);  // synchronises: every ps[j] is written
    const float alpha = __expf(m - m_new);    // 0 while m = -inf
    l = l * alpha + sum;
    m = m_new;
#pragma unroll
    for (int k = 0; k < kMaxPerThread; ++k) {
      const int e = threadIdx.x + k * kThreads;
      if (e >= KL) break;
      float a = acc[k] * alpha;
      for (int j = 0; j < n; ++j) {
        const int32_t p = t0 + j;
        const __nv_bfloat16* key = lp.slab + latent_offset(lp.page_elems, P, W, blocks[p / P], lp.layer, p % P);
        a += ps[j] * __bfloat162float(key[e]);
      }
      acc[k] = a;
    }
    __syncthreads();  // before the next tile overwrites ps
  }
  const int64_t item = r * heads + h;
#pragma unroll
  for (int k = 0; k < kMaxPerThread; ++k) {
    const int e = threadIdx.x + k * kThreads;
    if (e >= KL) break;
    const float o = l > 0.0f ? acc[k] / l : 0.0f;
    if (o_part != nullptr)
      o_part[item * KL + e] = o;
    else
      out[item * KL + e] = __float2bfloat16(o);
  }
  if (lse_part != nullptr && threadIdx.x == 0) lse_part[item] = l > 0.0f ? m + logf(l) : -INFINITY;
}

}  // namespace

void mla_latent_append(const LatentPages& lp, float* kv, int64_t stride, const float* norm_w, float eps,
                       const int32_t* pos, const double* inv_freq, double mag, const int32_t* row_page,
                       const int32_t* row_slot, int64_t rows, cudaStream_t stream) {
  if (rows == 0) return;
  latent_append_kernel<<<unsigned(rows), kThreads, 0, stream>>>(lp, kv, stride, norm_w, eps, pos, inv_freq, mag,
                                                                row_page, row_slot);
  CUDA_CHECK_LAUNCH();
}

void copy_heads(const float* src, int64_t src_stride, int64_t src_head, float* dst, int64_t dst_stride,
                int64_t dst_head, int32_t heads, int32_t width, int64_t rows, cudaStream_t stream) {
  if (rows == 0 || heads * width == 0) return;
  const int n = heads * width;
  const int threads = n >= 256 ? 256 : ((n + 31) / 32) * 32;
  copy_heads_kernel<<<unsigned(rows), threads, 0, stream>>>(src, src_stride, src_head, dst, dst_stride, dst_head,
                                                            heads, width);
  CUDA_CHECK_LAUNCH();
}

void mla_attention(const LatentPages& lp, const float* q, int32_t heads, const int32_t* block_tables,
                   const AttnSeq* seqs, int64_t rows, float scale, __nv_bfloat16* out, cudaStream_t stream,
                   float* o_part, float* lse_part) {
  if (rows == 0) return;
  if (lp.kv_lora > kThreads * kMaxPerThread)
    throw EngineError(ENG_UNSUPPORTED, "MLA attention: kv_lora_rank " + std::to_string(lp.kv_lora) +
                                           " is over the hand-written kernel's " +
                                           std::to_string(kThreads * kMaxPerThread));
  const size_t smem = size_t(lp.kv_lora + lp.rope + kTile) * sizeof(float);
  const dim3 grid(static_cast<unsigned>(rows), static_cast<unsigned>(heads), 1u);
  mla_attention_kernel<<<grid, kThreads, smem, stream>>>(lp, q, heads, block_tables, seqs, scale, out, o_part,
                                                        lse_part);
  CUDA_CHECK_LAUNCH();
}

}  // namespace lockstep
