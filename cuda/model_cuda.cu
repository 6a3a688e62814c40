// model_cuda.cu: the CUDA backend's forward step (see model_cuda.h).
#include "model_cuda.h"
#include "model_cuda_internal.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>

#include "kernels/argmax.cuh"
#include "kernels/attn_chunk.cuh"
#include "kernels/attn_decode.cuh"
#include "kernels/attn_merge.cuh"
#include "kernels/embed.cuh"
#include "kernels/kv_append.cuh"
#include "kernels/mla.cuh"
#include "kernels/moe.cuh"
#include "kernels/q_pack.cuh"
#include "kernels/rmsnorm.cuh"
#include "kernels/rope.cuh"
#include "kernels/swiglu.cuh"
#include "kernels/weights_gen.cuh"
#include "checkpoint.h"
#include "cp_group.h"
#include "presets.h"
#include "sampling.h"
#include "weights.h"

namespace lockstep {

using cuda_internal::at;
using cuda_internal::gen_tensor;
using cuda_internal::round_up;

namespace {

// Decode contexts up to this many keys never split (one block per kv head
// already streams them fast enough); longer ones split to fill the GPU.
constexpr int32_t kNoSplitContext = 1024;

}  // namespace

namespace {
// Checks that device_id names a visible device and makes it current; runs
// before the members that create CUDA objects (stream, events), so that
// they are made on that device.
int32_t select_device(int32_t device_id) {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess || count == 0) {
    cudaGetLastError();
    throw EngineError(ENG_UNSUPPORTED, std::string("CUDA backend: no CUDA device available (") +
                                           (err != cudaSuccess ? cudaGetErrorString(err) : "0 devices") + ")");
  }
  if (device_id >= count)
    throw EngineError(ENG_INVALID_ARGUMENT, "device_id " + std::to_string(device_id) + " but only " +
                                                std::to_string(count) + " CUDA devices are visible");
  CUDA_CHECK(cudaSetDevice(device_id));
  return device_id;
}
}  // namespace

CudaBackend::CudaBackend(const EngineParams& p)
    : shape_(p.shape), device_(select_device(p.device_id)), tokens_per_page_(p.tokens_per_page) {
  const int32_t D = shape_.head_dim, G = shape_.num_heads / shape_.num_kv_heads;
  mla_ = shape_.kv_lora_rank > 0;
  if (mla_) {
    rope_mag_ = rope_magnitude(shape_);
    attn_scale_ = attention_scale(shape_);
  }
  if (!mla_ && (!attn_chunk_supported(D) || !attn_decode_supported(D, G)))
    throw EngineError(ENG_UNSUPPORTED, "CUDA backend: head_dim " + std::to_string(D) + " with GQA group " +
                                           std::to_string(G) + " is not built (head_dim 16/32/64/128, group <= " +
                                           std::to_string(kDecodeMaxGroup) + ")");
  CUDA_CHECK(cudaDeviceGetAttribute(&num_sms_, cudaDevAttrMultiProcessorCount, device_));
  stream_ = stream_holder_.get();
  gemm_ = std::make_unique<Gemm>(stream_);
  if (mla_) {
    // One latent plane per layer (step_layout.h latent_offset).
    const int32_t W = shape_.kv_lora_rank + shape_.qk_rope_head_dim;
    pages_ = std::make_unique<PagePool>(p.num_pages, p.num_host_pages, p.tokens_per_page, shape_.num_layers,
                                        /*num_kv_heads=*/1, W, stream_, /*planes=*/1);
    if (FlashInferMla::supported(shape_.kv_lora_rank, shape_.qk_rope_head_dim))
      fi_mla_ = std::make_unique<FlashInferMla>(shape_.num_heads, tokens_per_page_, pages_->page_elems(), stream_);
  } else {
    pages_ = std::make_unique<PagePool>(p.num_pages, p.num_host_pages, p.tokens_per_page,
                                        shape_.num_layers, shape_.num_kv_heads, D, stream_);
  }
  if (!mla_ && FlashInferAttention::supported(D, G))
    fi_ = std::make_unique<FlashInferAttention>(shape_.num_heads, shape_.num_kv_heads, D, tokens_per_page_,
                                                pages_->page_elems(), stream_);
  if (p.num_tensors > 0)
    load_weights(p.tensors, p.num_tensors);
  else
    generate_weights(p.seed);
  upload_inv_freq();
  CUDA_CHECK(cudaStreamSynchronize(stream_));
  init_decode_graphs();
}

CudaBackend::~CudaBackend() {
  // Best effort: queued work must finish before the buffers are freed.
  if (stream_) {
    cudaSetDevice(device_);
    cudaStreamSynchronize(stream_);
  }
  // The members (buffers, cuBLAS handle, events, stream) free themselves.
}

#ifdef ENGINE_HAVE_NCCL
std::unique_ptr<NcclComm> cuda_internal::open_group_nccl(Exchange* group, const ExchangeTag& tag, int device,
                                                         cudaStream_t stream, int timeout_ms, const char* what) {
  const int rank = group->rank(), size = group->size();
  NcclUniqueIdBytes id{};
  if (rank == 0) id = NcclComm::new_unique_id();
  std::vector<std::vector<char>> all;
  group->allgather(tag, id.data(), rank == 0 ? id.size() : 0, &all);
  if (all.size() != size_t(size) || all[0].size() != id.size())
    throw EngineError(ENG_COMM_ERROR, std::string(what) + " NCCL bootstrap: member 0 sent " +
                                          std::to_string(all.empty() ? 0 : all[0].size()) +
                                          " bytes of unique id, not " + std::to_string(id.size()));
  std::memcpy(id.data(), all[0].data(), id.size());
  return std::make_unique<NcclComm>(id, rank, size, device, stream, timeout_ms);
}
#endif

std::unique_ptr<Backend> make_cuda_backend(const EngineParams& params) {
  // Refused before any device memory is touched (docs/cuda.md).
  if (params.shape.qk_norm)
    throw EngineError(ENG_UNSUPPORTED, "the CUDA backend has no per-head q/k RMSNorm (qk_norm, Qwen3) yet");
  if (params.shape.qkv_bias)
    throw EngineError(ENG_UNSUPPORTED, "the CUDA backend has no q/k/v projection biases (qkv_bias, Qwen2) yet");
  if (params.shape.embedding_scale != 0 || params.shape.residual_scale != 0 || params.shape.attention_scale != 0 ||
      params.shape.logit_scale != 0)
    throw EngineError(ENG_UNSUPPORTED, "the CUDA backend has no Granite multipliers (embedding, residual, attention, logit scales) yet");
  const eng_model_shape& g = params.shape;
  if (g.mlp_gelu || g.post_norms || g.attn_softcap != 0 || g.final_softcap != 0 || g.sliding_window != 0 ||
      g.rope_local_theta != 0 || g.rope_linear_factor != 0)
    throw EngineError(ENG_UNSUPPORTED, "the CUDA backend has no Gemma layers (GELU MLP, post norms, soft-capping, "
                                       "sliding-window attention, local or linear RoPE) yet");
  if (g.partial_rotary_dim != 0 || g.rope_attn_factor != 0)
    throw EngineError(ENG_UNSUPPORTED, "the CUDA backend has no partial RoPE or LongRoPE attention factor (Phi-4-mini, "
                                       "Phi-3.5) yet");
  if (params.shape.kv_lora_rank == 0 &&
      int64_t{params.shape.num_heads} * params.shape.head_dim != params.shape.hidden_size)
    throw EngineError(ENG_UNSUPPORTED, "the CUDA backend needs hidden_size == num_heads * head_dim");
  return std::make_unique<CudaBackend>(params);
}

void CudaBackend::generate_weights(uint64_t seed) {
  const int64_t H = shape_.hidden_size, D = shape_.head_dim;
  const int64_t qd = shape_.num_heads * D, kvd = shape_.num_kv_heads * D;
  const int64_t F = shape_.intermediate_size, V = shape_.vocab_size;
  const size_t bf = sizeof(__nv_bfloat16);
  // value = u * 1/sqrt(fan_in) for projections, 1 + u/8 for norms, u for the embedding.
  auto gen = [&](TensorKind kind, int layer, int64_t rows, int64_t cols, int64_t ld, int64_t col_off) {
    return gen_tensor(seed, tensor_id(kind, layer), rows, cols, ld, col_off, rows);
  };
  auto norm = [&](TensorKind kind, int layer, DeviceBuffer& buf) {
    buf.reserve(size_t(H) * sizeof(float));
    GenTensor t = gen(kind, layer, 1, H, H, 0);
    t.scale = 0.125f;
    t.bias = 1.0f;
    generate_f32(t, buf.as<float>(), stream_);
  };

  embedding_.reserve(size_t(V * H) * bf);
  GenTensor e = gen(TensorKind::kEmbedding, -1, V, H, H, 0);
  e.scale = 1.0f;
  generate_bf16(e, embedding_.as<__nv_bfloat16>(), stream_);
  norm(TensorKind::kFinalNorm, -1, final_norm_);
  lm_head_.reserve(size_t(H * V) * bf);
  generate_bf16(gen(TensorKind::kLMHead, -1, H, V, V, 0), lm_head_.as<__nv_bfloat16>(), stream_);

  layers_.resize(size_t(shape_.num_layers));
  for (int l = 0; l < shape_.num_layers; ++l) {
    CudaLayer& L = layers_[size_t(l)];
    norm(TensorKind::kAttnNorm, l, L.attn_norm);
    norm(TensorKind::kMLPNorm, l, L.mlp_norm);
    if (mla_) {
      generate_mla(seed, l);
    } else {
      const int64_t qkv = qd + 2 * kvd;
      L.wqkv.reserve(size_t(H * qkv) * bf);
      generate_bf16(gen(TensorKind::kWq, l, H, qd, qkv, 0), L.wqkv.as<__nv_bfloat16>(), stream_);
      generate_bf16(gen(TensorKind::kWk, l, H, kvd, qkv, qd), L.wqkv.as<__nv_bfloat16>(), stream_);
      generate_bf16(gen(TensorKind::kWv, l, H, kvd, qkv, qd + kvd), L.wqkv.as<__nv_bfloat16>(), stream_);
      L.wo.reserve(size_t(qd * H) * bf);
      generate_bf16(gen(TensorKind::kWo, l, qd, H, H, 0), L.wo.as<__nv_bfloat16>(), stream_);
    }
    if (moe_layer(shape_, l)) {
      generate_moe(seed, l, gen);
      continue;
    }
    L.wgu.reserve(size_t(H * 2 * F) * bf);
    generate_bf16(gen(TensorKind::kWGate, l, H, F, 2 * F, 0), L.wgu.as<__nv_bfloat16>(), stream_);
    generate_bf16(gen(TensorKind::kWUp, l, H, F, 2 * F, F), L.wgu.as<__nv_bfloat16>(), stream_);
    L.wdown.reserve(size_t(F * H) * bf);
    generate_bf16(gen(TensorKind::kWDown, l, F, H, H, 0), L.wdown.as<__nv_bfloat16>(), stream_);
  }

}

// The MoE weights of layer l, generated as the CPU backend generates them
// (weights.cpp: router, shared experts, generate_expert; a sigmoid router's
// bias on the host).
template <class Gen>
void CudaBackend::generate_moe(uint64_t seed, int l, Gen&& gen) {
  const int64_t H = shape_.hidden_size, E = shape_.num_experts, Fm = shape_.moe_intermediate_size;
  const int64_t Fs = int64_t(shape_.num_shared_experts) * Fm;
  const size_t bf = sizeof(__nv_bfloat16);
  CudaLayer& L = layers_[size_t(l)];
  L.moe = true;
  L.router.reserve(size_t(H * E) * bf);
  generate_bf16(gen(TensorKind::kRouter, l, H, E, E, 0), L.router.as<__nv_bfloat16>(), stream_);
  if (shape_.router_norm == ENG_ROUTER_SIGMOID_TOPK || shape_.router_norm == ENG_ROUTER_SIGMOID_TOPK_RAW) {
    L.router_bias.resize(size_t(E));
    for (size_t i = 0; i < L.router_bias.size(); ++i)
      L.router_bias[i] = uniform_pm1(seed, mla_tensor_id(TensorKind::kRouterBias, l), i) * 0.125f;
  }
  auto swiglu_pair = [&](CudaExpert& x, int64_t F, GenTensor g, GenTensor u, GenTensor d) {
    x.wgu.reserve(size_t(H * 2 * F) * bf);
    x.wdown.reserve(size_t(F * H) * bf);
    generate_bf16(g, x.wgu.as<__nv_bfloat16>(), stream_);
    generate_bf16(u, x.wgu.as<__nv_bfloat16>(), stream_);
    generate_bf16(d, x.wdown.as<__nv_bfloat16>(), stream_);
  };
  if (Fs > 0)
    swiglu_pair(L.shared, Fs, gen(TensorKind::kSharedGate, l, H, Fs, 2 * Fs, 0),
                gen(TensorKind::kSharedUp, l, H, Fs, 2 * Fs, Fs), gen(TensorKind::kSharedDown, l, Fs, H, H, 0));
  L.experts.resize(size_t(E));
  for (int e = 0; e < int(E); ++e) {
    auto expert = [&](TensorKind kind, int64_t rows, int64_t cols, int64_t ld, int64_t col_off) {
      GenTensor t = gen(kind, l, rows, cols, ld, col_off);
      t.tensor_id = expert_tensor_id(kind, l, e);
      return t;
    };
    swiglu_pair(L.experts[size_t(e)], Fm, expert(TensorKind::kExpertGate, H, Fm, 2 * Fm, 0),
                expert(TensorKind::kExpertUp, H, Fm, 2 * Fm, Fm), expert(TensorKind::kExpertDown, Fm, H, H, 0));
  }
}

// Checkpoint weights (validated by engine.cpp): each tensor is converted on
// the host, one at a time, to float32 in the CPU backend's input-major layout
// (checkpoint.h), rounded to bf16 (norms stay float32) and copied into its
// place in the fused device buffers; the upload ends with a device
// synchronise (see the end).
void CudaBackend::load_weights(const eng_tensor* tensors, int32_t n) {
  const int64_t H = shape_.hidden_size, D = shape_.head_dim;
  const int64_t qd = shape_.num_heads * D, kvd = shape_.num_kv_heads * D;
  const int64_t F = shape_.intermediate_size, V = shape_.vocab_size, qkv = qd + 2 * kvd;
  const size_t bf = sizeof(__nv_bfloat16);
  embedding_.reserve(size_t(V * H) * bf);
  lm_head_.reserve(size_t(H * V) * bf);
  final_norm_.reserve(size_t(H) * sizeof(float));
  layers_.resize(size_t(shape_.num_layers));
  const int64_t E = shape_.num_experts, Fm = shape_.moe_intermediate_size;
  const int64_t Fs = int64_t(shape_.num_shared_experts) * Fm;
  for (int32_t l = 0; l < shape_.num_layers; ++l) {
    CudaLayer& L = layers_[size_t(l)];
    L.attn_norm.reserve(size_t(H) * sizeof(float));
    L.mlp_norm.reserve(size_t(H) * sizeof(float));
    if (mla_) {
      const int64_t heads = shape_.num_heads, QL = shape_.q_lora_rank, KL = shape_.kv_lora_rank;
      const int64_t R = shape_.qk_rope_head_dim, N = shape_.qk_nope_head_dim, Vd = shape_.v_head_dim;
      if (QL > 0) {
        L.wqa.reserve(size_t(H * QL) * bf);
        L.qa_norm.reserve(size_t(QL) * sizeof(float));
      }
      L.wqb.reserve(size_t((QL > 0 ? QL : H) * heads * (N + R)) * bf);
      L.wkva.reserve(size_t(H * (KL + R)) * bf);
      L.kva_norm.reserve(size_t(KL) * sizeof(float));
      L.wkb.reserve(size_t(heads * N * KL) * bf);
      L.wvb.reserve(size_t(heads * KL * Vd) * bf);
      L.wo.reserve(size_t(heads * Vd * H) * bf);
    } else {
      L.wqkv.reserve(size_t(H * qkv) * bf);
      L.wo.reserve(size_t(qd * H) * bf);
    }
    if (!moe_layer(shape_, l)) {
      L.wgu.reserve(size_t(H * 2 * F) * bf);
      L.wdown.reserve(size_t(F * H) * bf);
      continue;
    }
    L.moe = true;
    L.router.reserve(size_t(H * E) * bf);
    L.experts.resize(size_t(E));
    for (CudaExpert& x : L.experts) {
      x.wgu.reserve(size_t(H * 2 * Fm) * bf);
      x.wdown.reserve(size_t(Fm * H) * bf);
    }
    if (Fs > 0) {
      L.shared.wgu.reserve(size_t(H * 2 * Fs) * bf);
      L.shared.wdown.reserve(size_t(Fs * H) * bf);
    }
  }
  std::vector<float> host;
  std::vector<__nv_bfloat16> host_bf;
  // Copies the [in][out] float matrix `host` as bf16 into dst (row pitch ld
  // elements, starting at column col_off).
  auto put_bf16 = [&](DeviceBuffer& dst, int64_t in, int64_t out, int64_t ld, int64_t col_off) {
    host_bf.resize(host.size());
    for (size_t i = 0; i < host.size(); ++i) host_bf[i] = __float2bfloat16(host[i]);
    CUDA_CHECK(cudaMemcpy2D(dst.as<__nv_bfloat16>() + col_off, size_t(ld) * bf, host_bf.data(), size_t(out) * bf,
                            size_t(out) * bf, size_t(in), cudaMemcpyHostToDevice));
  };
  auto put_f32 = [&](DeviceBuffer& dst) {
    CUDA_CHECK(cudaMemcpy(dst.as<float>(), host.data(), host.size() * sizeof(float), cudaMemcpyHostToDevice));
  };
  LayerWeights mla_host;  // one MLA tensor at a time, converted by the CPU's loader (checkpoint.h)
  auto put_packed = [&](DeviceBuffer& dst, const std::vector<float>& src) {
    host_bf.resize(src.size());
    for (size_t i = 0; i < src.size(); ++i) host_bf[i] = __float2bfloat16(src[i]);
    CUDA_CHECK(cudaMemcpy(dst.as<void>(), host_bf.data(), host_bf.size() * bf, cudaMemcpyHostToDevice));
  };
  for (int32_t i = 0; i < n; ++i) {
    const eng_tensor& t = tensors[i];
    if (mla_ && t.layer >= 0 && load_mla_tensor(shape_, t, &mla_host)) {
      CudaLayer& L = layers_[size_t(t.layer)];
      if (!mla_host.wq.empty()) put_packed(L.wqb, mla_host.wq);
      if (!mla_host.wkv_a.empty()) put_packed(L.wkva, mla_host.wkv_a);
      if (!mla_host.w_kb.empty()) put_packed(L.wkb, mla_host.w_kb);
      if (!mla_host.w_vb.empty()) put_packed(L.wvb, mla_host.w_vb);
      mla_host = LayerWeights{};
      continue;
    }
    host.resize(size_t(t.rows * t.cols));
    tensor_to_input_major(t, int32_t(D), host.data());  // [cols][rows]
    const int64_t in = t.cols, out = t.rows;
    switch (t.kind) {
      case ENG_WEIGHT_EMBEDDING:
        // The lookup table is [vocab][hidden]: the tensor's own layout.
        host_bf.resize(host.size());
        for (int64_t r = 0; r < V; ++r)
          for (int64_t c = 0; c < H; ++c) host_bf[size_t(r * H + c)] = __float2bfloat16(host[size_t(c * V + r)]);
        CUDA_CHECK(cudaMemcpy(embedding_.as<void>(), host_bf.data(), host_bf.size() * bf, cudaMemcpyHostToDevice));
        if (shape_.tied_embeddings) put_bf16(lm_head_, in, out, V, 0);
        break;
      case ENG_WEIGHT_LM_HEAD: put_bf16(lm_head_, in, out, V, 0); break;
      case ENG_WEIGHT_FINAL_NORM: put_f32(final_norm_); break;
      case ENG_WEIGHT_ATTN_NORM: put_f32(layers_[size_t(t.layer)].attn_norm); break;
      case ENG_WEIGHT_MLP_NORM: put_f32(layers_[size_t(t.layer)].mlp_norm); break;
      case ENG_WEIGHT_WQ: put_bf16(layers_[size_t(t.layer)].wqkv, in, out, qkv, 0); break;
      case ENG_WEIGHT_WK: put_bf16(layers_[size_t(t.layer)].wqkv, in, out, qkv, qd); break;
      case ENG_WEIGHT_WV: put_bf16(layers_[size_t(t.layer)].wqkv, in, out, qkv, qd + kvd); break;
      case ENG_WEIGHT_WO: put_bf16(layers_[size_t(t.layer)].wo, in, out, H, 0); break;
      case ENG_WEIGHT_W_GATE: put_bf16(layers_[size_t(t.layer)].wgu, in, out, 2 * F, 0); break;
      case ENG_WEIGHT_W_UP: put_bf16(layers_[size_t(t.layer)].wgu, in, out, 2 * F, F); break;
      case ENG_WEIGHT_W_DOWN: put_bf16(layers_[size_t(t.layer)].wdown, in, out, H, 0); break;
      case ENG_WEIGHT_ROPE_FREQS: rope_freqs_ = host; break;  // applied by upload_inv_freq
      case ENG_WEIGHT_ROUTER: put_bf16(layers_[size_t(t.layer)].router, in, out, E, 0); break;
      case ENG_WEIGHT_ROUTER_BIAS: layers_[size_t(t.layer)].router_bias = host; break;
      case ENG_WEIGHT_EXPERT_GATE: put_bf16(layers_[size_t(t.layer)].experts[size_t(t.expert)].wgu, in, out, 2 * Fm, 0); break;
      case ENG_WEIGHT_EXPERT_UP: put_bf16(layers_[size_t(t.layer)].experts[size_t(t.expert)].wgu, in, out, 2 * Fm, Fm); break;
      case ENG_WEIGHT_EXPERT_DOWN: put_bf16(layers_[size_t(t.layer)].experts[size_t(t.expert)].wdown, in, out, H, 0); break;
      case ENG_WEIGHT_SHARED_GATE: put_bf16(layers_[size_t(t.layer)].shared.wgu, in, out, 2 * Fs, 0); break;
      case ENG_WEIGHT_SHARED_UP: put_bf16(layers_[size_t(t.layer)].shared.wgu, in, out, 2 * Fs, Fs); break;
      case ENG_WEIGHT_SHARED_DOWN: put_bf16(layers_[size_t(t.layer)].shared.wdown, in, out, H, 0); break;
      case ENG_WEIGHT_Q_A: put_bf16(layers_[size_t(t.layer)].wqa, in, out, out, 0); break;
      case ENG_WEIGHT_Q_A_NORM: put_f32(layers_[size_t(t.layer)].qa_norm); break;
      case ENG_WEIGHT_KV_A_NORM: put_f32(layers_[size_t(t.layer)].kva_norm); break;
      default: break;  // KV_A, KV_B, K_B, V_B: load_mla_tensor above
    }
  }
  // The copies above are synchronous copies from pageable memory on the
  // legacy default stream: cudaMemcpy may return once the source is staged,
  // before the DMA into the weights has finished, and the engine's stream is
  // non-blocking (it does not wait for the legacy stream). Synchronising the
  // device here makes every weight resident before the first step reads it.
  CUDA_CHECK(cudaDeviceSynchronize());
}

void CudaBackend::upload_inv_freq() {
  // RoPE inverse frequencies in double, exactly as the CPU computes them
  // (with Llama-3 scaling when the shape has it).
  const std::vector<double> inv = rope_inv_freq(shape_, rope_freqs_);
  inv_freq_.reserve(inv.size() * sizeof(double));
  CUDA_CHECK(cudaMemcpyAsync(inv_freq_.as<void>(), inv.data(), inv.size() * sizeof(double),
                             cudaMemcpyHostToDevice, stream_));
  CUDA_CHECK(cudaStreamSynchronize(stream_));  // `inv` is pageable and goes out of scope
}

// Builds every per-step descriptor in one pinned buffer (step_layout.h) and
// queues one copy.
void CudaBackend::upload_descriptors(const StepBatch& b) {
  size_step_desc(b, &desc_, cp_ != nullptr ? cp_share_ : HelixShare{}, /*row_list=*/mla_ && !fi_mla_);
  host_desc_.reserve(desc_.total * sizeof(int32_t));
  dev_desc_.reserve(desc_.total * sizeof(int32_t));
  int32_t* h = host_desc_.as<int32_t>();
  fill_step_desc(b, tokens_per_page_, &desc_, h);
  CUDA_CHECK(cudaMemcpyAsync(dev_desc_.as<void>(), h, desc_.total * sizeof(int32_t),
                             cudaMemcpyHostToDevice, stream_));
  // FlashInfer's work split for this step (host), shared by every layer.
  // (An expert-parallel member's empty step has no attention; a Helix step
  // uses the hand-written kernel.)
  if (fi_mla_ && desc_.rows > 0 && cp_ == nullptr)
    fi_mla_->plan(desc_.fi_decode.data(), desc_.n_decode, desc_.fi_chunks.data(), desc_.n_chunk);
  if (fi_ && desc_.rows > 0 && cp_ == nullptr)
    fi_->plan(desc_.fi_decode.data(), desc_.n_decode, desc_.fi_chunks.data(), desc_.n_chunk, /*graph_safe=*/false);
}

void CudaBackend::attention(int32_t layer) {
  if (cp_ != nullptr) return helix_attention(layer);
  const int32_t D = shape_.head_dim, Hq = shape_.num_heads, Hkv = shape_.num_kv_heads;
  const int64_t qkv_stride = int64_t(Hq + 2 * Hkv) * D;
  AttnArgs a;
  a.q = qkv_.as<float>();
  a.q_stride = qkv_stride;
  a.kv = pages_->view(layer);
  a.block_tables = at<int32_t>(dev_desc_, desc_.off_blocks);
  a.num_heads = Hq;
  a.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(D)));
  a.out = attn_.as<__nv_bfloat16>();
  a.out_stride = int64_t(Hq) * D;

  if (fi_) {
    // FlashInfer reads bf16 queries packed [rows][Hq][D].
    q_pack(qkv_.as<float>(), qkv_stride, desc_.rows, Hq * D, q_bf16_.as<__nv_bfloat16>(), stream_);
    fi_->run(pages_->device_page(0), layer, q_bf16_.as<__nv_bfloat16>(), a.out, /*lse=*/nullptr);
    return;
  }

  if (desc_.n_chunk > 0) {
    AttnArgs c = a;
    c.seqs = reinterpret_cast<const AttnSeq*>(at<int32_t>(dev_desc_, desc_.off_cseqs));
    c.num_seqs = desc_.n_chunk;
    attn_chunk(c, desc_.max_chunk_tokens, stream_);
  }
  if (desc_.n_decode > 0) {
    AttnArgs d = a;
    d.seqs = reinterpret_cast<const AttnSeq*>(at<int32_t>(dev_desc_, desc_.off_dseqs));
    d.num_seqs = desc_.n_decode;
    // Split long contexts until the grid has about two blocks per SM.
    const int64_t blocks = int64_t(desc_.n_decode) * Hkv;
    int32_t splits = 1;
    if (desc_.max_decode_ctx > kNoSplitContext && blocks < 2 * num_sms_) {
      splits = int32_t(std::min<int64_t>((2 * num_sms_ + blocks - 1) / blocks, (desc_.max_decode_ctx + 255) / 256));
    }
    if (splits > 1) {
      d.split_tokens = int32_t(round_up(size_t((desc_.max_decode_ctx + splits - 1) / splits), 64));
      d.num_splits = (desc_.max_decode_ctx + d.split_tokens - 1) / d.split_tokens;
      d.part_rows = desc_.n_decode;
      const size_t items = size_t(d.num_splits) * desc_.n_decode * Hq;
      o_part_.reserve(items * D * sizeof(float));
      lse_part_.reserve(items * sizeof(float));
      d.o_part = o_part_.as<float>();
      d.lse_part = lse_part_.as<float>();
      attn_decode(d, stream_);
      MergeArgs m;
      m.o_part = d.o_part;
      m.lse_part = d.lse_part;
      m.num_parts = d.num_splits;
      m.part_items = int64_t(desc_.n_decode) * Hq;
      m.num_heads = Hq;
      m.head_dim = D;
      m.out_rows = at<int32_t>(dev_desc_, desc_.off_decode_rows);
      m.out_bf16 = a.out;
      m.out_stride = a.out_stride;
      attn_merge(m, stream_);
    } else {
      attn_decode(d, stream_);
    }
  }
}

// Grows the per-step scratch to `rows` rows and `num_sampled` sampled rows
// (the decode graphs reserve their largest bucket here once, so that a
// captured step never reallocates).
void CudaBackend::reserve_scratch(int64_t R, int32_t num_sampled) {
  const int64_t H = shape_.hidden_size, D = shape_.head_dim, F = shape_.intermediate_size;
  const int64_t qd = int64_t(shape_.num_heads) * D, kvd = int64_t(shape_.num_kv_heads) * D;
  const int64_t qkv = qd + 2 * kvd;
  const size_t bf = sizeof(__nv_bfloat16);
  hidden_.reserve(size_t(R * H) * sizeof(float));
  xb_.reserve(size_t(R * std::max(H, F)) * bf);
  qkv_.reserve(size_t(R * qkv) * sizeof(float));
  attn_.reserve(size_t(R * std::max<int64_t>(qd, int64_t(shape_.num_heads) * shape_.v_head_dim)) * bf);
  if (mla_) {
    const int64_t heads = shape_.num_heads, QL = shape_.q_lora_rank, KL = shape_.kv_lora_rank;
    const int64_t W = KL + shape_.qk_rope_head_dim, qf = heads * (shape_.qk_nope_head_dim + shape_.qk_rope_head_dim);
    const int64_t Vd = shape_.v_head_dim;
    if (QL > 0) {
      mla_cq_.reserve(size_t(R * QL) * sizeof(float));
      mla_cqb_.reserve(size_t(R * QL) * bf);
    }
    mla_q_.reserve(size_t(R * qf) * sizeof(float));
    mla_qb_.reserve(size_t(R * qf) * bf);
    mla_kv_.reserve(size_t(R * W) * sizeof(float));
    mla_qa_.reserve(size_t(R * heads * W) * sizeof(float));
    if (fi_mla_) mla_qab_.reserve(size_t(R * heads * W) * bf);
    mla_o_.reserve(size_t(R * heads * KL) * bf);
    mla_v_.reserve(size_t(R * heads * Vd) * sizeof(float));
  }
  if (fi_) q_bf16_.reserve(size_t(R * qd) * bf);
  gu_.reserve(size_t(R * 2 * F) * sizeof(float));
  act_.reserve(size_t(R * F) * bf);
  logits_.reserve(size_t(std::max(num_sampled, 1)) * shape_.vocab_size * sizeof(float));
  if (cp_ != nullptr) {  // every member's partials: outputs and LSEs of R * Hq items
    const int64_t width = mla_ ? shape_.kv_lora_rank : D;  // a partial's output per (row, head)
    const size_t block = size_t(R) * shape_.num_heads * size_t(width + 1) * sizeof(float);
    helix_parts_.reserve(size_t(cp_share_.size) * block);
    if (!helix_nccl_) {
      helix_host_.reserve(block);
      helix_host_all_.reserve(size_t(cp_share_.size) * block);
    }
  }
  sampled_.reserve(size_t(std::max(num_sampled, 1)) * sizeof(int32_t));
  if (shape_.num_experts > 0) {
    // Every row takes top_k slots: the worst case of any layer, reserved
    // before the first launch (a buffer never moves under queued work).
    const int64_t E = shape_.num_experts, K = shape_.num_experts_per_tok, Fm = shape_.moe_intermediate_size;
    const int64_t Fs = int64_t(shape_.num_shared_experts) * Fm, S = R * K;
    moe_logits_.reserve(size_t(R * E) * sizeof(float));
    moe_desc_.reserve(size_t(S + 2 * S) * sizeof(int32_t));
    moe_x_.reserve(size_t(S * H) * bf);
    moe_y_.reserve(size_t(S * H) * sizeof(float));
    moe_gu_.reserve(size_t(std::max(S * 2 * Fm, R * 2 * Fs)) * sizeof(float));
    moe_act_.reserve(size_t(std::max(S * Fm, R * Fs)) * bf);
    if (Fs > 0) moe_m_.reserve(size_t(R * H) * sizeof(float));
  }
}

// The step set up by upload_descriptors (or upload_graph_descriptors):
// desc_.rows rows, desc_.num_sampled sampled rows. Only launches and cuBLAS
// calls once the scratch has its size, so that a decode graph can capture it.
void CudaBackend::forward(const StepBatch& b, bool want_logits) {
  (void)b;
  (void)want_logits;
  const int64_t H = shape_.hidden_size, D = shape_.head_dim, F = shape_.intermediate_size;
  const int64_t qd = int64_t(shape_.num_heads) * D, kvd = int64_t(shape_.num_kv_heads) * D;
  const int64_t qkv = qd + 2 * kvd, R = desc_.rows;
  reserve_scratch(R, desc_.num_sampled);
  if (R == 0) {
    // An expert-parallel member with no sequences still serves its experts
    // in every MoE layer (its peers' tokens), with no rows of its own.
    if (ep_ != nullptr)
      for (int32_t l = 0; l < shape_.num_layers; ++l)
        if (layers_[size_t(l)].moe) moe_mlp(l);
    return;
  }

  const int32_t* pos = at<int32_t>(dev_desc_, desc_.off_pos);
  float* hidden = hidden_.as<float>();
  embed(embedding_.as<__nv_bfloat16>(), at<int32_t>(dev_desc_, desc_.off_tokens), R, int32_t(H), hidden, stream_);
  for (int32_t l = 0; l < shape_.num_layers; ++l) {
    const CudaLayer& L = layers_[size_t(l)];
    rmsnorm(hidden, nullptr, L.attn_norm.as<float>(), int32_t(H), shape_.rms_eps, R,
            xb_.as<__nv_bfloat16>(), nullptr, stream_);
    if (mla_) {
      mla_attention_block(l);  // through W_o, += hidden
    } else {
      gemm_->bf16_f32(xb_.as<__nv_bfloat16>(), R, H, L.wqkv.as<__nv_bfloat16>(), qkv, qkv_.as<float>(), 0.0f);
      rope(qkv_.as<float>(), qkv, shape_.num_heads, int32_t(D), pos, inv_freq_.as<double>(), R, stream_);
      rope(qkv_.as<float>() + qd, qkv, shape_.num_kv_heads, int32_t(D), pos, inv_freq_.as<double>(), R, stream_);
      kv_append(pages_->view(l), qkv_.as<float>() + qd, qkv_.as<float>() + qd + kvd, qkv,
                at<int32_t>(dev_desc_, desc_.off_page), at<int32_t>(dev_desc_, desc_.off_slot), R, stream_);
      attention(l);
      gemm_->bf16_f32(attn_.as<__nv_bfloat16>(), R, qd, L.wo.as<__nv_bfloat16>(), H, hidden, 1.0f);
    }
    rmsnorm(hidden, nullptr, L.mlp_norm.as<float>(), int32_t(H), shape_.rms_eps, R,
            xb_.as<__nv_bfloat16>(), nullptr, stream_);
    if (L.moe) {
      moe_mlp(l);
      continue;
    }
    gemm_->bf16_f32(xb_.as<__nv_bfloat16>(), R, H, L.wgu.as<__nv_bfloat16>(), 2 * F, gu_.as<float>(), 0.0f);
    swiglu(gu_.as<float>(), R, int32_t(F), act_.as<__nv_bfloat16>(), stream_);
    gemm_->bf16_f32(act_.as<__nv_bfloat16>(), R, F, L.wdown.as<__nv_bfloat16>(), H, hidden, 1.0f);
  }
  if (desc_.num_sampled > 0) {
    rmsnorm(hidden, at<int32_t>(dev_desc_, desc_.off_sample), final_norm_.as<float>(), int32_t(H),
            shape_.rms_eps, desc_.num_sampled, xb_.as<__nv_bfloat16>(), nullptr, stream_);
    gemm_->bf16_f32(xb_.as<__nv_bfloat16>(), desc_.num_sampled, H, lm_head_.as<__nv_bfloat16>(),
                    shape_.vocab_size, logits_.as<float>(), 0.0f);
    argmax_rows(logits_.as<float>(), desc_.num_sampled, shape_.vocab_size, sampled_.as<int32_t>(), stream_);
  }
}

double CudaBackend::step(const StepBatch& batch, int32_t* sampled, float* logits) {
  float ms = 0.0f;
  ep_ = ep_size_ > 1 ? batch.ep : nullptr;
  if (ep_size_ > 1 && (ep_ == nullptr || ep_->size() != ep_size_ || ep_->rank() != ep_rank_))
    throw EngineError(ENG_INTERNAL, "MoE step with an EP group the engine did not join");
  cp_ = batch.cp != nullptr && batch.cp->size() > 1 ? batch.cp : nullptr;
  if (cp_ != nullptr && (cp_->size() != cp_share_.size || cp_->rank() != cp_share_.rank))
    throw EngineError(ENG_INTERNAL, "Helix step with a CP group the engine did not join");
  moe_stats_.last_step_wait_ms = 0;
  guarded("step", [&] {
    if (graph_eligible(batch)) {
      graph_step(batch, sampled, logits, &ms);
      return;
    }
    const auto t0 = std::chrono::steady_clock::now();
    if (graphs_on_) ++graph_stats_.eager;
    if (cp_ != nullptr) open_helix();
    upload_descriptors(batch);
    // Scratch growth (cudaFree/cudaMalloc) happens inside forward before the
    // first launch that uses it; the start event is recorded after it would
    // matter only for the first steps.
    CUDA_CHECK(cudaEventRecord(ev_start_.get(), stream_));
    forward(batch, logits != nullptr);
    CUDA_CHECK(cudaEventRecord(ev_stop_.get(), stream_));
    last_host_us_ = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
    const size_t V = size_t(shape_.vocab_size);
    const size_t ns = size_t(desc_.num_sampled);
    // Rows that need the host (temperature > 0 or logits processors: sampling_on_host) go to the host
    // with the native procedure (sampling.h), exactly as the CPU backend
    // does; greedy rows keep the device argmax.
    const bool host_rows = logits != nullptr || batch.num_stochastic > 0;
    host_out_.reserve(ns * sizeof(int32_t) + (host_rows ? ns * V * sizeof(float) : 0) + 16);
    int32_t* h_sampled = host_out_.as<int32_t>();
    float* h_logits = reinterpret_cast<float*>(h_sampled + round_up(ns, 4));
    if (ns > 0) {
      CUDA_CHECK(cudaMemcpyAsync(h_sampled, sampled_.as<void>(), ns * sizeof(int32_t),
                                 cudaMemcpyDeviceToHost, stream_));
      if (logits) {
        CUDA_CHECK(cudaMemcpyAsync(h_logits, logits_.as<void>(), ns * V * sizeof(float),
                                   cudaMemcpyDeviceToHost, stream_));
      } else if (batch.num_stochastic > 0) {
        for (size_t k = 0; k < ns; ++k)
          if (sampling_on_host(batch.seqs[size_t(desc_.sample_seq[k])].sampling))
            CUDA_CHECK(cudaMemcpyAsync(h_logits + k * V, logits_.as<float>() + k * V, V * sizeof(float),
                                       cudaMemcpyDeviceToHost, stream_));
      }
    }
#ifdef ENGINE_HAVE_NCCL
    if (cp_ != nullptr && helix_nccl_)  // the step's Helix exchanges, within the timeout
      cp_comm_->wait_done("Helix attention exchanges of a step");
#endif
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    CUDA_CHECK(cudaEventElapsedTime(&ms, ev_start_.get(), ev_stop_.get()));
    for (size_t i = 0; i < batch.seqs.size(); ++i) sampled[i] = -1;
    for (size_t k = 0; k < ns; ++k) {
      const StepSeq& s = batch.seqs[size_t(desc_.sample_seq[k])];
      sampled[desc_.sample_seq[k]] = sampling_on_host(s.sampling)
                                    ? sample_token(h_logits + k * V, shape_.vocab_size, s.sampling,
                                                   s.sample_pos(), &sampling_)
                                    : h_sampled[k];
    }
    if (logits && ns > 0) std::memcpy(logits, h_logits, ns * V * sizeof(float));
  });
  return double(ms);
}

void CudaBackend::copy_pages(eng_tier src_tier, const int32_t* src, eng_tier dst_tier,
                             const int32_t* dst, int32_t n) {
  guarded("copy_pages", [&] { pages_->copy(src_tier, src, dst_tier, dst, n); });
}

}  // namespace lockstep
