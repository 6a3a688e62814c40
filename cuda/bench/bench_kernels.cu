// bench_kernels.cu: the device-check measurements, timed with CUDA events
// (median of repeats after two warm-ups), written as TSV rows for
// cuda/bench/device_report.py (which prints the tables; its docstring names
// every column):
//   ceilings   large device-to-device copy (bytes read + written), large
//              bf16 cuBLAS matmul (8192^3), measured first in the same run
//   decode     FlashInfer (the production attention: FlashInferAttention's
//              run() of one layer, planned once per step as the engine does,
//              the plan not timed), batch 1/16/64/256 x context 1k/8k/32k, GQA
//              4:1 (32 q heads) and 8:1 (64 q heads) over 8 kv heads, D 128,
//              page 32, pages in a shuffled order: time, GB/s of K+V read, %
//              of the copy ceiling; then the hand-written kernels
//              (attn_decode + attn_merge: production uses them only for head
//              dims 16/32) at the GQA 4:1 shapes, labelled "handwritten"
//   prefill    FlashInfer causal paged prefill, batch 1, chunk 512/2k/8k over
//              a cached prefix of 0/8k/32k, GQA 4:1 and 8:1: time, TFLOP/s
//              (4 * D * q heads * query-key pairs), % of the matmul ceiling;
//              then the hand-written attn_chunk at the GQA 4:1 shapes
//   iteration  one full llama-8b step through engine.h at a few batch mixes
//   gemm       llama-8b's QKV (4096x6144) and gate+up (4096x28672) bf16 GEMMs at
//              1-1024 tokens: time (the twin's GEMM transition and kernel cost)
//   fixed      FlashInfer's batch-1 decode at 128 tokens of context and a
//              128-token chunk at depth 0 (GQA 4:1), whose traffic takes < 1 us:
//              the attention kernels' fixed cost
//   elementwise  RMSNorm of 1 and 4096 rows of 4096: rows, bytes, time
//   mla        FlashInfer's MLA kernel (attention/fi_mla.h) as the engine runs
//              it, DeepSeek-V3's geometry (128 heads, latent 512, rope 64),
//              latent pages of 32 in a shuffled order: decode batch
//              1/16/64/256 x context 1k/8k/32k (GB/s of latents read, % of
//              the copy ceiling) and prefill batch 1, chunk 512/2k over a
//              prefix of 0/8k (TFLOP/s, 2 * heads * (2 * 512 + 64) per
//              query-key pair, % of the matmul ceiling)
// A shape that fails (FlashInfer's planner or kernel refusing it) is written as
// an "error" row with the message and the run goes on; the exit status is then
// 1. Usage: cuda_bench OUT.tsv
#include <cublas_v2.h>
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "attention/fi_mla.h"
#include "attention/flashinfer_attn.h"
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
bool any_failed = false;

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
  std::fflush(tsv);
}

constexpr int kHkv = 8, kD = 128, kP = 32;

// The page slab of every attention shape: one layer, pages handed out in a
// shuffled order (a real pool's pages are scattered), disjoint per sequence.
struct Slab {
  __nv_bfloat16* data = nullptr;
  int64_t page_elems = int64_t(2) * kHkv * kP * kD;
  int64_t max_pages = 0;
  std::vector<int32_t> order;  // page of the k-th handed-out block
};

// A batch of `batch` sequences of (tokens, depth) each on the slab.
struct Shape {
  int batch, tokens, depth;
  int ctx() const { return depth + tokens; }
  int blocks() const { return (ctx() + kP - 1) / kP; }
  int rows() const { return batch * tokens; }
};

// Device queries and outputs for a shape, freed at scope end.
struct QO {
  void* q = nullptr;
  __nv_bfloat16* out = nullptr;
  QO(size_t q_bytes, size_t out_bytes) {
    TCHECK(cudaMalloc(&q, q_bytes));
    TCHECK(cudaMalloc(&out, out_bytes));
  }
  ~QO() {
    cudaFree(q);
    cudaFree(out);
  }
};

// FlashInfer, as the engine runs it: plan the step, time one layer's run().
double flashinfer_ms(const Shape& s, int hq, const Slab& slab, FlashInferAttention& fa) {
  std::vector<FiSeq> seqs;
  for (int i = 0; i < s.batch; ++i) seqs.push_back(FiSeq{s.tokens, s.ctx(), slab.order.data() + size_t(i) * s.blocks()});
  if (s.tokens == 1)
    fa.plan(seqs.data(), s.batch, nullptr, 0, /*graph_safe=*/false);
  else
    fa.plan(nullptr, 0, seqs.data(), s.batch, /*graph_safe=*/false);
  const size_t elems = size_t(s.rows()) * hq * kD;
  QO qo(elems * 2, elems * 2);
  fill_random(static_cast<__nv_bfloat16*>(qo.q), elems, 7);
  const auto* q = static_cast<const __nv_bfloat16*>(qo.q);
  return time_ms([&] { fa.run(slab.data, 0, q, qo.out, nullptr); }, s.tokens == 1 ? 11 : 5);
}

// The hand-written kernels (float32 queries), split-KV decode as the backend
// splits it.
double handwritten_ms(const Shape& s, int hq, const Slab& slab, int num_sms) {
  const int nb = s.blocks();
  std::vector<AttnSeq> seqs(static_cast<size_t>(s.batch));
  for (int i = 0; i < s.batch; ++i) seqs[size_t(i)] = AttnSeq{i * s.tokens, s.tokens, s.depth, i * nb, 0, s.ctx(), i, 0};
  int32_t* dblocks;
  AttnSeq* dseqs;
  float *o_part = nullptr, *lse_part = nullptr;
  const size_t elems = size_t(s.rows()) * hq * kD;
  QO qo(elems * 4, elems * 2);
  TCHECK(cudaMalloc(&dblocks, size_t(s.batch) * nb * 4));
  TCHECK(cudaMalloc(&dseqs, seqs.size() * sizeof(AttnSeq)));
  TCHECK(cudaMemcpy(dblocks, slab.order.data(), size_t(s.batch) * nb * 4, cudaMemcpyHostToDevice));
  TCHECK(cudaMemcpy(dseqs, seqs.data(), seqs.size() * sizeof(AttnSeq), cudaMemcpyHostToDevice));
  TCHECK(cudaMemset(qo.q, 0x3c, elems * 4));  // non-zero queries (~0.011)
  AttnArgs a;
  a.q = static_cast<const float*>(qo.q);
  a.q_stride = hq * kD;
  a.kv = PagedKV{slab.data, slab.page_elems, kP, kHkv, kD, 0};
  a.block_tables = dblocks;
  a.seqs = dseqs;
  a.num_seqs = s.batch;
  a.num_heads = hq;
  a.scale = 1.0f / std::sqrt(float(kD));
  a.out = qo.out;
  a.out_stride = hq * kD;
  const int64_t blocks_1 = int64_t(s.batch) * kHkv;
  if (s.tokens == 1 && s.ctx() > 1024 && blocks_1 < 2 * num_sms) {  // same rule as the backend
    const int splits = int(std::min<int64_t>((2 * num_sms + blocks_1 - 1) / blocks_1, (s.ctx() + 255) / 256));
    a.split_tokens = ((s.ctx() + splits - 1) / splits + 63) / 64 * 64;
    a.num_splits = (s.ctx() + a.split_tokens - 1) / a.split_tokens;
    a.part_rows = s.batch;
    TCHECK(cudaMalloc(&o_part, size_t(a.num_splits) * s.batch * hq * kD * 4));
    TCHECK(cudaMalloc(&lse_part, size_t(a.num_splits) * s.batch * hq * 4));
    a.o_part = o_part;
    a.lse_part = lse_part;
  }
  const double ms = time_ms([&] {
    if (s.tokens == 1) {
      attn_decode(a, nullptr);
      if (a.num_splits > 1) {
        MergeArgs m;
        m.o_part = o_part;
        m.lse_part = lse_part;
        m.num_parts = a.num_splits;
        m.part_items = int64_t(s.batch) * hq;
        m.num_heads = hq;
        m.head_dim = kD;
        m.out_bf16 = qo.out;
        m.out_stride = hq * kD;
        attn_merge(m, nullptr);
      }
    } else {
      attn_chunk(a, s.tokens, nullptr);
    }
  }, s.tokens == 1 ? 11 : 5);
  cudaFree(dblocks);
  cudaFree(dseqs);
  if (o_part) cudaFree(o_part);
  if (lse_part) cudaFree(lse_part);
  return ms;
}

// One decode or prefill row: kernel, group, shape, then the time and rates,
// or why it was not measured.
void attention_row(const char* kernel, int group, const Shape& s, const Slab& slab, FlashInferAttention* fa,
                   int num_sms, double copy_gbs, double mm_tflops) {
  const bool decode = s.tokens == 1;
  const char* kind = decode ? "decode" : "prefill";
  const int a = decode ? s.batch : s.tokens, b = decode ? s.ctx() : s.depth, hq = kHkv * group;
  const int64_t pages = int64_t(s.batch) * s.blocks();
  if (pages > slab.max_pages) {
    std::fprintf(tsv, "%s\t%s\t%d\t%d\t%d\tskipped\t%.0f GiB of KV\n", kind, kernel, group, a, b,
                 double(pages) * slab.page_elems * 2 / double(1 << 30));
    return;
  }
  try {
    const double ms = fa != nullptr ? flashinfer_ms(s, hq, slab, *fa) : handwritten_ms(s, hq, slab, num_sms);
    if (decode) {
      const double gbs = double(s.batch) * s.ctx() * kHkv * kD * 2 * 2 / (ms * 1e6);
      std::fprintf(tsv, "decode\t%s\t%d\t%d\t%d\t%.4f\t%.1f\t%.1f\n", kernel, group, a, b, ms, gbs,
                   100 * gbs / copy_gbs);
    } else {
      const double flops = 4.0 * kD * hq * (double(s.tokens) * s.depth + double(s.tokens) * (s.tokens + 1) / 2);
      const double tf = flops / (ms * 1e9);
      std::fprintf(tsv, "prefill\t%s\t%d\t%d\t%d\t%.4f\t%.1f\t%.1f\n", kernel, group, a, b, ms, tf,
                   100 * tf / mm_tflops);
    }
    std::printf("%s %s GQA %d:1 %d x %d: %.4f ms\n", kernel, kind, group, a, b, ms);
  } catch (const EngineError& e) {
    std::string msg = e.what();
    std::replace(msg.begin(), msg.end(), '\t', ' ');
    std::replace(msg.begin(), msg.end(), '\n', ' ');
    std::fprintf(tsv, "%s\t%s\t%d\t%d\t%d\terror\t%s\n", kind, kernel, group, a, b, msg.c_str());
    std::printf("FAIL: %s %s GQA %d:1 %d x %d: %s\n", kernel, kind, group, a, b, msg.c_str());
    any_failed = true;
  }
  std::fflush(tsv);
  std::fflush(stdout);
}

// The twin's per-kernel figures (docs/twin.md, "A measured profile"):
// device-check.sh turns these rows into gemm_kernel_ms, gemm_weight_gbps,
// attention_kernel_ms, elementwise_kernel_ms and elementwise_gbps.
void twin_kernel_bench(const Slab& slab, FlashInferAttention& fa) {
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
  std::fprintf(tsv, "fixed\tdecode\t%.4f\n", flashinfer_ms(Shape{1, 1, 127}, kHkv * 4, slab, fa));
  std::fprintf(tsv, "fixed\tchunk\t%.4f\n", flashinfer_ms(Shape{1, 128, 0}, kHkv * 4, slab, fa));
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
    std::fflush(tsv);
  }
  eng_engine_free(e);
}

}  // namespace

// FlashInfer's MLA kernel over latent pages laid over the slab's memory.
void mla_bench(const Slab& slab, double copy_gbs, double mm_tflops) {
  constexpr int kHeads = 128, kLatent = FlashInferMla::kLatent, kRope = FlashInferMla::kRope, kW = kLatent + kRope;
  const int64_t page_elems = int64_t(kP) * kW;  // one layer
  const int64_t max_pages = slab.max_pages * slab.page_elems / page_elems;
  std::vector<int32_t> order(static_cast<size_t>(max_pages));
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), std::mt19937_64(43));
  FlashInferMla mla(kHeads, kP, page_elems, nullptr);
  auto row = [&](int batch, int tokens, int depth) {
    const bool decode = tokens == 1;
    const int ctx = depth + tokens, blocks = (ctx + kP - 1) / kP;
    const int a = decode ? batch : tokens, b = decode ? ctx : depth;
    const char* kind = decode ? "decode" : "prefill";
    if (int64_t(batch) * blocks > max_pages) {
      std::fprintf(tsv, "mla\t%s\tflashinfer\t%d\t%d\t%d\tskipped\tlatents over the slab\n", kind, kHeads, a, b);
      return;
    }
    try {
      std::vector<FiSeq> seqs;
      for (int i = 0; i < batch; ++i) seqs.push_back(FiSeq{tokens, ctx, order.data() + size_t(i) * blocks});
      if (decode)
        mla.plan(seqs.data(), batch, nullptr, 0);
      else
        mla.plan(nullptr, 0, seqs.data(), batch);
      const size_t rows = size_t(batch) * tokens;
      QO qo(rows * kHeads * kW * 2, rows * kHeads * kLatent * 2);
      fill_random(static_cast<__nv_bfloat16*>(qo.q), rows * kHeads * kW, 9);
      const auto* q = static_cast<const __nv_bfloat16*>(qo.q);
      const float scale = 1.0f / std::sqrt(float(128 + kRope));
      const double ms = time_ms([&] { mla.run(slab.data, 0, q, q + kLatent, int64_t(kHeads) * kW, kW, scale, qo.out); },
                                decode ? 11 : 5);
      if (decode) {
        const double gbs = double(batch) * ctx * kW * 2 / (ms * 1e6);
        std::fprintf(tsv, "mla\tdecode\tflashinfer\t%d\t%d\t%d\t%.4f\t%.1f\t%.1f\n", kHeads, a, b, ms, gbs,
                     100 * gbs / copy_gbs);
      } else {
        const double pairs = double(tokens) * depth + double(tokens) * (tokens + 1) / 2;
        const double tf = 2.0 * kHeads * (2 * kLatent + kRope) * pairs / (ms * 1e9);
        std::fprintf(tsv, "mla\tprefill\tflashinfer\t%d\t%d\t%d\t%.4f\t%.1f\t%.1f\n", kHeads, a, b, ms, tf,
                     100 * tf / mm_tflops);
      }
      std::printf("flashinfer MLA %s %d x %d: %.4f ms\n", kind, a, b, ms);
    } catch (const EngineError& e) {
      std::string msg = e.what();
      std::replace(msg.begin(), msg.end(), '\t', ' ');
      std::replace(msg.begin(), msg.end(), '\n', ' ');
      std::fprintf(tsv, "mla\t%s\tflashinfer\t%d\t%d\t%d\terror\t%s\n", kind, kHeads, a, b, msg.c_str());
      std::printf("FAIL: flashinfer MLA %s %d x %d: %s\n", kind, a, b, msg.c_str());
      any_failed = true;
    }
    std::fflush(tsv);
    std::fflush(stdout);
  };
  for (int batch : {1, 16, 64, 256})
    for (int ctx : {1024, 8192, 32768}) row(batch, 1, ctx - 1);
  for (int chunk : {512, 2048})
    for (int depth : {0, 8192}) row(1, chunk, depth);
}

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
    Slab slab;
    slab.max_pages = (int64_t(40) << 30) / (slab.page_elems * 2);
    TCHECK(cudaMalloc(&slab.data, size_t(slab.max_pages * slab.page_elems * 2)));
    fill_random(slab.data, size_t(slab.max_pages * slab.page_elems), 3);
    slab.order.resize(size_t(slab.max_pages));
    std::iota(slab.order.begin(), slab.order.end(), 0);
    std::shuffle(slab.order.begin(), slab.order.end(), std::mt19937_64(42));

    const int batches[] = {1, 16, 64, 256}, contexts[] = {1024, 8192, 32768};
    const int chunks[] = {512, 2048, 8192}, depths[] = {0, 8192, 32768};
    for (const char* kernel : {"flashinfer", "handwritten"}) {
      const bool fi = kernel[0] == 'f';
      for (int group : {4, 8}) {
        if (!fi && group != 4) continue;  // reference rows at GQA 4:1 only
        // One FlashInfer instance per head count, as an engine has one.
        std::unique_ptr<FlashInferAttention> fa;
        if (fi) fa = std::make_unique<FlashInferAttention>(kHkv * group, kHkv, kD, kP, slab.page_elems, nullptr);
        for (int batch : batches)
          for (int ctx : contexts)
            attention_row(kernel, group, Shape{batch, 1, ctx - 1}, slab, fa.get(), sms, copy_gbs, mm_tflops);
        for (int chunk : chunks)
          for (int depth : depths)
            attention_row(kernel, group, Shape{1, chunk, depth}, slab, fa.get(), sms, copy_gbs, mm_tflops);
      }
    }
    {
      FlashInferAttention fa(kHkv * 4, kHkv, kD, kP, slab.page_elems, nullptr);
      twin_kernel_bench(slab, fa);
    }
    mla_bench(slab, copy_gbs, mm_tflops);
    cudaFree(slab.data);
    iteration_bench();
  } catch (const EngineError& e) {
    std::printf("FAIL: %s\n", e.what());
    return 1;
  }
  std::fclose(tsv);
  std::printf("cuda_bench: wrote %s%s\n", argc > 1 ? argv[1] : "bench.tsv",
              any_failed ? " (some shapes failed: error rows)" : "");
  return any_failed ? 1 : 0;
}
