// step_layout.cpp: see step_layout.h.
#include "step_layout.h"

#include <algorithm>
#include <cstring>

namespace lockstep {
namespace {

size_t round_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

int32_t pages_of(const FiSeq& s, int32_t P) { return (s.kv_len + P - 1) / P; }

// One FlashInfer list: indptr [n+1], last_page_len [n], indices.
void fill_list(const FiSeq* seqs, int32_t n, int32_t P, int32_t* indptr, int32_t* last, int32_t* indices) {
  int32_t at = 0;
  indptr[0] = 0;
  for (int32_t i = 0; i < n; ++i) {
    const int32_t np = pages_of(seqs[i], P);
    for (int32_t k = 0; k < np; ++k) indices[at + k] = seqs[i].blocks[k];
    at += np;
    indptr[i + 1] = at;
    last[i] = seqs[i].kv_len - (np - 1) * P;
  }
}

}  // namespace

void size_step_desc(const StepBatch& b, StepDesc* d, HelixShare helix, bool row_list) {
  d->helix = helix;
  d->row_list = row_list || helix.size > 1;
  d->rows = b.num_rows;
  d->num_sampled = b.num_sampled;
  d->n_decode = d->n_chunk = d->max_chunk_tokens = d->max_decode_ctx = 0;
  int64_t blocks = 0;
  for (const StepSeq& s : b.seqs) {
    blocks += s.num_blocks;
    if (s.num_tokens == 1) {
      ++d->n_decode;
      d->max_decode_ctx = std::max(d->max_decode_ctx, s.start_pos + 1);
    } else {
      ++d->n_chunk;
      d->max_chunk_tokens = std::max(d->max_chunk_tokens, s.num_tokens);
    }
  }
  const size_t seq_ints = sizeof(AttnSeq) / sizeof(int32_t);
  const size_t rows = size_t(d->rows);
  d->off_tokens = 0;
  d->off_pos = d->off_tokens + rows;
  d->off_page = d->off_pos + rows;
  d->off_slot = d->off_page + rows;
  d->off_sample = d->off_slot + rows;
  d->off_decode_rows = d->off_sample + size_t(d->num_sampled);
  d->off_blocks = d->off_decode_rows + size_t(d->n_decode);
  d->off_dseqs = round_up(d->off_blocks + size_t(blocks), 8);  // AttnSeq: 32-byte aligned
  d->off_cseqs = d->off_dseqs + size_t(d->n_decode) * seq_ints;
  d->off_hseqs = d->off_cseqs + size_t(d->n_chunk) * seq_ints;
  d->total = d->off_hseqs + (d->row_list ? rows * seq_ints : 0);
}

void fill_step_desc(const StepBatch& b, int32_t P, StepDesc* d, int32_t* h) {
  AttnSeq* dseq = reinterpret_cast<AttnSeq*>(h + d->off_dseqs);
  AttnSeq* cseq = reinterpret_cast<AttnSeq*>(h + d->off_cseqs);
  AttnSeq* hseq = reinterpret_cast<AttnSeq*>(h + d->off_hseqs);
  const HelixShare cp = d->helix;
  d->sample_seq.clear();
  d->fi_decode.clear();
  d->fi_chunks.clear();
  // Rows: decode sequences first, then the chunks (see the header).
  int32_t decode_row = 0, chunk_row = d->n_decode, blk = 0, nd = 0, nc = 0, ns = 0, chunk_part = 0;
  for (size_t i = 0; i < b.seqs.size(); ++i) {
    const StepSeq& s = b.seqs[i];
    const bool is_decode = s.num_tokens == 1;
    const int32_t row = is_decode ? decode_row++ : chunk_row;
    if (!is_decode) chunk_row += s.num_tokens;
    for (int32_t t = 0; t < s.num_tokens; ++t) {
      const int32_t pos = s.start_pos + t;
      h[d->off_tokens + row + t] = s.tokens[t];
      h[d->off_pos + row + t] = pos;
      // Helix: only the member owning the position's page writes it.
      h[d->off_page + row + t] = (pos / P) % cp.size == cp.rank ? s.blocks[pos / (P * cp.size)] : -1;
      h[d->off_slot + row + t] = pos % P;
      if (d->row_list) {
        const int32_t keys = helix_local_keys(pos, P, cp);
        hseq[row + t] = AttnSeq{row + t, 1, keys - 1, blk, 0, keys, row + t, 0};
      }
    }
    std::memcpy(h + d->off_blocks + blk, s.blocks, sizeof(int32_t) * size_t(s.num_blocks));
    AttnSeq a{row, s.num_tokens, s.start_pos, blk, 0, s.start_pos + s.num_tokens, 0, 0};
    const FiSeq f{s.num_tokens, s.start_pos + s.num_tokens, s.blocks};
    if (is_decode) {
      a.part_row = nd;
      h[d->off_decode_rows + nd] = row;
      dseq[nd++] = a;
      d->fi_decode.push_back(f);
    } else {
      a.part_row = chunk_part;
      chunk_part += s.num_tokens;
      cseq[nc++] = a;
      d->fi_chunks.push_back(f);
    }
    // Sampled rows in batch order (the logits are returned in that order).
    if (s.sample) {
      h[d->off_sample + ns++] = row + s.num_tokens - 1;
      d->sample_seq.push_back(int32_t(i));
    }
    blk += s.num_blocks;
  }
}

void size_graph_desc(int32_t B, StepDesc* d) {
  d->rows = B;
  d->num_sampled = B;
  d->n_decode = B;
  d->n_chunk = d->max_chunk_tokens = d->max_decode_ctx = 0;
  d->off_tokens = 0;
  d->off_pos = size_t(B);
  d->off_page = 2 * size_t(B);
  d->off_slot = 3 * size_t(B);
  d->off_sample = 4 * size_t(B);
  d->off_decode_rows = 5 * size_t(B);
  d->off_blocks = d->off_dseqs = d->off_cseqs = d->off_hseqs = 6 * size_t(B);  // unused: FlashInfer has its own lists
  d->helix = HelixShare{};  // a graph step is never a Helix step
  d->row_list = false;
  d->total = 6 * size_t(B);
}

void fill_graph_desc(const StepBatch& b, int32_t B, int32_t P, StepDesc* d, int32_t* h) {
  const int32_t n = int32_t(b.seqs.size());
  d->sample_seq.clear();
  d->fi_chunks.clear();
  d->fi_decode.resize(size_t(B));
  d->max_decode_ctx = 0;
  const int32_t* pad_page = b.seqs[0].blocks;
  for (int32_t r = 0; r < B; ++r) {
    if (r < n) {
      const StepSeq& s = b.seqs[size_t(r)];
      h[d->off_tokens + r] = s.tokens[0];
      h[d->off_pos + r] = s.start_pos;
      h[d->off_page + r] = s.blocks[s.start_pos / P];
      h[d->off_slot + r] = s.start_pos % P;
      d->fi_decode[size_t(r)] = FiSeq{1, s.start_pos + 1, s.blocks};
      d->max_decode_ctx = std::max(d->max_decode_ctx, s.start_pos + 1);
    } else {
      h[d->off_tokens + r] = 0;
      h[d->off_pos + r] = 0;
      h[d->off_page + r] = -1;
      h[d->off_slot + r] = 0;
      d->fi_decode[size_t(r)] = FiSeq{1, 1, pad_page};
    }
    h[d->off_sample + r] = r;
    h[d->off_decode_rows + r] = r;
  }
}

FiLists size_fi_lists(const FiSeq* decode, int32_t nd, const FiSeq* chunks, int32_t nc, int32_t P) {
  size_t dec_pages = 0, pre_pages = 0;
  for (int32_t i = 0; i < nd; ++i) dec_pages += size_t(pages_of(decode[i], P));
  for (int32_t i = 0; i < nc; ++i) pre_pages += size_t(pages_of(chunks[i], P));
  FiLists l;
  l.off_dec_indptr = 0;
  l.off_dec_last = l.off_dec_indptr + size_t(nd) + 1;
  l.off_pre_qo = l.off_dec_last + size_t(nd);
  l.off_pre_indptr = l.off_pre_qo + size_t(nc) + 1;
  l.off_pre_last = l.off_pre_indptr + size_t(nc) + 1;
  l.off_dec_idx = round_up(l.off_pre_last + size_t(nc), 4);
  l.off_pre_idx = l.off_dec_idx + round_up(dec_pages, 4);
  l.total = l.off_pre_idx + pre_pages + 4;
  l.pre_row0 = nd;  // the decode list has one row per sequence
  for (int32_t i = 0; i < nc; ++i) l.pre_rows += chunks[i].q_rows;
  return l;
}

void fill_fi_lists(const FiSeq* decode, int32_t nd, const FiSeq* chunks, int32_t nc, int32_t P, const FiLists& l,
                   int32_t* h) {
  fill_list(decode, nd, P, h + l.off_dec_indptr, h + l.off_dec_last, h + l.off_dec_idx);
  fill_list(chunks, nc, P, h + l.off_pre_indptr, h + l.off_pre_last, h + l.off_pre_idx);
  int64_t rows = 0;
  h[l.off_pre_qo] = 0;
  for (int32_t i = 0; i < nc; ++i) {
    rows += chunks[i].q_rows;
    h[l.off_pre_qo + size_t(i) + 1] = int32_t(rows);
  }
}

FiKVView fi_kv_view(int32_t layer, int32_t hkv, int32_t P, int32_t D, int64_t page_elems) {
  FiKVView v;
  v.layout = FiKVLayout::kHND;
  v.strides[0] = page_elems;         // page
  v.strides[1] = int64_t(P) * D;     // head (HND: heads outside slots)
  v.strides[2] = D;                  // slot
  v.k_offset = kv_page_offset(page_elems, P, hkv, D, 0, layer, 0, 0);
  v.v_offset = kv_page_offset(page_elems, P, hkv, D, 0, layer, 1, 0);
  return v;
}

}  // namespace lockstep

namespace lockstep {

FiMlaView fi_mla_view(int32_t layer, int32_t P, int32_t kv_lora, int32_t rope, int64_t page_elems) {
  const int32_t W = kv_lora + rope;
  FiMlaView v;
  v.ckv_offset = latent_offset(page_elems, P, W, 0, layer, 0);
  v.kpe_offset = v.ckv_offset + kv_lora;
  v.stride_page = page_elems;
  v.stride_n = W;
  return v;
}

FiMlaList size_fi_mla_list(const FiSeq* decode, int32_t nd, const FiSeq* chunks, int32_t nc, int32_t P) {
  size_t pages = 0;
  for (int32_t i = 0; i < nd; ++i) pages += size_t(pages_of(decode[i], P));
  for (int32_t i = 0; i < nc; ++i) pages += size_t(pages_of(chunks[i], P));
  const size_t n = size_t(nd) + size_t(nc);
  FiMlaList l;
  l.batch = int32_t(n);
  l.off_qo_indptr = 0;
  l.off_kv_indptr = l.off_qo_indptr + n + 1;
  l.off_kv_len = l.off_kv_indptr + n + 1;
  l.off_indices = round_up(l.off_kv_len + n, 4);
  l.total = l.off_indices + pages + 4;
  return l;
}

void fill_fi_mla_list(const FiSeq* decode, int32_t nd, const FiSeq* chunks, int32_t nc, int32_t P,
                      const FiMlaList& l, int32_t* h) {
  int32_t rows = 0, pages = 0;
  h[l.off_qo_indptr] = 0;
  h[l.off_kv_indptr] = 0;
  for (int32_t i = 0; i < nd + nc; ++i) {
    const FiSeq& s = i < nd ? decode[i] : chunks[i - nd];
    const int32_t np = pages_of(s, P);
    for (int32_t k = 0; k < np; ++k) h[l.off_indices + size_t(pages + k)] = s.blocks[k];
    rows += s.q_rows;
    pages += np;
    h[l.off_qo_indptr + size_t(i) + 1] = rows;
    h[l.off_kv_indptr + size_t(i) + 1] = pages;
    h[l.off_kv_len + size_t(i)] = s.kv_len;
  }
}

}  // namespace lockstep
