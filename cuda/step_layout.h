// step_layout.h: the CUDA backend's host-side step descriptors, in plain
// C++ (no CUDA header), so that they are built in every configuration and
// native/tests/test_fi_descriptors.cpp checks them on machines without CUDA.
//
// What lives here is everything the engine computes on the host and hands to
// the device for a step: the row order, each row's token, position, page and
// slot (what kv_append writes), the sampled rows, the hand-written kernels'
// sequence list, the padded rows of a decode-graph bucket, and FlashInfer's
// plan inputs (page indptr / indices / last_page_len, qo_indptr) and the view
// of the page slab its paged_kv_t is given (layout, strides, K/V offsets).
// model_cuda.cu, decode_graph.cu and attention/flashinfer_attn.cu call these
// functions; none of them keeps its own copy of a rule.
#ifndef LOCKSTEP_CUDA_STEP_LAYOUT_H
#define LOCKSTEP_CUDA_STEP_LAYOUT_H

#include <cstddef>
#include <cstdint>
#include <vector>

#include "backend.h"

// Functions the kernels call too are host and device functions under nvcc.
#if defined(__CUDACC__)
#define LOCKSTEP_HD __host__ __device__
#else
#define LOCKSTEP_HD
#endif

namespace lockstep {

// Element offset of (page, layer, K=0 | V=1, kv head, slot 0) in the device
// page slab, laid out page[layer][K|V][kv_head][slot][head_dim] (one
// contiguous block of page_elems elements per page; kernels/attn_common.cuh).
LOCKSTEP_HD inline int64_t kv_page_offset(int64_t page_elems, int32_t tokens_per_page, int32_t num_kv_heads,
                                          int32_t head_dim, int32_t page, int32_t layer, int kv, int32_t head) {
  return int64_t(page) * page_elems +
         ((int64_t(layer) * 2 + kv) * num_kv_heads + head) * int64_t(tokens_per_page) * head_dim;
}

// One sequence of a hand-written attention launch (all int32 so that a host
// array of them is copied to the device together with the other step
// descriptors; see kernels/attn_common.cuh for the key and query rules).
struct AttnSeq {
  int32_t q_row;       // first query row of the sequence in q / out
  int32_t num_tokens;  // query rows (1 for decode)
  int32_t start_pos;   // position of the first query row
  int32_t block_off;   // offset of the sequence's block table in block_tables
  int32_t kv_begin;    // key slice [kv_begin, kv_end) (see attn_common.cuh)
  int32_t kv_end;
  int32_t part_row;    // first row of this sequence in the partial buffers
  int32_t pad_;        // keeps the struct 32 bytes
};

// One attention sequence for FlashInfer, host side. Its keys are positions
// [0, kv_len), position p in slot p % P of page blocks[p / P]; its query rows
// are the last q_rows positions (causal inside them: row t attends keys
// [0, kv_len - q_rows + t]).
struct FiSeq {
  int32_t q_rows;
  int32_t kv_len;
  const int32_t* blocks;  // at least ceil(kv_len / P) entries
};

// This engine's share of a Helix context-parallel group (backend.h): size 1
// without Helix.
struct HelixShare {
  int32_t size = 1;
  int32_t rank = 0;
};

// The keys a query row at global position pos sees on Helix member `share`:
// the member's local pages (global pages g = rank, rank + size, ... up to
// pos / P) read as one contiguous prefix of its block table, every page
// full but the row's own, which holds pos % P + 1 keys. 0 when the member
// owns no page up to pos. Without Helix: pos + 1.
LOCKSTEP_HD inline int32_t helix_local_keys(int32_t pos, int32_t P, HelixShare share) {
  const int32_t last = pos / P;
  if (last < share.rank) return 0;
  const int32_t n = (last - share.rank) / share.size + 1;  // owned pages g <= last
  const int32_t g = share.rank + (n - 1) * share.size;     // the last of them
  return g == last ? (n - 1) * P + pos % P + 1 : n * P;
}

// The int32 descriptor buffer of one step (copied to the device in one
// transfer) and what the host keeps of it. Offsets are in int32 elements:
//   tokens, pos, page, slot [rows each], sample_rows [num_sampled],
//   decode_rows [n_decode], block tables, then the AttnSeq arrays (decode,
//   chunk; under Helix one more, a decode-style entry per row), 32-byte
//   aligned.
//
// Helix (share.size > 1): a row's page is its local page (block p / (P *
// size)) on the member that owns its position (global page p / P ≡ rank
// mod size) and -1 (kv_append writes nothing) on every other member. Entry
// r of the per-row list (off_hseqs, written under Helix or on request) makes
// row r a one-token query over this member's keys of it (helix_local_keys;
// all keys up to its position without Helix), into partial row r: under
// Helix each member computes one partial (output, LSE) per (row, head), the
// members exchange them and merge (helix_cuda.cu).
// Rows are ordered decode sequences first (one row each, in batch order),
// then every chunk's rows (in batch order): FlashInfer's decode and prefill
// each take a contiguous run of rows. Only the sampled rows map back to batch
// order (sample_seq).
struct StepDesc {
  int64_t rows = 0;
  int32_t num_sampled = 0, n_decode = 0, n_chunk = 0, max_chunk_tokens = 0, max_decode_ctx = 0;
  size_t off_tokens = 0, off_pos = 0, off_page = 0, off_slot = 0, off_sample = 0, off_decode_rows = 0,
         off_blocks = 0, off_dseqs = 0, off_cseqs = 0, off_hseqs = 0;
  HelixShare helix;                  // size 1: no Helix
  bool row_list = false;             // the per-row list (off_hseqs) is written
  size_t total = 0;                  // int32 elements of the buffer
  std::vector<int32_t> sample_seq;   // batch index of each sampled row
  std::vector<FiSeq> fi_decode;      // FlashInfer's decode list (row i = fi_decode[i])
  std::vector<FiSeq> fi_chunks;      // FlashInfer's prefill list (rows after the decode rows)
};

// Counts and offsets of batch b's descriptors (nothing written), for Helix
// member `helix` (size 1: no Helix). row_list: emit the per-row list even
// without Helix (the hand-written MLA kernel reads it: each row a one-token
// query over keys [0, its position]).
void size_step_desc(const StepBatch& b, StepDesc* d, HelixShare helix = {}, bool row_list = false);
// Writes b's descriptors into h (at least d->total int32s, laid out by
// size_step_desc) and fills d's FlashInfer lists and sample map. The
// FlashInfer lists point into b's block tables (they are not used under
// Helix).
void fill_step_desc(const StepBatch& b, int32_t tokens_per_page, StepDesc* d, int32_t* h);

// The fixed layout of decode-graph bucket B (int32): tokens, pos, page, slot,
// sample rows, decode rows [B each], at offsets that depend on B alone.
void size_graph_desc(int32_t B, StepDesc* d);
// Writes the padded descriptors of the decode-only batch b (1 <= n <= B
// sequences) into h and d->fi_decode (B entries). Row i < n is sequence i;
// rows [n, B) are padding: token 0 at position 0, page -1 (kv_append writes
// nothing), and one key of the first sequence's first page to attend (a page
// this step already reads). Every row is sampled; row i is sample i.
void fill_graph_desc(const StepBatch& b, int32_t B, int32_t tokens_per_page, StepDesc* d, int32_t* h);

// FlashInfer's plan inputs of one step in one int32 buffer (offsets in int32
// elements): dec_indptr [nd+1], dec_last [nd], pre_qo_indptr [nc+1],
// pre_indptr [nc+1], pre_last [nc], then the page indices of the decode list
// and of the prefill list (each 16-byte aligned).
struct FiLists {
  size_t off_dec_indptr = 0, off_dec_last = 0, off_pre_qo = 0, off_pre_indptr = 0, off_pre_last = 0,
         off_dec_idx = 0, off_pre_idx = 0;
  size_t total = 0;      // int32 elements
  int64_t pre_row0 = 0;  // first query (and output) row of the prefill list: after the nd decode rows
  int64_t pre_rows = 0;  // query rows of the prefill list
};

// Sizes the lists of nd decode and nc prefill sequences for page size P.
FiLists size_fi_lists(const FiSeq* decode, int32_t nd, const FiSeq* chunks, int32_t nc, int32_t P);
// Writes them into h (at least l.total int32s): per list, indptr[i+1] -
// indptr[i] = ceil(kv_len / P) pages, indices the sequence's first pages in
// order, last_page_len = kv_len - (pages - 1) * P (in [1, P]); qo_indptr the
// running sum of the prefill list's q_rows.
void fill_fi_lists(const FiSeq* decode, int32_t nd, const FiSeq* chunks, int32_t nc, int32_t P,
                   const FiLists& l, int32_t* h);

// flashinfer::QKVLayout's values (checked against it in flashinfer_attn.cu).
enum class FiKVLayout : uint32_t { kNHD = 0, kHND = 1 };

// How FlashInfer's paged_kv_t sees layer `layer` of the slab: its layout
// flag, the custom strides it is built with ({page, then the two inner
// dimensions in the order the layout names them}), and the element offsets
// of k_data and v_data from the slab's start. Our page is
// [layer][K|V][kv_head][slot][head_dim], read as HND: stride_page = the whole
// page, stride_h = P*D, stride_n = D; k_data = 2*layer*Hkv*P*D, v_data =
// k_data + Hkv*P*D (K and V share the strides, as its decode kernel requires).
struct FiKVView {
  FiKVLayout layout;
  int64_t strides[3];
  int64_t k_offset, v_offset;
};
FiKVView fi_kv_view(int32_t layer, int32_t num_kv_heads, int32_t page_size, int32_t head_dim, int64_t page_elems);

// --- Multi-head latent attention (MLA: kv_lora_rank > 0). ---
//
// Latent pages: per layer, P slots of W = kv_lora_rank + qk_rope_head_dim
// bf16 values, the normalised latent c then the roped k_pe, as the CPU
// engine's latent plane (one plane per layer; no heads):
//   page[layer][slot][W].
// Element offset of (page, layer, slot) in the slab.
LOCKSTEP_HD inline int64_t latent_offset(int64_t page_elems, int32_t tokens_per_page, int32_t width, int32_t page,
                                         int32_t layer, int32_t slot) {
  return int64_t(page) * page_elems + (int64_t(layer) * tokens_per_page + slot) * width;
}

// How FlashInfer's MLA kernel sees layer `layer` of the latent slab: it
// addresses ckv[page * stride_page + slot * stride_n + d] (d < kv_lora) and
// kpe the same way (d < rope), from these element offsets of the slab; the
// two share the strides.
struct FiMlaView {
  int64_t ckv_offset, kpe_offset, stride_page, stride_n;
};
FiMlaView fi_mla_view(int32_t layer, int32_t page_size, int32_t kv_lora, int32_t rope, int64_t page_elems);

// FlashInfer's MLA plan and run inputs of one step as one request list:
// the decode sequences then the chunks (the step's row order), in one int32
// buffer (offsets in int32 elements): qo_indptr [n+1] (query rows), kv_indptr
// [n+1] (pages), kv_len [n] (keys), then the page indices (16-byte aligned).
// Request i's rows attend causally, bottom-right aligned: row t of q_rows
// sees keys [0, kv_len - q_rows + t].
struct FiMlaList {
  size_t off_qo_indptr = 0, off_kv_indptr = 0, off_kv_len = 0, off_indices = 0;
  size_t total = 0;  // int32 elements
  int32_t batch = 0;
};
FiMlaList size_fi_mla_list(const FiSeq* decode, int32_t nd, const FiSeq* chunks, int32_t nc, int32_t P);
void fill_fi_mla_list(const FiSeq* decode, int32_t nd, const FiSeq* chunks, int32_t nc, int32_t P,
                      const FiMlaList& l, int32_t* h);

// FlashInfer's log-sum-exp is base 2 (log2 Σ 2^(s·scale·log2 e)); the Helix
// merge (attn_merge) and the CPU engine's partials use the natural log:
// lse_e = lse_2 · ln 2.
constexpr float kLn2 = 0.6931471805599453f;
LOCKSTEP_HD inline float lse_base2_to_natural(float lse2) { return lse2 * kLn2; }

}  // namespace lockstep

#endif  // LOCKSTEP_CUDA_STEP_LAYOUT_H
