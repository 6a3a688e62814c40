// model_cuda.cu: the CUDA backend's forward step (see model_cuda.h).
#include "model_cuda.h"

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
namespace {

// Decode contexts up to this many keys never split (one block per kv head
// already streams them fast enough); longer ones split to fill the GPU.
constexpr int32_t kNoSplitContext = 1024;

template <class T>
T* at(const DeviceBuffer& b, size_t off_elems = 0) { return b.as<T>() + off_elems; }

size_t round_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

// A generated rows x cols tensor (weights_gen.cuh) placed at column col_off
// of rows of ld: u / sqrt(fan_in), or a norm gain 1 + u/8 when fan_in is 0
// (the CPU generator's values, weights.cpp).
GenTensor gen_tensor(uint64_t seed, uint64_t id, int64_t rows, int64_t cols, int64_t ld, int64_t col_off,
                     int64_t fan_in) {
  GenTensor t;
  t.seed = seed;
  t.tensor_id = id;
  t.rows = rows;
  t.cols = cols;
  t.ld = ld;
  t.col_off = col_off;
  if (fan_in == 0) {
    t.scale = 0.125f;
    t.bias = 1.0f;
  } else {
    t.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(fan_in)));
  }
  return t;
}

}  // namespace

template <class Body>
void CudaBackend::guarded(const char* what, Body&& body) {
  if (!broken_.empty())
    throw EngineError(ENG_DEVICE_ERROR, std::string("CUDA backend unusable after an earlier device error (") +
                                            broken_ + "); " + what + " refused: restart the worker");
  CUDA_CHECK(cudaSetDevice(device_));
  try {
    body();
  } catch (const EngineError& e) {
    if (e.status() == ENG_DEVICE_ERROR) broken_ = e.what();
    throw;
  }
}

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

void CudaBackend::join_ep(int32_t size, int32_t rank) {
#ifndef ENGINE_HAVE_NCCL
  if (size > 1)
    throw EngineError(ENG_UNSUPPORTED,
                      "the CUDA backend's expert parallelism runs over NCCL, and this engine library was built "
                      "without NCCL (ENGINE_NCCL=OFF): run the MoE model on one attention-DP rank, or rebuild with NCCL");
#endif
  ep_size_ = size;
  ep_rank_ = rank;
  moe_stats_.layers.assign(size_t(shape_.num_layers), MoeLayerStats{});
  // Keep only this member's routed experts.
  guarded("join_ep", [&] {
    for (CudaLayer& L : layers_)
      for (size_t e = 0; e < L.experts.size(); ++e)
        if (expert_owner(int32_t(e), size) != rank) L.experts[e] = CudaExpert{};
  });
}

void CudaBackend::join_cp(int32_t size, int32_t rank) {
  if (mla_)
    throw EngineError(ENG_UNSUPPORTED, "the CUDA backend's Helix has no latent (MLA) partials yet: run an MLA model "
                                       "with --cp on the CPU backend, or without --cp on CUDA");
  cp_share_ = HelixShare{size, rank};
}

// The Helix transport, chosen at the first Helix step from what every
// member sends through the CP group: whether it was built with NCCL and its
// device's PCI bus id. NCCL when every member has it and a device of its own;
// otherwise the group's exchange through the host. Every member sees the same
// replies, so all choose alike. With NCCL, member 0's unique id then reaches
// the others the same way, and each opens a communicator on its device and
// stream.
void CudaBackend::open_helix() {
  if (helix_open_) return;
  constexpr size_t kBusId = 64;
  char mine[1 + kBusId] = {};
#ifdef ENGINE_HAVE_NCCL
  mine[0] = 1;
#endif
  CUDA_CHECK(cudaDeviceGetPCIBusId(mine + 1, int(kBusId) - 1, device_));
  const ExchangeTag boot{ExchangeKind::kHelixAttention, -1};
  std::vector<std::vector<char>> all;
  cp_->allgather(boot, mine, sizeof(mine), &all);
  bool nccl = all.size() == size_t(cp_share_.size);
  for (size_t i = 0; nccl && i < all.size(); ++i) {
    if (all[i].size() != sizeof(mine))
      throw EngineError(ENG_COMM_ERROR, "Helix bootstrap: member " + std::to_string(i) + " sent " +
                                            std::to_string(all[i].size()) + " bytes, not " +
                                            std::to_string(sizeof(mine)));
    nccl = all[i][0] == 1;
    for (size_t j = 0; nccl && j < i; ++j)
      nccl = std::strncmp(all[i].data() + 1, all[j].data() + 1, kBusId) != 0;
  }
#ifdef ENGINE_HAVE_NCCL
  if (nccl) {
    NcclUniqueIdBytes id{};
    if (cp_share_.rank == 0) id = NcclComm::new_unique_id();
    cp_->allgather(boot, id.data(), cp_share_.rank == 0 ? id.size() : 0, &all);
    if (all.size() != size_t(cp_share_.size) || all[0].size() != id.size())
      throw EngineError(ENG_COMM_ERROR, "Helix NCCL bootstrap: member 0 sent " +
                                            std::to_string(all.empty() ? 0 : all[0].size()) +
                                            " bytes of unique id, not " + std::to_string(id.size()));
    std::memcpy(id.data(), all[0].data(), id.size());
    cp_comm_ = std::make_unique<NcclComm>(id, cp_share_.rank, cp_share_.size, device_, stream_, kHelixNcclTimeoutMs);
  }
#endif
  helix_nccl_ = nccl;
  helix_open_ = true;
}

#ifdef ENGINE_HAVE_NCCL
// The EP group's NCCL communicator, made at the first step: member 0's
// unique id reaches the others through the group's own exchange.
void CudaBackend::open_ep_comm() {
  if (ep_comm_) return;
  NcclUniqueIdBytes id{};
  if (ep_rank_ == 0) id = NcclComm::new_unique_id();
  std::vector<std::vector<char>> all;
  ep_->allgather(ExchangeTag{ExchangeKind::kMoeDispatch, -1}, id.data(), ep_rank_ == 0 ? id.size() : 0, &all);
  if (all.size() != size_t(ep_size_) || all[0].size() != id.size())
    throw EngineError(ENG_COMM_ERROR, "expert-parallel NCCL bootstrap: member 0 sent " +
                                          std::to_string(all.empty() ? 0 : all[0].size()) +
                                          " bytes of unique id, not " + std::to_string(id.size()));
  std::memcpy(id.data(), all[0].data(), id.size());
  ep_comm_ = std::make_unique<NcclComm>(id, ep_rank_, ep_size_, device_, stream_, kEpNcclTimeoutMs);
}
#endif

std::unique_ptr<Backend> make_cuda_backend(const EngineParams& params) {
  // Refused before any device memory is touched (docs/cuda.md).
  if (params.shape.qk_norm)
    throw EngineError(ENG_UNSUPPORTED, "the CUDA backend has no per-head q/k RMSNorm (qk_norm, Qwen3) yet");
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
  if (fi_mla_ && desc_.rows > 0)
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

// Helix attention of one layer (model_cuda.h): this member's partial of
// every (row, head) into its block of helix_parts_, the blocks exchanged in
// place, the merge in member order into attn_.
void CudaBackend::helix_attention(int32_t layer) {
  const int32_t D = shape_.head_dim, Hq = shape_.num_heads, Hkv = shape_.num_kv_heads;
  const int64_t R = desc_.rows, items = R * Hq;
  const int64_t block = items * (D + 1);  // floats per member: outputs, then LSEs
  float* parts = helix_parts_.as<float>();
  float* mine = parts + cp_share_.rank * block;
  AttnArgs a;
  a.q = qkv_.as<float>();
  a.q_stride = int64_t(Hq + 2 * Hkv) * D;
  a.kv = pages_->view(layer);
  a.block_tables = at<int32_t>(dev_desc_, desc_.off_blocks);
  const AttnSeq* entries = reinterpret_cast<const AttnSeq*>(at<int32_t>(dev_desc_, desc_.off_hseqs));
  a.num_heads = Hq;
  a.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(D)));
  a.o_part = mine;
  a.lse_part = mine + items * D;
  a.part_rows = int32_t(R);
  // One entry per row, in launches of at most 65 535 (the grid's z limit);
  // each entry names its own partial row.
  constexpr int64_t kMaxGridZ = 65535;
  for (int64_t r0 = 0; r0 < R; r0 += kMaxGridZ) {
    a.seqs = entries + r0;
    a.num_seqs = int32_t(std::min(kMaxGridZ, R - r0));
    attn_decode(a, stream_);
  }
  const ExchangeTag tag{ExchangeKind::kHelixAttention, layer};
  const size_t bytes = size_t(block) * sizeof(float);
  if (helix_nccl_) {
#ifdef ENGINE_HAVE_NCCL
    cp_comm_->allgather_device(parts, bytes, describe(tag));
#endif
  } else {
    // Through the host: this member's block out, every member's back in
    // (buffers sized by reserve_scratch).
    CUDA_CHECK(cudaMemcpyAsync(helix_host_.as<void>(), mine, bytes, cudaMemcpyDeviceToHost, stream_));
    CUDA_CHECK(cudaStreamSynchronize(stream_));  // also: the last layer's upload of helix_host_all_ is done
    cp_->allgather(tag, helix_host_.as<void>(), bytes, &helix_all_);
    char* dst = helix_host_all_.as<char>();
    for (size_t k = 0; k < helix_all_.size(); ++k) {
      if (helix_all_[k].size() != bytes)
        throw EngineError(ENG_COMM_ERROR, describe(tag) + ": member " + std::to_string(k) + " sent " +
                                              std::to_string(helix_all_[k].size()) + " bytes of partials, not " +
                                              std::to_string(bytes));
      std::memcpy(dst + k * bytes, helix_all_[k].data(), bytes);
    }
    CUDA_CHECK(cudaMemcpyAsync(parts, dst, bytes * size_t(cp_share_.size), cudaMemcpyHostToDevice, stream_));
  }
  MergeArgs m;
  m.o_part = parts;
  m.lse_part = parts + items * D;
  m.o_part_stride = m.lse_part_stride = block;
  m.num_parts = cp_share_.size;
  m.part_items = items;
  m.num_heads = Hq;
  m.head_dim = D;
  m.out_bf16 = attn_.as<__nv_bfloat16>();
  m.out_stride = int64_t(Hq) * D;
  attn_merge(m, stream_);
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
  if (fi_mla_) {
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
    const size_t block = size_t(R) * shape_.num_heads * size_t(D + 1) * sizeof(float);
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

// Each expert with slots [offsets[e], offsets[e + 1]) of xe: its SwiGLU over
// them into the same rows of moe_y_.
void CudaBackend::run_experts(const CudaLayer& L, const __nv_bfloat16* xe, const std::vector<int32_t>& offsets) {
  const int64_t H = shape_.hidden_size, Fm = shape_.moe_intermediate_size;
  for (size_t e = 0; e + 1 < offsets.size(); ++e) {
    const int64_t off = offsets[e], cnt = offsets[e + 1] - off;
    if (cnt == 0) continue;
    const CudaExpert& X = L.experts[e];
    gemm_->bf16_f32(xe + off * H, cnt, H, X.wgu.as<__nv_bfloat16>(), 2 * Fm, moe_gu_.as<float>(), 0.0f);
    swiglu(moe_gu_.as<float>(), cnt, int32_t(Fm), moe_act_.as<__nv_bfloat16>(), stream_);
    gemm_->bf16_f32(moe_act_.as<__nv_bfloat16>(), cnt, Fm, X.wdown.as<__nv_bfloat16>(), H,
                    moe_y_.as<float>() + off * H, 0.0f);
  }
}

void CudaBackend::moe_mlp(int32_t layer) {
  if (ep_ != nullptr) {
    moe_mlp_ep(layer);
    return;
  }
  const CudaLayer& L = layers_[size_t(layer)];
  const int64_t H = shape_.hidden_size, E = shape_.num_experts, K = shape_.num_experts_per_tok;
  const int64_t Fm = shape_.moe_intermediate_size, Fs = int64_t(shape_.num_shared_experts) * Fm, R = desc_.rows;
  const __nv_bfloat16* x = xb_.as<__nv_bfloat16>();
  // Router logits to the host, routed there by the CPU engine's rule.
  gemm_->bf16_f32(x, R, H, L.router.as<__nv_bfloat16>(), E, moe_logits_.as<float>(), 0.0f);
  moe_host_logits_.reserve(size_t(R * E) * sizeof(float));
  CUDA_CHECK(cudaMemcpyAsync(moe_host_logits_.as<void>(), moe_logits_.as<void>(), size_t(R * E) * sizeof(float),
                             cudaMemcpyDeviceToHost, stream_));
  CUDA_CHECK(cudaStreamSynchronize(stream_));
  build_moe_layout(shape_, moe_host_logits_.as<float>(), R, L.router_bias.empty() ? nullptr : L.router_bias.data(),
                   &moe_layout_);
  const int64_t words = moe_layout_.device_words(), S = moe_layout_.total();
  moe_host_desc_.reserve(size_t(words) * sizeof(int32_t));
  moe_layout_.pack(moe_host_desc_.as<int32_t>());
  CUDA_CHECK(cudaMemcpyAsync(moe_desc_.as<void>(), moe_host_desc_.as<void>(), size_t(words) * sizeof(int32_t),
                             cudaMemcpyHostToDevice, stream_));
  const int32_t* src_row = moe_desc_.as<int32_t>();
  const int32_t* slot_of = src_row + S;
  const float* weight = reinterpret_cast<const float*>(slot_of + R * K);
  // Rows by expert, each expert's SwiGLU over its rows.
  __nv_bfloat16* xe = moe_x_.as<__nv_bfloat16>();
  moe_gather(x, H, src_row, S, xe, stream_);
  run_experts(L, xe, moe_layout_.offsets);
  const float* m = nullptr;
  if (Fs > 0) {
    gemm_->bf16_f32(x, R, H, L.shared.wgu.as<__nv_bfloat16>(), 2 * Fs, moe_gu_.as<float>(), 0.0f);
    swiglu(moe_gu_.as<float>(), R, int32_t(Fs), moe_act_.as<__nv_bfloat16>(), stream_);
    gemm_->bf16_f32(moe_act_.as<__nv_bfloat16>(), R, Fs, L.shared.wdown.as<__nv_bfloat16>(), H,
                    moe_m_.as<float>(), 0.0f);
    m = moe_m_.as<float>();
  }
  moe_combine(moe_y_.as<float>(), H, slot_of, weight, int32_t(K), R, m, hidden_.as<float>(), stream_);
}

// Expert parallelism (moe_layout.h MoeEpPlan): route this member's rows,
// send each (row, k) pair to its expert's member, run the owned experts over
// what arrived, send the answers back, combine as on one engine.
void CudaBackend::moe_mlp_ep(int32_t layer) {
#ifndef ENGINE_HAVE_NCCL
  (void)layer;
  throw EngineError(ENG_INTERNAL, "expert parallelism in a CUDA build without NCCL");
#else
  open_ep_comm();
  const CudaLayer& L = layers_[size_t(layer)];
  const int64_t H = shape_.hidden_size, E = shape_.num_experts, K = shape_.num_experts_per_tok;
  const int64_t Fm = shape_.moe_intermediate_size, Fs = int64_t(shape_.num_shared_experts) * Fm, R = desc_.rows;
  const __nv_bfloat16* x = xb_.as<__nv_bfloat16>();
  const ExchangeTag dtag{ExchangeKind::kMoeDispatch, layer}, ctag{ExchangeKind::kMoeCombine, layer};
  if (R > 0) {
    gemm_->bf16_f32(x, R, H, L.router.as<__nv_bfloat16>(), E, moe_logits_.as<float>(), 0.0f);
    moe_host_logits_.reserve(size_t(R * E) * sizeof(float));
    CUDA_CHECK(cudaMemcpyAsync(moe_host_logits_.as<void>(), moe_logits_.as<void>(), size_t(R * E) * sizeof(float),
                               cudaMemcpyDeviceToHost, stream_));
  }
  // Everything queued so far has finished before any scratch below grows.
  CUDA_CHECK(cudaStreamSynchronize(stream_));
  build_moe_layout(shape_, R > 0 ? moe_host_logits_.as<float>() : nullptr, R,
                   L.router_bias.empty() ? nullptr : L.router_bias.data(), &moe_layout_);
  plan_moe_dispatch(moe_layout_, ep_size_, ep_rank_, &moe_plan_);
  std::vector<std::vector<char>> recv_ids;
  ep_->alltoallv(dtag, moe_plan_.send_experts, &recv_ids);
  const std::string why = plan_moe_receive(recv_ids, int32_t(E), &moe_plan_);
  if (!why.empty()) throw EngineError(ENG_COMM_ERROR, describe(dtag) + ": " + why);
  const int64_t S = moe_plan_.sent(), N = moe_plan_.received();
  const size_t bf = sizeof(__nv_bfloat16);
  const int64_t words = moe_plan_.device_words(moe_layout_);
  moe_desc_.reserve(size_t(std::max<int64_t>(words, 1)) * sizeof(int32_t));
  moe_send_.reserve(size_t(std::max<int64_t>(S * H, 1)) * bf);
  moe_recv_.reserve(size_t(std::max<int64_t>(N * H, 1)) * bf);
  moe_x_.reserve(size_t(std::max<int64_t>(N * H, 1)) * bf);
  moe_y_.reserve(size_t(std::max<int64_t>(N * H, 1)) * sizeof(float));
  moe_yrec_.reserve(size_t(std::max<int64_t>(N * H, 1)) * sizeof(float));
  moe_ycomb_.reserve(size_t(std::max<int64_t>(S * H, 1)) * sizeof(float));
  moe_gu_.reserve(size_t(std::max<int64_t>({N * 2 * Fm, R * 2 * Fs, 1})) * sizeof(float));
  moe_act_.reserve(size_t(std::max<int64_t>({N * Fm, R * Fs, 1})) * bf);
  moe_host_desc_.reserve(size_t(std::max<int64_t>(words, 1)) * sizeof(int32_t));
  moe_plan_.pack(moe_layout_, moe_host_desc_.as<int32_t>());
  if (words > 0)
    CUDA_CHECK(cudaMemcpyAsync(moe_desc_.as<void>(), moe_host_desc_.as<void>(), size_t(words) * sizeof(int32_t),
                               cudaMemcpyHostToDevice, stream_));
  const int32_t* send_row = moe_desc_.as<int32_t>();
  const int32_t* send_pos = send_row + S;
  const float* weight = reinterpret_cast<const float*>(send_pos + R * K);
  const int32_t* grouped_src = reinterpret_cast<const int32_t*>(weight + R * K);
  const int32_t* answer_slot = grouped_src + N;
  // Byte offsets of each member's share, rows of H bf16 (dispatch) or
  // float32 (combine).
  auto offs = [&](const std::vector<int32_t>& rec, size_t elem) {
    std::vector<int64_t> o(rec.size());
    for (size_t i = 0; i < rec.size(); ++i) o[i] = int64_t(rec[i]) * H * int64_t(elem);
    return o;
  };
  // Dispatch: rows by destination, over NCCL; then by expert.
  moe_gather(x, H, send_row, S, moe_send_.as<__nv_bfloat16>(), stream_);
  CUDA_CHECK(cudaEventRecord(ev_ep_[0].get(), stream_));
  ep_comm_->alltoallv_device(moe_send_.as<void>(), offs(moe_plan_.send_offsets, bf), moe_recv_.as<void>(),
                             offs(moe_plan_.recv_offsets, bf), describe(dtag));
  CUDA_CHECK(cudaEventRecord(ev_ep_[1].get(), stream_));
  __nv_bfloat16* xe = moe_x_.as<__nv_bfloat16>();
  moe_gather(moe_recv_.as<__nv_bfloat16>(), H, grouped_src, N, xe, stream_);
  run_experts(L, xe, moe_plan_.grouped_offsets);
  // Combine: answers back in record order, to the members that sent them.
  moe_gather_f32(moe_y_.as<float>(), H, answer_slot, N, moe_yrec_.as<float>(), stream_);
  CUDA_CHECK(cudaEventRecord(ev_ep_[2].get(), stream_));
  ep_comm_->alltoallv_device(moe_yrec_.as<void>(), offs(moe_plan_.recv_offsets, sizeof(float)),
                             moe_ycomb_.as<void>(), offs(moe_plan_.send_offsets, sizeof(float)), describe(ctag));
  CUDA_CHECK(cudaEventRecord(ev_ep_[3].get(), stream_));
  const float* m = nullptr;
  if (Fs > 0 && R > 0) {
    gemm_->bf16_f32(x, R, H, L.shared.wgu.as<__nv_bfloat16>(), 2 * Fs, moe_gu_.as<float>(), 0.0f);
    swiglu(moe_gu_.as<float>(), R, int32_t(Fs), moe_act_.as<__nv_bfloat16>(), stream_);
    gemm_->bf16_f32(moe_act_.as<__nv_bfloat16>(), R, Fs, L.shared.wdown.as<__nv_bfloat16>(), H,
                    moe_m_.as<float>(), 0.0f);
    m = moe_m_.as<float>();
  }
  moe_combine(moe_ycomb_.as<float>(), H, send_pos, weight, int32_t(K), R, m, hidden_.as<float>(), stream_);
  ep_comm_->wait_done(describe(ctag));  // the layer's exchanges, within the timeout
  // Counters: the exchanges' device time (events), bytes to other members.
  float dispatch_ms = 0, combine_ms = 0;
  CUDA_CHECK(cudaEventElapsedTime(&dispatch_ms, ev_ep_[0].get(), ev_ep_[1].get()));
  CUDA_CHECK(cudaEventElapsedTime(&combine_ms, ev_ep_[2].get(), ev_ep_[3].get()));
  const int64_t own_sent = moe_plan_.send_offsets[size_t(ep_rank_) + 1] - moe_plan_.send_offsets[size_t(ep_rank_)];
  const int64_t own_recv = moe_plan_.recv_offsets[size_t(ep_rank_) + 1] - moe_plan_.recv_offsets[size_t(ep_rank_)];
  MoeLayerStats& ls = moe_stats_.layers[size_t(layer)];
  ++ls.calls;
  ls.dispatch_ms += dispatch_ms;
  ls.combine_ms += combine_ms;
  ls.dispatch_bytes += uint64_t((S - own_sent) * H) * bf;
  ls.combine_bytes += uint64_t((N - own_recv) * H) * sizeof(float);
  moe_stats_.exchanges += 2;
  moe_stats_.tokens_routed += uint64_t(R * K);
  moe_stats_.bytes_sent += uint64_t((S - own_sent) * H) * bf + uint64_t((N - own_recv) * H) * sizeof(float);
  moe_stats_.bytes_received += uint64_t((N - own_recv) * H) * bf + uint64_t((S - own_sent) * H) * sizeof(float);
  moe_stats_.wait_ms += double(dispatch_ms) + double(combine_ms);
  moe_stats_.last_step_wait_ms += double(dispatch_ms) + double(combine_ms);
#endif
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
