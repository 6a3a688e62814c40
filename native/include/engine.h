/*
 * engine.h: the C ABI between the Go control plane and the native engine.
 *
 * Contract (see DESIGN.md §4):
 *  - C99, opaque handles, every call returns eng_status; exceptions never cross
 *    this boundary. A failing call on a handle leaves a human-readable message
 *    in eng_engine_last_error(handle); a failing call without a handle (init,
 *    preset lookup) leaves it in eng_last_error() (thread-local).
 *  - Go decides which page holds what. The engine owns a slab of
 *    num_pages pages (K and V of every layer for tokens_per_page tokens) and a
 *    host-tier slab of num_host_pages pages, both addressed only by index.
 *  - Descriptors are plain arrays of sized integers, read during the call only;
 *    the engine keeps no pointer into caller memory after a call returns.
 *  - One engine handle is used by one thread at a time (Go pins one goroutine).
 */
#ifndef LOCKSTEP_ENGINE_H
#define LOCKSTEP_ENGINE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Bumped on every incompatible change; eng_engine_init refuses a mismatch. */
#define ENG_ABI_VERSION 14

/* The most top log-probabilities a row may ask for (vLLM's default
 * max_logprobs). */
#define ENG_MAX_LOGPROBS 20

typedef enum eng_status {
  ENG_OK = 0,
  ENG_INVALID_ARGUMENT = 1,
  ENG_OUT_OF_MEMORY = 2,
  ENG_UNSUPPORTED = 3,
  ENG_DEVICE_ERROR = 4,
  ENG_COMM_ERROR = 5,
  ENG_TIMEOUT = 6,
  ENG_INTERNAL = 7
} eng_status;

typedef enum eng_backend {
  ENG_BACKEND_CPU = 0,
  ENG_BACKEND_CUDA = 1
} eng_backend;

typedef struct eng_engine* eng_engine_t;

/* Shape of a Llama-architecture decoder (synthetic or loaded). */
typedef struct eng_model_shape {
  int32_t num_layers;
  int32_t hidden_size;        /* = num_heads * head_dim */
  int32_t num_heads;          /* query heads */
  int32_t num_kv_heads;       /* K/V heads; num_heads % num_kv_heads == 0 (GQA) */
  int32_t head_dim;           /* even (RoPE rotates pairs) */
  int32_t intermediate_size;  /* SwiGLU MLP width */
  int32_t vocab_size;
  float rope_theta;
  float rms_eps;
  /* Llama-3-style RoPE frequency scaling (rope_scaling.rope_type = "llama3"):
   * 0 = none; else factor > 1, low_freq_factor >= 1, high_freq_factor >
   * low_freq_factor and original_max_positions > 0. */
  float rope_scaling_factor;
  float rope_low_freq_factor;
  float rope_high_freq_factor;
  int32_t rope_original_max_positions;
  /* 1: the output projection is the embedding matrix (no separate lm_head). */
  int32_t tied_embeddings;
  /* Mixture of experts (docs/moe.md); num_experts 0 = dense (the other MoE
   * fields must then be 0). With num_experts > 0 every layer's MLP is a MoE
   * block: a router (linear hidden -> num_experts), num_experts_per_tok
   * routed SwiGLU experts of width moe_intermediate_size per token, summed
   * in expert-id order with the router's weights, plus num_shared_experts
   * always-on experts (one SwiGLU of width num_shared_experts *
   * moe_intermediate_size); intermediate_size is then unused. */
  int32_t num_experts;
  int32_t num_experts_per_tok;   /* top-k, in [1, num_experts] */
  int32_t moe_intermediate_size;
  int32_t num_shared_experts;    /* >= 0 */
  int32_t router_norm;           /* eng_router_norm */
  /* 1: per-head RMSNorm of q and k (gains [head_dim], rms_eps) after the
   * projections, before RoPE (Qwen3); 0 = none. */
  int32_t qk_norm;
  /* Multi-head latent attention (DeepSeek-V2/V3, Kimi K2; docs/models.md
   * "MLA"); kv_lora_rank 0 = GQA, and every field of this group must then
   * be 0. With kv_lora_rank > 0 a token's cache per layer is one latent
   * vector of kv_lora_rank + qk_rope_head_dim floats (not per-head K/V);
   * num_kv_heads must equal num_heads and head_dim must equal
   * qk_nope_head_dim + qk_rope_head_dim (the query head width). Per token:
   *   q = (q_lora_rank ? RMSNorm(x·W_q_a)·q_a_norm : x)·W_q   [heads][nope|rope]
   *   [c | k_pe] = x·W_kv_a;  c = RMSNorm(c)·kv_a_norm;  RoPE on k_pe and on
   *   every q head's rope tail (qk_rope_head_dim dims);  latent = [c | k_pe]
   *   attention (absorbed): per head, q_lat = q_nope·W_kb[h] (kv_lora_rank),
   *   score_t = [q_lat | q_pe]·latent_t · scale, o_lat = Σ p_t c_t,
   *   o[h] = o_lat·W_vb[h] (v_head_dim); out = o·W_o */
  int32_t q_lora_rank;        /* 0: q = x·W_q directly */
  int32_t kv_lora_rank;
  int32_t qk_nope_head_dim;
  int32_t qk_rope_head_dim;   /* even */
  int32_t v_head_dim;
  /* MoE shapes: layers [0, first_dense_layers) keep a dense SwiGLU MLP of
   * intermediate_size (DeepSeek's first_k_dense_replace); < num_layers. */
  int32_t first_dense_layers;
  /* MoE: the routed experts' weights are multiplied by this (DeepSeek's
   * routed_scaling_factor), in double before rounding; 0 = 1. */
  float routed_scaling_factor;
  /* Group-limited routing (DeepSeek): the experts form expert_groups equal
   * groups by id; only the experts of the expert_groups_used best groups
   * compete for the top-k (a group's score: its best score for softmax
   * routers, the sum of its two best biased scores for sigmoid ones).
   * 0 = none (then both 0). */
  int32_t expert_groups;
  int32_t expert_groups_used;
  /* YaRN RoPE scaling (rope_scaling.type "yarn", DeepSeek-V3 / Kimi K2);
   * yarn_factor 0 = none; else > 1 with yarn_original_max_positions > 0,
   * yarn_beta_fast > yarn_beta_slow > 0, and not with rope_scaling_factor.
   * Frequencies blend the interpolated (/factor) and original ones over
   * the correction range of the betas; cos and sin are scaled by
   * m(mscale) / m(mscale_all_dim) and the attention scale by
   * m(mscale_all_dim)^2 when mscale_all_dim != 0, m(x) = 0.1 x ln(factor) + 1. */
  float yarn_factor;
  int32_t yarn_original_max_positions;
  float yarn_beta_fast;
  float yarn_beta_slow;
  float yarn_mscale;
  float yarn_mscale_all_dim;
  /* 1: the q, k and v projections add a bias (Q_BIAS, K_BIAS, V_BIAS)
   * right after the product, before qk_norm and RoPE: q = x·W_q + b_q
   * (Qwen2, Qwen2.5); 0 = none. Not with MLA. */
  int32_t qkv_bias;
  /* Granite's multipliers, each 0 = none: the embedding times
   * embedding_scale; each layer's attention and MLP outputs times
   * residual_scale before they join the residual stream; attention scores
   * times attention_scale instead of 1/sqrt(head_dim); the logits times
   * the float 1/logit_scale. Not with MLA. */
  float embedding_scale;
  float residual_scale;
  float attention_scale;
  float logit_scale;
  /* Gemma's decoder (docs/models.md "Gemma"); every field 0 = none, and
   * none with MLA. (Gemma's embedding multiplier sqrt(hidden) is
   * embedding_scale, its query_pre_attn_scalar^-1/2 attention_scale.)
   * mlp_gelu 1: the MLP's gate activation is GELU in its tanh form,
   * 0.5·g·(1 + tanh(sqrt(2/π)·(g + 0.044715·g³))), instead of SiLU; dense
   * shapes only (num_experts 0). */
  int32_t mlp_gelu;
  /* 1: each layer's attention output (after W_o) and MLP output are
   * RMS-normed with the ATTN_POST_NORM / MLP_POST_NORM gains before they
   * join the residual stream (Gemma 2 and 3); dense shapes only. */
  int32_t post_norms;
  /* Soft-capping, > 0 (Gemma 2): every attention score s (after the
   * scale) becomes attn_softcap·tanh(s/attn_softcap) before the softmax;
   * every logit likewise with final_softcap (after logit_scale). */
  float attn_softcap;
  float final_softcap;
  /* Sliding-window attention, > 0: a sliding layer's query at position p
   * attends to positions [p - sliding_window + 1, p] only. Which layers
   * slide: sliding_window_pattern 0 = every layer (Mistral 7B v0.1); p >= 2
   * = every layer but those with l % p == p - 1 (Gemma 2: 2, Gemma 3: 6).
   * The cache keeps every position's K/V. */
  int32_t sliding_window;
  int32_t sliding_window_pattern;
  /* The sliding layers' RoPE base (Gemma 3: 10000); 0 = rope_theta. Needs
   * sliding_window. */
  float rope_local_theta;
  /* Linear RoPE scaling of the layers that do not slide, > 1: angles of
   * position p are those of p / rope_linear_factor (Gemma 3 4B and up: 8;
   * llama.cpp's rope.scaling.type linear). Not with another scaling. */
  float rope_linear_factor;
  /* Partial RoPE (Phi-4-mini, Phi-3.5-MoE; partial_rotary_factor < 1):
   * RoPE turns the first partial_rotary_dim dimensions of each q and k
   * head (pairs i, i + partial_rotary_dim/2, rotate-half) and leaves the
   * rest; 0 = the whole head. Even, < head_dim; not with MLA. A ROPE_FREQS
   * tensor then has partial_rotary_dim/2 divisors. */
  int32_t partial_rotary_dim;
  /* cos and sin of every RoPE angle times this (LongRoPE's attention
   * factor sqrt(1 + ln(s)/ln(original context)), llama.cpp's
   * rope.scaling.attn_factor); 0 = 1. Not with YaRN, which has its own. */
  float rope_attn_factor;
} eng_model_shape;

/* How the router turns the chosen experts' scores into weights. Top-k picks
 * the largest logits, ties to the lower expert id, in both. */
typedef enum eng_router_norm {
  /* softmax over every expert, top-k, renormalised over the k (Qwen3-MoE,
   * norm_topk_prob = true) */
  ENG_ROUTER_SOFTMAX_TOPK = 0,
  /* top-k logits, softmax over the k (Mixtral) */
  ENG_ROUTER_TOPK_SOFTMAX = 1,
  /* softmax over every expert, top-k, not renormalised (DeepSeek-V2,
   * norm_topk_prob = false) */
  ENG_ROUTER_SOFTMAX_TOPK_RAW = 2,
  /* sigmoid scores; the top-k by score + the router bias (ROUTER_BIAS,
   * DeepSeek-V3's e_score_correction_bias; 0 without one), weighted by
   * their unbiased scores renormalised over the k (norm_topk_prob) */
  ENG_ROUTER_SIGMOID_TOPK = 3,
  /* as SIGMOID_TOPK, the scores not renormalised */
  ENG_ROUTER_SIGMOID_TOPK_RAW = 4
} eng_router_norm;

/*
 * Checkpoint weights (real models). A tensor is a row-major matrix
 * [rows][cols] with cols contiguous, as checkpoints store them: a linear
 * layer's weight is [out][in] (Hugging Face and GGUF alike), the embedding is
 * [vocab][hidden], a norm gain is [1][hidden]. Quantised types store each row
 * as blocks of 32 consecutive elements (ggml's Q8_0, Q4_0, Q4_1, Q5_0 and
 * Q5_1 layouts; cols a multiple of 32) or of 256 (its "K" super-blocks,
 * Q2_K .. Q6_K; cols a multiple of 256), dequantised as ggml's
 * dequantize_row_* computes them. The engine converts every tensor to its
 * own weight type and layout while eng_engine_init runs and keeps no pointer
 * to the caller's memory, so `data` may point into a memory-mapped file.
 */
typedef enum eng_dtype {
  ENG_DTYPE_F32 = 0,
  ENG_DTYPE_F16 = 1,
  ENG_DTYPE_BF16 = 2,
  ENG_DTYPE_Q8_0 = 3,  /* 34-byte blocks: f16 d, int8 q[32]; x = d*q */
  ENG_DTYPE_Q4_0 = 4,  /* 18-byte blocks: f16 d, 16 bytes of nibbles; x = d*(q-8) */
  ENG_DTYPE_Q4_1 = 5,  /* 20-byte blocks: f16 d, f16 m, 16 bytes; x = d*q + m */
  ENG_DTYPE_Q5_0 = 6,  /* 22-byte blocks: f16 d, 4 bytes of fifth bits, 16 bytes; x = d*(q-16) */
  ENG_DTYPE_Q5_1 = 7,  /* 24-byte blocks: f16 d, f16 m, 4 bytes of fifth bits, 16 bytes; x = d*q + m */
  ENG_DTYPE_Q2_K = 8,  /* 84-byte super-blocks of 256 */
  ENG_DTYPE_Q3_K = 9,  /* 110 bytes per 256 */
  ENG_DTYPE_Q4_K = 10, /* 144 bytes per 256 */
  ENG_DTYPE_Q5_K = 11, /* 176 bytes per 256 */
  ENG_DTYPE_Q6_K = 12  /* 210 bytes per 256 */
} eng_dtype;

/* Which weight a tensor is (global tensors have layer -1). */
typedef enum eng_weight {
  ENG_WEIGHT_EMBEDDING = 0,  /* [vocab][hidden] */
  ENG_WEIGHT_FINAL_NORM = 1, /* [1][hidden] */
  ENG_WEIGHT_LM_HEAD = 2,    /* [vocab][hidden]; absent when tied_embeddings */
  ENG_WEIGHT_ATTN_NORM = 3,  /* [1][hidden] */
  ENG_WEIGHT_WQ = 4,         /* [heads*head_dim][hidden] */
  ENG_WEIGHT_WK = 5,         /* [kv_heads*head_dim][hidden] */
  ENG_WEIGHT_WV = 6,         /* [kv_heads*head_dim][hidden] */
  ENG_WEIGHT_WO = 7,         /* [hidden][heads*head_dim] */
  ENG_WEIGHT_MLP_NORM = 8,   /* [1][hidden] */
  ENG_WEIGHT_W_GATE = 9,     /* [intermediate][hidden] */
  ENG_WEIGHT_W_UP = 10,      /* [intermediate][hidden] */
  ENG_WEIGHT_W_DOWN = 11,    /* [hidden][intermediate] */
  /* Optional [1][head_dim/2]: llama.cpp's per-dimension RoPE divisors (how
   * its GGUF files carry Llama-3 scaling): inv_freq[i] /= rope_freqs[i].
   * Not together with rope_scaling_factor. */
  ENG_WEIGHT_ROPE_FREQS = 12,
  /* qk_norm shapes: the per-head gains, [1][head_dim] each. */
  ENG_WEIGHT_Q_NORM = 13,
  ENG_WEIGHT_K_NORM = 14,
  /* MoE shapes (num_experts > 0), which have no W_GATE/W_UP/W_DOWN: */
  ENG_WEIGHT_ROUTER = 15,       /* [num_experts][hidden] */
  ENG_WEIGHT_EXPERT_GATE = 16,  /* routed expert `expert`: [moe_intermediate][hidden] */
  ENG_WEIGHT_EXPERT_UP = 17,    /* [moe_intermediate][hidden] */
  ENG_WEIGHT_EXPERT_DOWN = 18,  /* [hidden][moe_intermediate] */
  /* num_shared_experts > 0: the shared experts as one SwiGLU of width
   * S = num_shared_experts * moe_intermediate_size */
  ENG_WEIGHT_SHARED_GATE = 19,  /* [S][hidden] */
  ENG_WEIGHT_SHARED_UP = 20,    /* [S][hidden] */
  ENG_WEIGHT_SHARED_DOWN = 21,  /* [hidden][S] */
  /* MLA shapes (kv_lora_rank > 0), which have no WK/WV; there WQ is
   * [heads*(nope+rope)][q_lora_rank, or hidden without q_lora] (the q_b
   * projection) and WO is [hidden][heads*v_head_dim]. Either KV_B or both
   * K_B and V_B. */
  ENG_WEIGHT_Q_A = 22,          /* [q_lora][hidden] (q_lora_rank > 0) */
  ENG_WEIGHT_Q_A_NORM = 23,     /* [1][q_lora] (q_lora_rank > 0) */
  ENG_WEIGHT_KV_A = 24,         /* [kv_lora+rope][hidden] */
  ENG_WEIGHT_KV_A_NORM = 25,    /* [1][kv_lora] */
  ENG_WEIGHT_KV_B = 26,         /* [heads*(nope+v)][kv_lora]: per head nope rows, then v rows */
  ENG_WEIGHT_K_B = 27,          /* [heads*kv_lora][nope]: per head W_kb transposed (llama.cpp's attn_k_b) */
  ENG_WEIGHT_V_B = 28,          /* [heads*v][kv_lora] (llama.cpp's attn_v_b) */
  /* Optional with a sigmoid router: [1][num_experts], added to the scores
   * for the choice only. */
  ENG_WEIGHT_ROUTER_BIAS = 29,
  /* qkv_bias shapes: the projections' biases, in the output order of
   * WQ/WK/WV (rotate-half; not with interleaved_rope_heads). */
  ENG_WEIGHT_Q_BIAS = 30,       /* [1][heads*head_dim] */
  ENG_WEIGHT_K_BIAS = 31,       /* [1][kv_heads*head_dim] */
  ENG_WEIGHT_V_BIAS = 32,       /* [1][kv_heads*head_dim] */
  /* post_norms shapes: the gains of the attention and MLP outputs' norms. */
  ENG_WEIGHT_ATTN_POST_NORM = 33, /* [1][hidden] */
  ENG_WEIGHT_MLP_POST_NORM = 34   /* [1][hidden] */
} eng_weight;

typedef struct eng_tensor {
  int32_t kind;   /* eng_weight */
  int32_t layer;  /* 0..num_layers-1, or -1 for a global tensor */
  int32_t dtype;  /* eng_dtype */
  /* WQ/WK only: > 0 when the rows of each of this many heads are in the
   * interleaved RoPE order of llama.cpp's GGUF conversion (row 2i+s of a head
   * is Hugging Face's row s*head_dim/2+i); the engine restores the
   * rotate-half order. MLA shapes: WQ (num_heads) and KV_A (1), and only the
   * qk_rope_head_dim rows at the tail of each head (of KV_A's rows) are
   * adjacent pairs (DeepSeek's checkpoints, GGUF and Hugging Face alike).
   * 0 otherwise. */
  int32_t interleaved_rope_heads;
  /* EXPERT_GATE/UP/DOWN: the routed expert, 0..num_experts-1 (a stacked
   * [experts][rows][cols] checkpoint tensor is handed over as one tensor per
   * expert, each a slice of its rows); 0 for every other kind. */
  int32_t expert;
  int64_t rows;
  int64_t cols;
  const void* data;
  int64_t nbytes; /* must equal the size rows x cols occupy in dtype */
} eng_tensor;

/* The CPU backend's products. EXACT: every weight converted to float32,
 * float32 GEMMs in the reference order (the oracle). QUANT: a checkpoint's
 * Q8_0, Q4_0 and Q4_1 dense projections and LM head stay in their blocks and
 * multiply activations quantised to 8 bits per 32-element block with
 * integer dot products (native/src/quant_cpu.h: the same bits for any
 * thread count and batch; not the exact mode's bits). Other weights, and
 * synthetic ones, stay exact. */
typedef enum eng_cpu_kernels {
  ENG_CPU_KERNELS_EXACT = 0,
  ENG_CPU_KERNELS_QUANT = 1
} eng_cpu_kernels;

typedef struct eng_engine_config {
  uint32_t abi_version;       /* must be ENG_ABI_VERSION */
  eng_backend backend;
  /* Preset name ("tiny", "llama-8b", "llama-70b"); NULL or "" uses `shape`. */
  const char* preset;
  eng_model_shape shape;
  uint64_t seed;              /* synthetic weights are a deterministic function of (shape, seed) */
  int32_t num_pages;          /* device-tier pages, > 0 */
  int32_t tokens_per_page;    /* > 0 */
  int32_t num_host_pages;     /* host-tier pages, >= 0 */
  int32_t device_id;          /* CUDA device (local rank); ignored by the CPU backend */
  /* Validate the shape and sizes but allocate no weights or pages (for shapes
   * too large for the host, e.g. llama-70b on the CPU backend). A validate-only
   * engine answers eng_engine_step with ENG_UNSUPPORTED. */
  int32_t validate_only;
  /* Checkpoint weights: every tensor of the shape exactly once (kinds 0-11,
   * minus LM_HEAD when tied; ROPE_FREQS optional; a MoE shape has ROUTER and
   * every expert's EXPERT_* instead of W_GATE/W_UP/W_DOWN, SHARED_* when
   * num_shared_experts > 0; Q_NORM/K_NORM with qk_norm; Q_BIAS/K_BIAS/
   * V_BIAS with qkv_bias; ATTN_POST_NORM/MLP_POST_NORM with post_norms;
   * an MLA shape has
   * the MLA kinds instead of WK/WV, and its first_dense_layers keep
   * W_GATE/W_UP/W_DOWN).
   * num_tensors 0 = synthetic weights from seed. */
  const eng_tensor* tensors;
  int32_t num_tensors;
  /* CPU backend: threads that share each step's work, 1 .. 1024 (0 = 1).
   * Results are the same bits for every count: threads share out whole
   * output elements, never one element's sum. The CUDA backend ignores it. */
  int32_t num_threads;
  /* CPU backend: eng_cpu_kernels. The CUDA backend ignores it. */
  int32_t cpu_kernels;
} eng_engine_config;

/* Fills *out with a preset's shape. Unknown name -> ENG_INVALID_ARGUMENT. */
eng_status eng_preset_shape(const char* name, eng_model_shape* out);

/* Thread-local message of the last failed call made without a handle. */
const char* eng_last_error(void);

/* Backends this build supports: bit i set for eng_backend i. */
uint32_t eng_supported_backends(void);

/* Converts one row of `cols` elements of an eng_dtype (`nbytes` of it at
 * src) to float32 at out, as the engines read checkpoint weights. A cols
 * that the dtype's blocks do not divide, or nbytes other than the row's
 * size, -> ENG_INVALID_ARGUMENT. */
eng_status eng_dequantize_row(int32_t dtype, const void* src, int64_t nbytes, int64_t cols, float* out);

eng_status eng_engine_init(const eng_engine_config* cfg, eng_engine_t* out);
eng_status eng_engine_free(eng_engine_t eng);
/* Message of the last failed call on this handle; "" if none. Owned by the handle. */
const char* eng_engine_last_error(eng_engine_t eng);
/* The resolved shape (after preset lookup). */
eng_status eng_engine_shape(eng_engine_t eng, eng_model_shape* out);

/*
 * One forward step over a batch of sequences.
 *
 * Sequence i contributes num_tokens[i] new tokens (tokens[tok_off_i ...]) at
 * positions start_pos[i] .. start_pos[i]+num_tokens[i]-1; its block table is
 * block_table[blk_off_i ... blk_off_i+num_blocks[i]-1], where the offsets are
 * prefix sums. Token at position p lives in page block_table[p / P], slot p % P.
 * The step writes the new tokens' K/V into those pages, then runs attention of
 * every new token over positions [0, its own position] read from the pages
 * (causal within the chunk, full over the prefix). If sample[i] != 0 the last
 * new token of sequence i is sampled and written to sampled[i]; otherwise
 * sampled[i] = -1. Sampling is greedy (argmax, lowest index on ties) unless
 * sampling is set and sampling[i].temperature > 0 (see eng_sampling).
 *
 * Bit-exact batch invariance: a sequence's results depend only on its own
 * tokens and the contents of its pages, never on the rest of the batch or on
 * how its prompt was chunked.
 */
/*
 * Per-sequence sampling parameters (docs/sampling.md). temperature 0 =
 * greedy argmax (the other fields are then unused but still validated);
 * top_k 0 = no top-k; top_p 1 = no top-p. Every field must be finite,
 * temperature >= 0, top_k >= 0 and 0 < top_p <= 1.
 *
 * The draw is Philox4x32-10 keyed by seed {low, high word}, with counter
 * {pos low, pos high, 0, 0} where pos is the absolute position of the token
 * being sampled (start_pos + num_tokens of the sequence): a sequence's token
 * depends only on its logits, its parameters and that position, so a
 * re-batched, re-chunked or recomputed request draws the same token.
 * Procedure: logits / temperature (float32), keep the top_k largest (ties:
 * lower id), softmax in double over them in descending order, keep the
 * smallest prefix whose cumulative probability >= top_p, renormalise, pick
 * the first whose cumulative probability exceeds u = (out[0] >> 8) / 2^24.
 */
typedef struct eng_sampling {
  float temperature;
  int32_t top_k;
  float top_p;
  uint64_t seed;
  /* Logits processors (vLLM's; docs/sampling.md), applied to the float32
   * logits row in this order before anything else, greedy rows included:
   * logit bias (l[bias_ids[j]] += bias_values[j], j in order), repetition
   * penalty (each distinct id of the prompt or the output: l > 0 ? l / r :
   * l * r), frequency penalty (l -= frequency_penalty * count in the output),
   * presence penalty (l -= presence_penalty for an id in the output). min_p
   * acts after the temperature: ids whose probability is below min_p times
   * the largest are dropped (exp(s - s_max) < min_p). Each is off at 0
   * (repetition_penalty 1 is off too); every value must be finite,
   * repetition_penalty >= 0, 0 <= min_p <= 1, ids in [0, vocab). The token
   * arrays are read during the call only (a submit copies them). */
  float min_p;
  float presence_penalty;
  float frequency_penalty;
  float repetition_penalty;
  int32_t num_bias;
  const int32_t* bias_ids;      /* [num_bias] */
  const float* bias_values;     /* [num_bias] */
  int32_t num_prompt;
  const int32_t* prompt_tokens; /* [num_prompt]: read by the repetition penalty */
  int32_t num_output;
  const int32_t* output_tokens; /* [num_output]: the tokens generated so far */
  /* Log-probabilities of a sampled row (vLLM's raw_logprobs): log_softmax
   * of the row's logits as the model produced them, before the logits
   * processors, the temperature, top-k, top-p and min_p (NaN counts as
   * -inf, +inf as FLT_MAX). logprobs 1: the step writes the sampled
   * token's log-probability to res.logprobs[i] and the top_logprobs
   * (0..ENG_MAX_LOGPROBS) most probable ids and their log-probabilities to
   * res.top_logprob_ids / res.top_logprobs [i * ENG_MAX_LOGPROBS ...],
   * highest first, ties to the lower id. The sums are in double: m = the
   * largest logit, s = sum over ids in id order of exp(l - m) (sampling's
   * exp), lp = float((l - m) - log(s)) with a log of +, -, *, / only
   * (docs/sampling.md). logprobs 0 = none; top_logprobs must then be 0. */
  int32_t logprobs;
  int32_t top_logprobs;
  /* Structured outputs: when not NULL, the bitmask of the ids the pick may
   * return (bit id % 32 of allowed[id / 32], ceil(vocab / 32) words; at
   * least one id in [0, vocab) set). The logits of the other ids become
   * -inf after the processors above (greedy rows included); the
   * log-probabilities are not affected. Read during the call only (a
   * submit copies it). */
  const uint32_t* allowed;
} eng_sampling;

typedef struct eng_step_desc {
  int32_t num_seqs;
  const int32_t* num_tokens;   /* [num_seqs], each >= 1 */
  const int32_t* start_pos;    /* [num_seqs], each >= 0 */
  const int32_t* tokens;       /* [sum num_tokens], each in [0, vocab) */
  const int32_t* num_blocks;   /* [num_seqs] */
  const int32_t* block_table;  /* [sum num_blocks], each in [0, num_pages) */
  const uint8_t* sample;       /* [num_seqs] */
  const eng_sampling* sampling; /* [num_seqs] or NULL = every sequence greedy */
  /* Prompt scoring (vLLM's prompt_logprobs; ABI 11): NULL, or [sum num_tokens]
   * ids aligned with tokens. Where score_targets[r] >= 0 (it must be in
   * [0, vocab); -1 = not scored) the step computes the log-probabilities of
   * new token r's logits row (the model's prediction of the position after
   * it) exactly as eng_sampling.logprobs does for a sampled row: the
   * target's into res.score_logprobs[r], and the score_top[i]
   * (0..ENG_MAX_LOGPROBS) most probable ids of sequence i with theirs into
   * res.score_top_ids / res.score_top_logprobs [r * ENG_MAX_LOGPROBS ...].
   * A row's result does not depend on the rest of the batch or on whether
   * its sequence samples (bit-exact with the sampled row of a sequence
   * ending at that token). A backend that cannot score refuses the step
   * with ENG_UNSUPPORTED (the CUDA backend, for now). */
  const int32_t* score_targets;
  const int32_t* score_top;    /* [num_seqs] or NULL = 0 for every sequence */
} eng_step_desc;

typedef struct eng_step_result {
  int32_t* sampled;            /* [num_seqs], written by the engine */
  /* Optional [num_sampled * vocab] logits of the sampled rows, in batch order;
   * NULL to skip. Used by cross-backend agreement tests. */
  float* logits;
  double device_ms;            /* device (or CPU compute) time of the step */
  /* Of device_ms, the time spent in MoE exchanges (dispatch and combine:
   * waiting for the slowest member and moving the tokens); 0 without EP. */
  double moe_wait_ms;
  /* Log-probabilities (eng_sampling.logprobs): [num_seqs] and
   * [num_seqs * ENG_MAX_LOGPROBS] twice, written by the engine for every
   * sequence (0, -1 and 0 where a sequence asks for none or for fewer
   * top entries than ENG_MAX_LOGPROBS). They may be NULL only when no
   * sampled sequence of the step sets logprobs. */
  float* logprobs;
  int32_t* top_logprob_ids;
  float* top_logprobs;
  /* Prompt scoring (eng_step_desc.score_targets): [sum num_tokens] and
   * [sum num_tokens * ENG_MAX_LOGPROBS] twice, written for every row (0,
   * -1 and 0 where a row is not scored or has fewer top entries). They may
   * be NULL only when no row is scored. score_ranks [sum num_tokens]: a
   * scored row's target's rank (vLLM's: how many ids have a logit at
   * least the target's, NaN as -inf; the most probable is 1), 0 where not
   * scored. */
  float* score_logprobs;
  int32_t* score_top_ids;
  float* score_top_logprobs;
  int32_t* score_ranks;
} eng_step_result;

eng_status eng_engine_step(eng_engine_t eng, const eng_step_desc* desc,
                           eng_step_result* res);

/* Samples one logits row [vocab] exactly as a step samples a sequence whose
 * sampled token is at absolute position pos (>= 0); writes the token to *out.
 * For cross-checks of other implementations of the procedure (bridge/sampling.go).
 * Errors leave their message in eng_last_error(). */
eng_status eng_sample_row(const float* logits, int32_t vocab, const eng_sampling* params,
                          int64_t pos, int32_t* out);

/* The log-probabilities of one logits row [vocab] exactly as a step
 * computes them (eng_sampling.logprobs): token's into *token_logprob and the
 * top k (0..ENG_MAX_LOGPROBS; min(k, vocab) entries) into ids[] and
 * logprobs[] (may be NULL when k is 0). For cross-checks
 * (bridge/logprobs.go); errors leave their message in eng_last_error(). */
eng_status eng_logprobs_row(const float* logits, int32_t vocab, int32_t token, int32_t k,
                            float* token_logprob, int32_t* ids, float* logprobs);

/*
 * Asynchronous steps (the executor's overlap loop).
 *
 * eng_engine_submit validates desc exactly like eng_engine_step (a rejected
 * descriptor changes nothing and nothing is queued), copies it (the caller may
 * reuse its arrays as soon as the call returns) and queues the step on the
 * engine's stream behind every step submitted before; it returns without
 * waiting for the compute. eng_engine_wait blocks until the OLDEST submitted
 * step has finished and writes its result into res: res->sampled must hold
 * that step's num_seqs entries, and res->logits (if want_logits was set at
 * submit) num_sampled * vocab floats. A compute failure of a submitted step is
 * reported by its eng_engine_wait. At most ENG_MAX_INFLIGHT steps may be
 * outstanding. eng_engine_step and eng_engine_copy_pages run after every step
 * submitted before them (stream order); eng_engine_step refuses to run while
 * submitted steps have not been waited for, since their results would be lost.
 */
#define ENG_MAX_INFLIGHT 2

eng_status eng_engine_submit(eng_engine_t eng, const eng_step_desc* desc, int32_t want_logits);
eng_status eng_engine_wait(eng_engine_t eng, eng_step_result* res);
/* Steps submitted and not yet waited for. */
int32_t eng_engine_inflight(eng_engine_t eng);

/*
 * Helix context parallelism (aggregated Helix): in-process members, or one
 * member per process over MPI.
 *
 * A CP group of `size` members exchanges attention partials inside every
 * step. After eng_engine_join_cp(eng, group, rank), eng's steps run Helix
 * attention: positions are global; global position p lives on member
 * (p / P) % size, in the member's local page block_table[p / (P * size)] at
 * slot p % P (one ledger block = one local page on every member); a step
 * writes only the positions its member owns, and every layer the members
 * exchange the partials of their pages and merge all of them in global page
 * order, so every member (and a single-rank engine) gets bit-identical
 * results. Every member must run the same steps (same sequences, tokens and
 * positions; only the block tables differ). A member that does not arrive
 * within timeout_ms makes the others fail with ENG_TIMEOUT; freeing a member
 * makes the others fail with ENG_COMM_ERROR instead of hanging.
 */
typedef struct eng_cp_group* eng_cp_group_t;

/* An in-process group: every member is an engine of this process. */
eng_status eng_cp_group_create(int32_t size, int32_t timeout_ms, eng_cp_group_t* out);
/*
 * A group of one member per process over MPI: the processes of
 * MPI_COMM_WORLD that pass the same color, ranked by world rank; this
 * process's engine joins it as eng_cp_group_local_rank(group). Collective:
 * every process of the world calls it (from any thread) with its color.
 * Initialises MPI if needed (as eng_comm_init_mpi does). The group has an MPI
 * communicator of its own and its exchanges run on the engine's thread, so
 * it needs MPI_THREAD_MULTIPLE (ENG_UNSUPPORTED otherwise, and in a build
 * without ENGINE_MPI). Each exchange carries its kind, layer and round: a
 * member whose step diverged fails with ENG_COMM_ERROR naming both sides,
 * and a wait beyond timeout_ms fails with ENG_TIMEOUT naming the exchange
 * and, per missing peer, the last exchange received from it.
 */
eng_status eng_cp_group_create_mpi(int32_t color, int32_t timeout_ms, eng_cp_group_t* out);
/*
 * A group of one member per process over TCP, for launches without MPI:
 * every member first listens (eng_tcp_listen: host "" = every interface;
 * the chosen port in *port), the caller exchanges the "host:port" addresses
 * and a random 32-byte secret among the members through its control plane,
 * then each calls eng_cp_group_create_tcp with its rank, every member's
 * address in rank order and the secret. The members connect into a full
 * mesh (each connection starts with a hello carrying the secret; others are
 * closed); the call fails with ENG_TIMEOUT when the mesh is not complete
 * within timeout_ms, which also bounds each exchange. The listener is only
 * borrowed; free it afterwards. Exchanges behave as over MPI, and a member
 * that exits fails its peers' exchange at once (ENG_COMM_ERROR).
 */
typedef struct eng_tcp_listener* eng_tcp_listener_t;
eng_status eng_tcp_listen(const char* host, int32_t* port, eng_tcp_listener_t* out);
eng_status eng_tcp_listener_free(eng_tcp_listener_t ln);
eng_status eng_cp_group_create_tcp(eng_tcp_listener_t ln, int32_t rank, int32_t size, const char* const* addrs,
                                   const uint8_t* secret, int32_t timeout_ms, eng_cp_group_t* out);
/* Members of the group (-1 for NULL); the rank this process must join as
 * (-1 for an in-process group, whose members are all local). */
int32_t eng_cp_group_size(eng_cp_group_t group);
int32_t eng_cp_group_local_rank(eng_cp_group_t group);
/* Releases the caller's reference; members keep the group alive. */
eng_status eng_cp_group_free(eng_cp_group_t group);
/* Before the first step; once per engine. */
eng_status eng_engine_join_cp(eng_engine_t eng, eng_cp_group_t group, int32_t rank);

/*
 * Expert parallelism (MoE models, docs/moe.md): the routed experts are dealt
 * to the members of an exchange group (the same handle type as a CP group):
 * expert e lives on member e % size. After eng_engine_join_ep(eng, group,
 * rank) the engine keeps only its own experts, and every MoE layer of every
 * step sends each token's activations to the members owning its experts
 * (dispatch) and the expert outputs back (combine); the token's rank sums
 * them in expert-id order, so results do not depend on the group's size.
 * Every member must run a step whenever any member does (a member with no
 * sequences runs an empty step and joins every exchange with zero tokens);
 * batches may differ. An engine may be in a CP group and an EP group, not in
 * both with more than one member each. Before the first step; once per
 * engine; ENG_INVALID_ARGUMENT for a dense model.
 */
eng_status eng_engine_join_ep(eng_engine_t eng, eng_cp_group_t group, int32_t rank);

/* Cumulative MoE exchange counters of an engine (all zero without EP). */
typedef struct eng_moe_stats {
  uint64_t exchanges;       /* dispatches + combines */
  uint64_t bytes_sent;      /* to other members */
  uint64_t bytes_received;  /* from other members */
  uint64_t tokens_routed;   /* (token, expert) pairs this engine dispatched */
  double wait_ms;           /* time inside exchanges */
} eng_moe_stats;
eng_status eng_engine_moe_stats(eng_engine_t eng, eng_moe_stats* out);
/* Per MoE layer (benchmarks): bytes this engine sent to other members and
 * the time it spent in that layer's dispatch and combine, over `calls` steps. */
typedef struct eng_moe_layer_stats {
  uint64_t calls;
  uint64_t dispatch_bytes, combine_bytes;
  double dispatch_ms, combine_ms;
} eng_moe_layer_stats;
eng_status eng_engine_moe_layer_stats(eng_engine_t eng, int32_t layer, eng_moe_layer_stats* out);

/*
 * Fault injection for tests: the engine's next exchange with its groups
 * (Helix CP, MoE EP) of the given kind (0 Helix attention, 1 MoE dispatch, 2 MoE
 * combine, -1 any) at the given layer (-1 any) sleeps ms milliseconds before
 * it starts, as a member that stopped inside it would. Thread-safe (it only
 * arms a flag the step reads). ENG_INVALID_ARGUMENT for an engine in no group.
 */
eng_status eng_engine_test_stall(eng_engine_t eng, int32_t kind, int32_t layer, int32_t ms);

/* Page copies between tiers (suspend/resume). Tier 0 = device, 1 = host. */
typedef enum eng_tier {
  ENG_TIER_DEVICE = 0,
  ENG_TIER_HOST = 1
} eng_tier;

/* Copies n pages: page src[k] of src_tier to page dst[k] of dst_tier, in order.
 * Every index is validated before anything is copied. */
eng_status eng_engine_copy_pages(eng_engine_t eng, eng_tier src_tier,
                                 const int32_t* src, eng_tier dst_tier,
                                 const int32_t* dst, int32_t n);

/*
 * Communicator (MPI), DESIGN.md §5.
 *
 * One collective primitive, a variable-size allgather of bytes; the Go side
 * (nccl.CheckedComm) carries every collective of the control plane through it
 * with a header that makes a desynchronised program fail on every rank
 * instead of hanging. A build without ENGINE_MPI links these functions too and
 * answers ENG_UNSUPPORTED with a message saying how to enable MPI.
 *
 * Threading: MPI is initialised asking for MPI_THREAD_MULTIPLE (the exchange
 * groups of eng_cp_group_create_mpi need it); the communicator still expects
 * every call below from the thread that made the first eng_comm_init_mpi
 * (Go pins one goroutine to an OS thread for this), and refuses other
 * threads when MPI provides less than MPI_THREAD_MULTIPLE. Calls on one
 * handle must not overlap.
 *
 * Errors: a failing call on a handle leaves its message (with MPI's error
 * string) in eng_comm_last_error(comm); a failing eng_comm_init_mpi leaves it
 * in eng_comm_last_error(NULL) (thread-local). MPI errors are returned, not
 * fatal (MPI_ERRORS_RETURN on the communicator), as ENG_COMM_ERROR. Argument
 * errors of eng_comm_allgatherv are detected after the lengths are exchanged,
 * so every rank fails the same call instead of one rank leaving its peers
 * blocked.
 */
typedef struct eng_comm* eng_comm_t;

/* Initialises MPI if it is not initialised yet (MPI_Init_thread, MULTIPLE;
 * Open MPI's own SIGSEGV/SIGBUS handlers are disabled unless the user set
 * OMPI_MCA_opal_signal, because they would take signals from the Go runtime)
 * and returns a duplicate of MPI_COMM_WORLD in *out. Without a launcher this
 * is a world of one process (MPI singleton). */
eng_status eng_comm_init_mpi(eng_comm_t* out);
/* This process's rank and the world size (-1 for a NULL handle). */
int32_t eng_comm_rank(eng_comm_t comm);
int32_t eng_comm_size(eng_comm_t comm);
/*
 * Variable-size allgather: every rank contributes send_len bytes from send
 * (send may be NULL when send_len is 0). On ENG_OK, recv_lens[r] (caller
 * memory, comm_size entries) holds rank r's length and *recv points to all
 * contributions concatenated in rank order (sum of recv_lens bytes). The
 * receive buffer is owned by the communicator and stays valid until the next
 * call on comm or eng_comm_free; the caller copies what it keeps. Lengths are
 * exchanged first, so every rank agrees on the layout; a total above 2^31-1
 * bytes (MPI's int counts) fails with ENG_INVALID_ARGUMENT on every rank.
 */
eng_status eng_comm_allgatherv(eng_comm_t comm, const void* send, int64_t send_len,
                               int64_t* recv_lens, const uint8_t** recv);
/* MPI_Abort on the communicator: terminates every rank of the job with code.
 * Returns only if the abort itself failed. */
eng_status eng_comm_abort(eng_comm_t comm, int32_t code);
/*
 * Idle doorbell: a point every rank reaches together, as it would a
 * collective, before a collective that may be far off (the next iteration of
 * an idle fleet, which root starts only when a request comes). MPI's
 * blocking collectives poll while they wait, so without it every rank but
 * root holds a core for as long as the fleet is idle. Root sends every other
 * rank a small message and returns; the others look for it, asleep in
 * between (the naps grow from poll_us/8 to poll_us microseconds), and return
 * when it has come or after timeout_us (ENG_OK either way: a late ring is
 * dropped by the next call).
 * Arguments must be the same on every rank: root in [0, size), poll_us > 0,
 * timeout_us >= 0. The NCCL transport returns at once.
 */
eng_status eng_comm_idle_wait(eng_comm_t comm, int32_t root, int64_t poll_us, int64_t timeout_us);
/* Frees the communicator. Freeing the last communicator of the process
 * finalises MPI when this library initialised it; MPI cannot be initialised
 * again afterwards (a later eng_comm_init_mpi fails). NULL is a no-op. */
eng_status eng_comm_free(eng_comm_t comm);
/* Message of the last failed call on this handle; "" if none. Owned by the
 * handle. With NULL: the last failed eng_comm_init_mpi of this thread. */
const char* eng_comm_last_error(eng_comm_t comm);

/*
 * NCCL transport for the control plane (GPU deployments). The same
 * eng_comm_t handle and calls (eng_comm_rank/size/allgatherv/free/
 * last_error) over an NCCL communicator on CUDA device device_id, with host
 * staging on its own stream. Every wait is bounded by timeout_ms (> 0): past
 * it the NCCL communicator is aborted (ncclCommAbort) and the call returns
 * ENG_TIMEOUT naming the collective; the handle then only answers
 * ENG_COMM_ERROR. eng_comm_abort on it returns ENG_UNSUPPORTED (exit the
 * process instead). A library built without ENGINE_NCCL links both functions
 * and answers ENG_UNSUPPORTED with a message saying how to build it.
 *
 * Bootstrap: rank 0 calls eng_comm_nccl_unique_id and sends the 128 bytes to
 * every rank over another transport (MPI or TCP); every rank then calls
 * eng_comm_init_nccl with the same id. Failures of init leave their message in
 * eng_comm_last_error(NULL).
 */
#define ENG_NCCL_UNIQUE_ID_BYTES 128
eng_status eng_comm_nccl_unique_id(uint8_t out[ENG_NCCL_UNIQUE_ID_BYTES]);
eng_status eng_comm_init_nccl(const uint8_t id[ENG_NCCL_UNIQUE_ID_BYTES], int32_t rank, int32_t size,
                              int32_t device_id, int32_t timeout_ms, eng_comm_t* out);

#ifdef __cplusplus
}
#endif

#endif /* LOCKSTEP_ENGINE_H */
