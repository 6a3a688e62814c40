// bench_kernels.cu: the device-check measurements, timed with CUDA events
// (median of repeats after a warm-up), written as TSV for sdpa_bench.py,
// which prints the final side-by-side table:
//   ceilings   large device-to-device copy (bytes read + written), large
//              bf16 cuBLAS matmul (8192^3)
//   decode     batch 1/16/64/256 x context 1k/8k/32k/128k, llama-8b heads
//              (32 q, 8 kv, D 128), page 32: time, GB/s of K+V read
//   chunk      chunk 512/2k/8k x depth 0/32k/128k, GQA 4:1 (32 q heads over 8 kv heads): time, TFLOP/s
//   iteration  one full llama-8b step through engine.h at a few batch mixes
//   gemm       llama-8b's QKV (4096x6144) and gate+up (4096x28672) bf16 GEMMs at
//              1-1024 tokens: time (the twin's GEMM transition and kernel cost)
//   fixed      a batch-1 decode at 128 tokens of context and a 128-token chunk at
//              depth 0, whose traffic takes < 1 us: the attention kernels' fixed cost
//   elementwise  RMSNorm of 1 and 4096 rows of 4096: rows, bytes, time
// Usage: cuda_bench OUT.tsv
#include <cublas_v2.h>
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <numeric>
#include <vector>

#include "engine.h"
#include "kernels/attn_chunk.cuh"
#include "kernels/attn_decode.cuh"
#include "kernels/attn_merge.cuh"
#include "kernels/rmsnorm.cuh"
#include "kernels/weights_gen.cuh"
#include "status.h"
#include "../tests/test_util.h"

using namespace lockstep;

namespace {

FILE* tsv = nullptr;

// A failing cuBLAS call must stop the benchmark: an unchecked GEMM that did
// nothing would report a bogus (huge) matmul ceiling.
#define BLAS_CHECK(call)                                                                        \
  do {                                                                                          \
    const cublasStatus_t st_ = (call);                                                          \
    if (st_ != CUBLAS_STATUS_SUCCESS) {                                                         \
      std::printf("FAIL: %s:%d: %s: %s\n", __FILE__, __LINE__, #call, cublasGetStatusName(st_)); \
      std::exit(1);                                                                             \
    }                                                                                           \
  } while (0)

// Median milliseconds of fn over reps after 2 warm-ups.
double time_ms(const std::function<void()>& fn, int reps = 7) {
  cudaEvent_t a, b;
  TCHECK(cudaEventCreate(&a));
  TCHECK(cudaEventCreate(&b));
  fn();
  fn();
  std::vector<float> t;
  for (int i = 0; i < reps; ++i) {
    TCHECK(cudaEventRecord(a));
    fn();
    TCHECK(cudaEventRecord(b));
    TCHECK(cudaEventSynchronize(b));
    float ms;
    TCHECK(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

void fill_random(__nv_bfloat16* p, size_t n, uint64_t seed) {
  GenTensor g;
  g.seed = seed;
  g.tensor_id = 99;
  g.rows = 1;
  g.cols = int64_t(n);
  g.ld = int64_t(n);
  generate_bf16(g, p, nullptr);
}

void ceilings(double* copy_gbs, double* mm_tflops) {
  const size_t bytes = size_t(4) << 30;
  void *a, *b;
  TCHECK(cudaMalloc(&a, bytes));
  TCHECK(cudaMalloc(&b, bytes));
  TCHECK(cudaMemset(a, 1, bytes));
  const double ms = time_ms([&] { TCHECK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice)); });
  *copy_gbs = 2.0 * bytes / (ms * 1e6);
  cudaFree(a);
  cudaFree(b);

  const int n = 8192;
  __nv_bfloat16 *A, *B, *C;
  TCHECK(cudaMalloc(&A, size_t(n) * n * 2));
  TCHECK(cudaMalloc(&B, size_t(n) * n * 2));
  TCHECK(cudaMalloc(&C, size_t(n) * n * 2));
  fill_random(A, size_t(n) * n, 1);
  fill_random(B, size_t(n) * n, 2);
  cublasHandle_t h;
  BLAS_CHECK(cublasCreate(&h));
  const float one = 1, zero = 0;
  const double mm = time_ms([&] {
    BLAS_CHECK(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one, A, CUDA_R_16BF, n, B, CUDA_R_16BF, n,
                            &zero, C, CUDA_R_16BF, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  }, 10);
  TCHECK(cudaGetLastError());
  *mm_tflops = 2.0 * n * n * double(n) / (mm * 1e9);
  BLAS_CHECK(cublasDestroy(h));
  cudaFree(A);
  cudaFree(B);
  cudaFree(C);
  std::fprintf(tsv, "ceiling\tcopy\t%.1f\tGB/s\nceiling\tmatmul\t%.1f\tTFLOP/s\n", *copy_gbs, *mm_tflops);
}

constexpr int kHq = 32, kHkv = 8, kD = 128, kP = 32;

// One attention launch set over batch sequences of (tokens, depth) each.
double attention_ms(int batch, int tokens, int depth, __nv_bfloat16* slab, int64_t page_elems,
                    int num_sms) {
  const int ctx = depth + tokens, nb = (ctx + kP - 1) / kP, rows = batch * tokens;
  std::vector<int32_t> blocks(size_t(batch) * nb);
  std::iota(blocks.begin(), blocks.end(), 0);
  std::vector<AttnSeq> seqs(static_cast<size_t>(batch));
  for (int s = 0; s < batch; ++s) seqs[size_t(s)] = AttnSeq{s * tokens, tokens, depth, s * nb, 0, ctx, s, 0};
  int32_t* dblocks;
  AttnSeq* dseqs;
  float *q, *o_part = nullptr, *lse_part = nullptr;
  __nv_bfloat16* out;
  TCHECK(cudaMalloc(&dblocks, blocks.size() * 4));
  TCHECK(cudaMalloc(&dseqs, seqs.size() * sizeof(AttnSeq)));
  TCHECK(cudaMalloc(&q, size_t(rows) * kHq * kD * 4));
  TCHECK(cudaMalloc(&out, size_t(rows) * kHq * kD * 2));
  TCHECK(cudaMemcpy(dblocks, blocks.data(), blocks.size() * 4, cudaMemcpyHostToDevice));
  TCHECK(cudaMemcpy(dseqs, seqs.data(), seqs.size() * sizeof(AttnSeq), cudaMemcpyHostToDevice));
  TCHECK(cudaMemset(q, 0x3c, size_t(rows) * kHq * kD * 4));  // non-zero queries (~0.011)
  AttnArgs a;
  a.q = q;
  a.q_stride = kHq * kD;
  a.kv = PagedKV{slab, page_elems, kP, kHkv, kD, 0};
  a.block_tables = dblocks;
  a.seqs = dseqs;
  a.num_seqs = batch;
  a.num_heads = kHq;
  a.scale = 1.0f / std::sqrt(float(kD));
  a.out = out;
  a.out_stride = kHq * kD;
  const int64_t blocks_1 = int64_t(batch) * kHkv;
  if (tokens == 1 && ctx > 1024 && blocks_1 < 2 * num_sms) {  // same rule as the backend
    const int splits = int(std::min<int64_t>((2 * num_sms + blocks_1 - 1) / blocks_1, (ctx + 255) / 256));
    a.split_tokens = ((ctx + splits - 1) / splits + 63) / 64 * 64;
    a.num_splits = (ctx + a.split_tokens - 1) / a.split_tokens;
    a.part_rows = batch;
    TCHECK(cudaMalloc(&o_part, size_t(a.num_splits) * batch * kHq * kD * 4));
    TCHECK(cudaMalloc(&lse_part, size_t(a.num_splits) * batch * kHq * 4));
    a.o_part = o_part;
    a.lse_part = lse_part;
  }
  const double ms = time_ms([&] {
    if (tokens == 1) {
      attn_decode(a, nullptr);
      if (a.num_splits > 1) {
        MergeArgs m;
        m.o_part = o_part;
        m.lse_part = lse_part;
        m.num_parts = a.num_splits;
        m.part_items = int64_t(batch) * kHq;
        m.num_heads = kHq;
        m.head_dim = kD;
        m.out_bf16 = out;
        m.out_stride = kHq * kD;
        attn_merge(m, nullptr);
      }
    } else {
      attn_chunk(a, tokens, nullptr);
    }
  }, tokens == 1 ? 11 : 5);
  cudaFree(dblocks);
  cudaFree(dseqs);
  cudaFree(q);
  cudaFree(out);
  if (o_part) cudaFree(o_part);
  if (lse_part) cudaFree(lse_part);
  return ms;
}

// The twin's per-kernel figures (docs/twin.md, "A measured profile"):
// device-check.sh turns these rows into gemm_kernel_ms, gemm_weight_gbps,
// attention_kernel_ms, elementwise_kernel_ms and elementwise_gbps.
void twin_kernel_bench(__nv_bfloat16* slab, int64_t page_elems, int num_sms) {
  cublasHandle_t h;
  BLAS_CHECK(cublasCreate(&h));
  const int K = 4096, maxT = 1024;
  __nv_bfloat16 *W, *X, *Y;
  TCHECK(cudaMalloc(&W, size_t(K) * 28672 * 2));
  TCHECK(cudaMalloc(&X, size_t(K) * maxT * 2));
  TCHECK(cudaMalloc(&Y, size_t(28672) * maxT * 2));
  fill_random(W, size_t(K) * 28672, 4);
  fill_random(X, size_t(K) * maxT, 5);
  const float one = 1, zero = 0;
  for (int n : {6144, 28672})
    for (int t : {1, 16, 64, 128, 256, 512, 1024}) {
      // Y (n x t) = W^T (W stored as n rows of K) x X (K x t), column-major.
      const double ms = time_ms([&] {
        BLAS_CHECK(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, n, t, K, &one, W, CUDA_R_16BF, K, X, CUDA_R_16BF, K,
                                &zero, Y, CUDA_R_16BF, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
      }, 11);
      std::fprintf(tsv, "gemm\t%d\t%d\t%d\t%.4f\n", t, K, n, ms);
    }
  BLAS_CHECK(cublasDestroy(h));
  cudaFree(W);
  cudaFree(X);
  cudaFree(Y);
  std::fprintf(tsv, "fixed\tdecode\t%.4f\n", attention_ms(1, 1, 127, slab, page_elems, num_sms));
  std::fprintf(tsv, "fixed\tchunk\t%.4f\n", attention_ms(1, 128, 0, slab, page_elems, num_sms));
  float *x, *w;
  __nv_bfloat16* y;
  const int rows_max = 4096;
  TCHECK(cudaMalloc(&x, size_t(rows_max) * K * 4));
  TCHECK(cudaMalloc(&w, size_t(K) * 4));
  TCHECK(cudaMalloc(&y, size_t(rows_max) * K * 2));
  TCHECK(cudaMemset(x, 0x3c, size_t(rows_max) * K * 4));
  TCHECK(cudaMemset(w, 0x3c, size_t(K) * 4));
  for (int rows : {1, rows_max}) {
    const double ms = time_ms([&] { rmsnorm(x, nullptr, w, K, 1e-5f, rows, y, nullptr, nullptr); }, 11);
    TCHECK(cudaGetLastError());
    std::fprintf(tsv, "elementwise\t%d\t%.0f\t%.4f\n", rows, double(rows) * K * (4 + 2), ms);
  }
  cudaFree(x);
  cudaFree(w);
  cudaFree(y);
  std::fflush(tsv);
}

void iteration_bench() {
  // llama-8b through the C ABI; page contents are whatever the steps wrote
  // (zeros at first): attention traffic does not depend on the values.
  eng_engine_config cfg{};
  cfg.abi_version = ENG_ABI_VERSION;
  cfg.backend = ENG_BACKEND_CUDA;
  cfg.preset = "llama-8b";
  cfg.seed = 1;
  cfg.num_pages = 8192 + 512;  // 4 MiB pages at P = 32: ~34 GiB
  cfg.tokens_per_page = kP;
  eng_engine_t e;
  if (eng_engine_init(&cfg, &e) != ENG_OK) {
    std::printf("FAIL: iteration bench: llama-8b engine init failed: %s\n", eng_last_error());
    std::exit(1);
  }
  struct Mix { const char* name; int decode, ctx, chunk; };
  const Mix mixes[] = {{"decode 64 x 2k", 64, 2048, 0},
                       {"decode 256 x 1k", 256, 1024, 0},
                       {"decode 128 x 1k + chunk 2k", 128, 1024, 2048},
                       {"chunk 8k", 0, 0, 8192}};
  for (const Mix& m : mixes) {
    std::vector<int32_t> nt, sp, toks, nb, bt;
    std::vector<uint8_t> sample;
    int page = 0;
    auto add = [&](int n, int start) {
      const int need = (start + n + kP - 1) / kP;
      nt.push_back(n);
      sp.push_back(start);
      for (int t = 0; t < n; ++t) toks.push_back((t * 31 + start) % 128000);
      nb.push_back(need);
      for (int b = 0; b < need; ++b) bt.push_back(page++);
      sample.push_back(1);
    };
    for (int i = 0; i < m.decode; ++i) add(1, m.ctx - 1);
    if (m.chunk) add(m.chunk, 0);
    std::vector<int32_t> sampled(nt.size());
    eng_step_desc d{int32_t(nt.size()), nt.data(), sp.data(), toks.data(), nb.data(), bt.data(), sample.data(), nullptr};
    std::vector<double> t;
    for (int rep = 0; rep < 7; ++rep) {
      eng_step_result r{sampled.data(), nullptr, 0};
      if (eng_engine_step(e, &d, &r) != ENG_OK) {
        std::printf("FAIL: iteration bench %s: %s\n", m.name, eng_engine_last_error(e));
        std::exit(1);
      }
      if (rep >= 2) t.push_back(r.device_ms);
    }
    std::sort(t.begin(), t.end());
    std::fprintf(tsv, "iteration\t%s\t%.3f\tms\n", m.name, t[t.size() / 2]);
  }
  eng_engine_free(e);
}

}  // namespace

int main(int argc, char** argv) {
  lockstep_test::skip_without_device("cuda_bench");
  tsv = std::fopen(argc > 1 ? argv[1] : "bench.tsv", "w");
  if (!tsv) return 2;
  try {
    int sms = 0;
    TCHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    double copy_gbs, mm_tflops;
    ceilings(&copy_gbs, &mm_tflops);

    // One slab for every attention shape: single layer, 40 GiB at most.
    const int64_t page_elems = int64_t(2) * kHkv * kP * kD;
    const int64_t page_bytes = page_elems * 2;
    const int64_t max_pages = (int64_t(40) << 30) / page_bytes;
    __nv_bfloat16* slab;
    TCHECK(cudaMalloc(&slab, size_t(max_pages * page_bytes)));
    fill_random(slab, size_t(max_pages * page_elems), 3);
    for (int batch : {1, 16, 64, 256})
      for (int ctx : {1024, 8192, 32768, 131072}) {
        const int64_t pages = int64_t(batch) * ((ctx + kP - 1) / kP);
        if (pages > max_pages) {
          std::fprintf(tsv, "decode\t%d\t%d\tskipped\t%.0f GiB of KV\n", batch, ctx,
                       double(pages * page_bytes) / (1 << 30));
          continue;
        }
        const double ms = attention_ms(batch, 1, ctx - 1, slab, page_elems, sms);
        const double gbs = double(batch) * ctx * kHkv * kD * 2 * 2 / (ms * 1e6);
        std::fprintf(tsv, "decode\t%d\t%d\t%.4f\t%.1f\t%.1f\n", batch, ctx, ms, gbs, 100 * gbs / copy_gbs);
        std::fflush(tsv);
      }
    for (int chunk : {512, 2048, 8192})
      for (int depth : {0, 32768, 131072}) {
        const double ms = attention_ms(1, chunk, depth, slab, page_elems, sms);
        const double flops = 4.0 * kD * kHq * (double(chunk) * depth + double(chunk) * (chunk + 1) / 2);
        const double tf = flops / (ms * 1e9);
        std::fprintf(tsv, "chunk\t%d\t%d\t%.4f\t%.1f\t%.1f\n", chunk, depth, ms, tf, 100 * tf / mm_tflops);
        std::fflush(tsv);
      }
    twin_kernel_bench(slab, page_elems, sms);
    cudaFree(slab);
    iteration_bench();
  } catch (const EngineError& e) {
    std::printf("FAIL: %s\n", e.what());
    return 1;
  }
  std::fclose(tsv);
  std::printf("cuda_bench: wrote %s\n", argc > 1 ? argv[1] : "bench.tsv");
  return 0;
}
