// checkpoint.h: real model weights handed over the C ABI (eng_tensor) and the
// RoPE frequencies of a shape.
//
// A checkpoint tensor arrives row-major [rows][cols] in one of the eng_dtype
// encodings, possibly pointing into a memory-mapped file. validate_tensors
// checks the whole set against the shape before anything is allocated;
// load_weights then converts each tensor, one row at a time, straight into the
// backend's float32 input-major layout (weights.h), so the float weights exist
// once and nothing of the caller's memory is kept.
#ifndef LOCKSTEP_NATIVE_CHECKPOINT_H
#define LOCKSTEP_NATIVE_CHECKPOINT_H

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "engine.h"
#include "weights.h"

namespace lockstep {

// Bytes one row of `cols` elements occupies in dtype; -1 for a quantised
// dtype whose block size does not divide cols, -2 for an unknown dtype.
int64_t dtype_row_bytes(int32_t dtype, int64_t cols);

// The engine's row (Hugging Face's rotate-half order) of checkpoint row
// `row` of t: with interleaved_rope_heads, GGUF row 2i+s of a head of
// head_dim rows holds row s*(head_dim/2)+i; otherwise the row itself.
inline int64_t engine_row(const eng_tensor& t, int64_t row, int32_t head_dim) {
  if (t.interleaved_rope_heads <= 0) return row;
  const int64_t head = row / head_dim, j = row % head_dim;
  return head * head_dim + (j % 2) * (head_dim / 2) + j / 2;
}

// Name of a dtype ("F32", "Q4_1", ...) or "dtype(N)".
const char* dtype_name(int32_t dtype);

// Converts one row of `cols` elements of dtype at src to float32.
void dequantize_row(int32_t dtype, const void* src, int64_t cols, float* out);

// Half and bfloat16 bits to float (exact).
float half_to_float(uint16_t h);
// Float to half bits, rounded to nearest even.
uint16_t float_to_half(float f);

// The quantised types the int8 kernels do not read (Q5_0, Q5_1, the K
// types): under the quant kernels their projections become Q8_0.
bool requantised_dtype(int32_t dtype);

// A Q8_0 copy of t (ggml's quantize_row_q8_0 of each dequantised row: per
// 32 values d = max|x| / 127, q = round(x / d), d stored as a half) in
// bytes, which back the returned tensor until bytes changes.
eng_tensor requantise_q8_0(const eng_tensor& t, std::vector<uint8_t>* bytes);
inline float bf16_to_float(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  __builtin_memcpy(&f, &u, sizeof f);
  return f;
}

// Throws EngineError(ENG_INVALID_ARGUMENT) naming the first bad tensor: an
// unknown kind or dtype, a layer out of range, a duplicate, a missing tensor,
// rows/cols that do not match the shape, nbytes that does not match dtype, a
// NULL data pointer, or an lm_head given with tied_embeddings.
void validate_tensors(const eng_model_shape& shape, const eng_tensor* tensors, int32_t n);

// Converts validated tensors into the backend layout of weights.h. With tied
// embeddings, the embedding is stored once, as lm_head ([hidden][vocab]) and
// Weights::embedding stays empty (Weights::embed reads the column).
// quant (cpu_kernels = quant): the dense projections and the LM head given as
// Q8_0, Q4_0 or Q4_1 stay quantised (LayerWeights::qw*, Weights::q_lm_head)
// instead of being converted to float.
Weights load_weights(const eng_model_shape& shape, const eng_tensor* tensors, int32_t n, bool quant = false);

// load_weights, shared: engines of this process built from tensors of the
// same shape, kinds, types and contents (a content hash, so the same file
// mapped twice matches and a different file at a reused address does not)
// share one Weights while any of them lives.
std::shared_ptr<const Weights> shared_weights(const eng_model_shape& shape, const eng_tensor* tensors, int32_t n,
                                              bool quant = false);

// Converts one validated tensor to float32 input-major W[c * rows + r] =
// tensor[r][c] (a linear layer's x·W layout), restoring the rotate-half row
// order of interleaved WQ/WK; norms come out as their [cols] vector. out holds
// rows*cols floats.
void tensor_to_input_major(const eng_tensor& t, int32_t head_dim, float* out);

// An MLA shape's tensors that need more than tensor_to_input_major: WQ and
// KV_A (input-major, each head's rope tail turned to rotate-half order when
// interleaved_rope_heads is set), KV_B, K_B and V_B (the per-head absorbed
// forms w_kb [heads][nope][kv_lora], w_vb [heads][kv_lora][v]): converted
// into L's fields; false (L untouched) for every other kind.
bool load_mla_tensor(const eng_model_shape& shape, const eng_tensor& t, LayerWeights* L);

// The dimensions RoPE rotates per head: head_dim (or its first
// partial_rotary_dim), or an MLA shape's qk_rope_head_dim.
inline int32_t rope_dim(const eng_model_shape& s) {
  if (s.kv_lora_rank > 0) return s.qk_rope_head_dim;
  return s.partial_rotary_dim > 0 ? s.partial_rotary_dim : s.head_dim;
}

// The RoPE inverse frequencies theta^(-2i/D), i < D/2 (D = rope_dim), with
// Llama-3-style scaling applied when shape.rope_scaling_factor is set, or
// YaRN's blend when shape.yarn_factor is, each divided by rope_freqs[i] when
// those are given (a checkpoint's ROPE_FREQS). In double.
std::vector<double> rope_inv_freq(const eng_model_shape& shape, const std::vector<float>& rope_freqs = {});
// The sliding layers' inverse frequencies: base rope_local_theta (or
// rope_theta), no scaling.
std::vector<double> rope_inv_freq_local(const eng_model_shape& shape);

// YaRN's magnitude factor of cos and sin: m(mscale) / m(mscale_all_dim),
// m(x) = 0.1 x ln(factor) + 1; 1 without YaRN. In double.
double rope_magnitude(const eng_model_shape& shape);

// The attention softmax scale: 1/sqrt(head_dim), times m(mscale_all_dim)^2
// under YaRN with mscale_all_dim != 0; computed in double, rounded once.
float attention_scale(const eng_model_shape& shape);

}  // namespace lockstep

#endif  // LOCKSTEP_NATIVE_CHECKPOINT_H
