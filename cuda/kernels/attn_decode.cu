// attn_decode.cu: paged decode attention with split-KV (see attn_decode.cuh).
//
// One block of 128 threads per (split, kv head, sequence). Keys are processed
// in tiles of 64: the tile's K and V are staged in shared memory with 16-byte
// loads, every (group head, key) score is a dot product over shared memory,
// the running softmax state (m, l) of each head is updated once per tile, and
// each thread accumulates a fixed set of output elements in registers
// (online softmax, float32 throughout; K/V are bf16).
#include <cfloat>

#include "../cuda_check.h"
#include "attn_decode.cuh"

namespace lockstep {
namespace {

constexpr int kThreads = 128;
constexpr int kTile = 64;

template <int D>
__global__ void __launch_bounds__(kThreads) attn_decode_kernel(AttnArgs a) {
  constexpr int DP = D + 8;
  constexpr int EPT = (kDecodeMaxGroup * D + kThreads - 1) / kThreads;  // outputs per thread
  const int split = blockIdx.x, kvh = blockIdx.y;
  const AttnSeq s = a.seqs[blockIdx.z];
  const int G = a.num_heads / a.kv.num_kv_heads;
  const int row = s.q_row + s.num_tokens - 1;
  const int32_t pos = s.start_pos + s.num_tokens - 1;
  const int32_t* blocks = a.block_tables + s.block_off;

  // Key range of this split, clipped causally.
  int32_t k0 = s.kv_begin, k1 = min(s.kv_end, pos + 1);
  if (a.num_splits > 1) {
    const int32_t lo = s.kv_begin + split * a.split_tokens;
    k1 = min(k1, lo + a.split_tokens);
    k0 = lo;
  }

  extern __shared__ __align__(16) unsigned char smem[];
  __nv_bfloat16* Ks = reinterpret_cast<__nv_bfloat16*>(smem);
  __nv_bfloat16* Vs = Ks + kTile * DP;
  float* qs = reinterpret_cast<float*>(Vs + kTile * DP);  // [G][D]
  float* ps = qs + G * D;                                  // [G][kTile]
  float* ms = ps + G * kTile;                              // [G]
  float* ls = ms + G;                                      // [G]
  float* alphas = ls + G;                                  // [G]

  for (int i = threadIdx.x; i < G * D; i += kThreads) {
    const int g = i / D, d = i % D;
    qs[i] = a.q[int64_t(row) * a.q_stride + int64_t(kvh * G + g) * D + d];
  }
  for (int g = threadIdx.x; g < G; g += kThreads) {
    ms[g] = -INFINITY;
    ls[g] = 0.0f;
  }
  float o[EPT];
#pragma unroll
  for (int k = 0; k < EPT; ++k) o[k] = 0.0f;
  __syncthreads();

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int32_t t0 = k0; t0 < k1; t0 += kTile) {
    load_kv_tile<D, kTile, kThreads>(a.kv, blocks, kvh, t0, k1, Ks, Vs);
    __syncthreads();
    const int n = min(kTile, k1 - t0);  // >= 1 valid keys in this tile

    // Scores: thread per (head, key); K rows read as 16-byte vectors.
    for (int i = threadIdx.x; i < G * kTile; i += kThreads) {
      const int g = i / kTile, j = i % kTile;
      float acc = -INFINITY;
      if (j < n) {
        acc = 0.0f;
        const float* qg = qs + g * D;
#pragma unroll
        for (int c = 0; c < D / 8; ++c) {
          const uint4 k4 = *reinterpret_cast<const uint4*>(Ks + j * DP + c * 8);
          const __nv_bfloat162* k2 = reinterpret_cast<const __nv_bfloat162*>(&k4);
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const float2 kf = __bfloat1622float2(k2[e]);
            acc += qg[c * 8 + 2 * e] * kf.x + qg[c * 8 + 2 * e + 1] * kf.y;
          }
        }
        acc *= a.scale;
      }
      ps[i] = acc;
    }
    __syncthreads();

    // Online softmax update, one warp per head.
    for (int g = warp; g < G; g += kThreads / 32) {
      const float v0 = ps[g * kTile + lane], v1 = ps[g * kTile + lane + 32];
      const float m_old = ms[g];
      const float m_new = fmaxf(m_old, warp_max(fmaxf(v0, v1)));  // finite: n >= 1
      const float p0 = __expf(v0 - m_new), p1 = __expf(v1 - m_new);
      const float sum = warp_sum(p0 + p1);
      ps[g * kTile + lane] = p0;
      ps[g * kTile + lane + 32] = p1;
      if (lane == 0) {
        const float alpha = __expf(m_old - m_new);  // 0 when m_old = -inf
        alphas[g] = alpha;
        ls[g] = ls[g] * alpha + sum;
        ms[g] = m_new;
      }
    }
    __syncthreads();

    // O = O * alpha + P V for this thread's outputs.
#pragma unroll
    for (int k = 0; k < EPT; ++k) {
      const int e = threadIdx.x + k * kThreads;
      if (e < G * D) {
        const int g = e / D, d = e % D;
        const float* pg = ps + g * kTile;
        float acc = o[k] * alphas[g];
        for (int j = 0; j < n; ++j) acc += pg[j] * __bfloat162float(Vs[j * DP + d]);
        o[k] = acc;
      }
    }
    __syncthreads();  // before the next tile overwrites Ks / Vs / ps
  }

#pragma unroll
  for (int k = 0; k < EPT; ++k) {
    const int e = threadIdx.x + k * kThreads;
    if (e >= G * D) continue;
    const int g = e / D, d = e % D, head = kvh * G + g;
    const float l = ls[g];
    if (a.o_part != nullptr) {
      const int64_t pr = int64_t(split) * a.part_rows + s.part_row;
      a.o_part[(pr * a.num_heads + head) * D + d] = l > 0.0f ? o[k] / l : 0.0f;
      if (d == 0) a.lse_part[pr * a.num_heads + head] = l > 0.0f ? ms[g] + logf(l) : -INFINITY;
    } else {
      a.out[int64_t(row) * a.out_stride + int64_t(head) * D + d] =
          __float2bfloat16(l > 0.0f ? o[k] / l : 0.0f);
    }
  }
}

template <int D>
void launch(const AttnArgs& a, cudaStream_t stream) {
  const int G = a.num_heads / a.kv.num_kv_heads;
  const size_t smem = 2 * kTile * (D + 8) * sizeof(__nv_bfloat16) +
                      (G * D + G * kTile + 3 * G) * sizeof(float);
  static std::atomic<uint64_t> configured{0};  // per D instantiation and device
  once_per_device(configured, [&] {
    CUDA_CHECK(cudaFuncSetAttribute(attn_decode_kernel<D>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize, 96 * 1024));
  });
  const dim3 grid(a.num_splits, a.kv.num_kv_heads, a.num_seqs);
  attn_decode_kernel<D><<<grid, kThreads, smem, stream>>>(a);
  CUDA_CHECK_LAUNCH();
}

}  // namespace

bool attn_decode_supported(int32_t head_dim, int32_t group) {
  const bool d_ok = head_dim == 16 || head_dim == 32 || head_dim == 64 || head_dim == 128 ||
                    head_dim == 256;
  return d_ok && group >= 1 && group <= kDecodeMaxGroup;
}

void attn_decode(const AttnArgs& a, cudaStream_t stream) {
  if (a.num_seqs == 0) return;
  switch (a.kv.head_dim) {
    case 16: return launch<16>(a, stream);
    case 32: return launch<32>(a, stream);
    case 64: return launch<64>(a, stream);
    case 128: return launch<128>(a, stream);
    case 256: return launch<256>(a, stream);
    default:
      throw EngineError(ENG_UNSUPPORTED, "decode attention: head_dim " +
                                             std::to_string(a.kv.head_dim) +
                                             " is not built (16, 32, 64, 128, 256)");
  }
}

}  // namespace lockstep
