// test_fi_descriptors: every descriptor the CUDA engine hands FlashInfer,
// checked on the CPU (no CUDA needed; it runs in `make test`).
//
// The engine's own host-side builders (cuda/step_layout.h: the code
// model_cuda.cu, decode_graph.cu and flashinfer_attn.cu call) make a step's
// descriptors for mixed decode/chunk batches (pages of 16/32/64, head dims
// 64/128, sequences in a mixed batch order) and for decode-graph buckets 8
// and 16 with padding rows. Then:
//   1. kv_append is replayed on a simulated page slab whose every element
//      records what was written there (which token at which position, layer,
//      K or V, head, dimension): the prefix positions as earlier steps wrote
//      them, the step's rows through the engine's page/slot per row;
//   2. every key every query row attends is read back through FlashInfer's
//      documented paged_kv_t addressing (page.cuh: get_length =
//      (indptr[i+1] - indptr[i] - 1) * page_size + last_page_len[i];
//      get_elem_offset = page * stride_page + head * stride_h + entry *
//      stride_n + feat, with the HND/NHD reading of custom strides; decode
//      request i is query row i; prefill request j's rows start at its
//      qo_indptr after the decode rows, causal bottom-right aligned) from the
//      plan inputs the engine builds (indptr, indices, last_page_len,
//      qo_indptr) and the slab view it gives paged_kv_t;
//   3. each query row must see exactly its own sequence's keys at positions
//      0..its own position, each with the identity its writer left;
//   4. padding rows write nothing and read only a key the step already uses;
//      sampled rows are each sequence's last row, in batch order;
//   5. base-2 LSE × ln 2 (the engine's conversion) is the natural LSE.
// The checker must also fail on planted bugs: NHD instead of HND strides, an
// off-by-one in last_page_len, chunk rows before decode rows (mutated copies
// of correct descriptors, below).
//
// Helix (run_helix_case): the same batches on 2 and 3 context-parallel
// members, each with its own local block tables (a block is P * members
// global tokens). Every member's writes are replayed on its own slab; each
// row's Helix entry is read back on every member through the block table and
// the key range the hand-written decode kernel uses. Every row must write
// exactly on the member owning its position, and the members' reads of a row
// together must see each key 0..its position exactly once (so the merged
// partials are its whole attention), and nothing after it. Planted bugs: one
// key too many, every member writing, a member using another's share.
//
// MLA (run_mla_case): the same batches on latent pages (page[layer][slot]
// [kv_lora + rope]): every row's keys read back through FlashInfer's MLA
// request list (qo_indptr, kv_indptr, kv_len, indices, causal bottom-right)
// and its ckv/kpe view, and through the per-row list of the hand-written MLA
// kernel, must be the latents their writers left. Planted bugs: a slot
// stride of the K/V view, kpe read from the latent's start, a short kv_len.
#include <algorithm>
#include <cmath>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <numeric>
#include <string>
#include <vector>

#include "check.h"
#include "step_layout.h"

using namespace lockstep;

namespace {

constexpr int32_t kLayers = 2, kKVHeads = 2;
constexpr int32_t kTokBase = 100000;  // token id of (seq, pos) = seq * kTokBase + pos

int32_t token_of(int32_t seq, int32_t pos) { return seq * kTokBase + pos; }

// What a writer left in one slab element: token, position, layer, K|V, head,
// dimension, packed; -1 = never written.
int64_t key_id(int32_t token, int32_t pos, int32_t layer, int32_t kv, int32_t head, int32_t d) {
  return ((((int64_t(token) * (1 << 20) + pos) * kLayers + layer) * 2 + kv) * kKVHeads + head) * 256 + d;
}

// A sequence of a test batch: its step tokens are positions [start, start + n).
struct SeqSpec {
  int32_t start, n;
  bool sample;
};

struct Case {
  const char* name;
  int32_t P, D;
  std::vector<SeqSpec> seqs;
  int32_t bucket = 0;  // > 0: a decode-graph step padded to this bucket
};

// Collects failures (printed unless quiet: the mutation cases expect some).
struct Checker {
  bool quiet = false;
  int errors = 0;
  void expect(bool ok, const char* fmt, ...) {
    if (ok) return;
    if (!quiet && errors < 8) {
      va_list ap;
      va_start(ap, fmt);
      std::fprintf(stderr, "  descriptor check: ");
      std::vfprintf(stderr, fmt, ap);
      std::fprintf(stderr, "\n");
      va_end(ap);
    }
    ++errors;
  }
};

// A batch built from specs, owning its tokens and block tables (disjoint,
// scattered pages).
struct Batch {
  StepBatch b;
  std::vector<std::vector<int32_t>> tokens, blocks;
  int32_t num_pages = 0;
};

// Points out->b's sequences at out's tokens and block tables.
void link_batch(const Case& c, Batch* out) {
  for (size_t i = 0; i < c.seqs.size(); ++i) {
    StepSeq q{};
    q.tokens = out->tokens[i].data();
    q.num_tokens = c.seqs[i].n;
    q.start_pos = c.seqs[i].start;
    q.blocks = out->blocks[i].data();
    q.num_blocks = int32_t(out->blocks[i].size());
    q.sample = c.seqs[i].sample;
    out->b.seqs.push_back(q);
    out->b.num_rows += q.num_tokens;
    out->b.num_sampled += q.sample ? 1 : 0;
  }
}

Batch make_batch(const Case& c) {
  Batch out;
  const size_t n = c.seqs.size();
  out.tokens.resize(n);
  out.blocks.resize(n);
  int32_t total = 0;
  for (const SeqSpec& s : c.seqs) total += (s.start + s.n + c.P - 1) / c.P;
  out.num_pages = total + 3;
  // Pages in a scattered order (7 is coprime with every num_pages used here
  // that is not a multiple of 7; fall back to the identity otherwise).
  std::vector<int32_t> order(size_t(out.num_pages));
  for (int32_t i = 0; i < out.num_pages; ++i) order[size_t(i)] = out.num_pages % 7 ? (i * 7 + 3) % out.num_pages : i;
  int32_t next = 0;
  for (size_t i = 0; i < n; ++i) {
    const SeqSpec& s = c.seqs[i];
    for (int32_t t = 0; t < s.n; ++t) out.tokens[i].push_back(token_of(int32_t(i), s.start + t));
    const int32_t nb = (s.start + s.n + c.P - 1) / c.P;
    for (int32_t k = 0; k < nb; ++k) out.blocks[i].push_back(order[size_t(next++)]);
  }
  link_batch(c, &out);
  return out;
}

// Everything the engine hands the device for one step, as the engine builds it.
struct Built {
  StepDesc desc;
  std::vector<int32_t> h;      // the step descriptor buffer
  FiLists lists;
  std::vector<int32_t> fi;     // FlashInfer's plan inputs
  std::vector<FiKVView> views; // paged_kv_t's view of each layer
  int64_t page_elems = 0;
};

Built build(const Case& c, const Batch& bt) {
  Built o;
  o.page_elems = int64_t(kLayers) * 2 * kKVHeads * c.P * c.D;
  if (c.bucket > 0) {
    size_graph_desc(c.bucket, &o.desc);
    o.h.assign(o.desc.total, -7);
    fill_graph_desc(bt.b, c.bucket, c.P, &o.desc, o.h.data());
  } else {
    size_step_desc(bt.b, &o.desc);
    o.h.assign(o.desc.total, -7);
    fill_step_desc(bt.b, c.P, &o.desc, o.h.data());
  }
  const StepDesc& d = o.desc;
  o.lists = size_fi_lists(d.fi_decode.data(), int32_t(d.fi_decode.size()), d.fi_chunks.data(),
                          int32_t(d.fi_chunks.size()), c.P);
  o.fi.assign(o.lists.total, -7);
  fill_fi_lists(d.fi_decode.data(), int32_t(d.fi_decode.size()), d.fi_chunks.data(), int32_t(d.fi_chunks.size()),
                c.P, o.lists, o.fi.data());
  for (int32_t l = 0; l < kLayers; ++l) o.views.push_back(fi_kv_view(l, kKVHeads, c.P, c.D, o.page_elems));
  return o;
}

// FlashInfer's reading of a paged_kv_t built with custom strides (page.cuh).
struct FiAddr {
  int64_t base, stride_page, stride_h, stride_n;
  int64_t at(int64_t page, int64_t head, int64_t entry, int64_t feat) const {
    return base + page * stride_page + head * stride_h + entry * stride_n + feat;
  }
};
FiAddr fi_addr(const FiKVView& v, bool value) {
  const bool hnd = v.layout == FiKVLayout::kHND;
  return {value ? v.v_offset : v.k_offset, v.strides[0], hnd ? v.strides[1] : v.strides[2],
          hnd ? v.strides[2] : v.strides[1]};
}

// One FlashInfer request list (decode or prefill) as its kernels read it.
struct FiList {
  const int32_t *indptr, *last, *indices;
  int32_t length(int32_t i, int32_t P) const {
    if (indptr[i + 1] == indptr[i]) return 0;
    return (indptr[i + 1] - indptr[i] - 1) * P + last[i];
  }
};

// The simulated slab: kv_append of earlier steps (the prefix) and of this step.
std::vector<int64_t> replay_writes(const Case& c, const Batch& bt, const Built& o, int32_t n_real) {
  std::vector<int64_t> slab(size_t(bt.num_pages * o.page_elems), -1);
  auto write = [&](int32_t page, int32_t slot, int32_t token, int32_t pos) {
    for (int32_t l = 0; l < kLayers; ++l)
      for (int32_t kv = 0; kv < 2; ++kv)
        for (int32_t hd = 0; hd < kKVHeads; ++hd)
          for (int32_t d = 0; d < c.D; ++d)
            slab[size_t(kv_page_offset(o.page_elems, c.P, kKVHeads, c.D, page, l, kv, hd) + int64_t(slot) * c.D + d)] =
                key_id(token, pos, l, kv, hd, d);
  };
  for (int32_t i = 0; i < n_real; ++i)
    for (int32_t p = 0; p < c.seqs[size_t(i)].start; ++p)
      write(bt.blocks[size_t(i)][size_t(p / c.P)], p % c.P, token_of(i, p), p);
  const StepDesc& d = o.desc;
  for (int64_t r = 0; r < d.rows; ++r) {
    const int32_t page = o.h[d.off_page + size_t(r)];
    if (page < 0) continue;  // kv_append: a padding row writes nothing
    write(page, o.h[d.off_slot + size_t(r)], o.h[d.off_tokens + size_t(r)], o.h[d.off_pos + size_t(r)]);
  }
  return slab;
}

// Reads request i's keys [0, len) of `list` for every layer/K|V/head/dim and
// checks each is the key of (seq, p) as its writer left it.
void check_keys(Checker& ck, const Case& c, const Built& o, const std::vector<int64_t>& slab, const FiList& list,
                int32_t i, int32_t len, int32_t seq, const char* what) {
  for (int32_t p = 0; p < len; ++p) {
    const int32_t page = list.indices[list.indptr[i] + p / c.P], entry = p % c.P;
    int bad = 0;
    for (int32_t l = 0; l < kLayers && bad == 0; ++l)
      for (int32_t kv = 0; kv < 2; ++kv) {
        const FiAddr a = fi_addr(o.views[size_t(l)], kv == 1);
        for (int32_t hd = 0; hd < kKVHeads; ++hd)
          for (int32_t d = 0; d < c.D; ++d) {
            const int64_t at = a.at(page, hd, entry, d);
            const bool in = at >= 0 && at < int64_t(slab.size());
            bad += !(in && slab[size_t(at)] == key_id(token_of(seq, p), p, l, kv, hd, d));
          }
      }
    ck.expect(bad == 0, "%s: %s request %d reads a wrong key at position %d (%d elements differ)", c.name, what, i, p,
              bad);
    if (bad) return;
  }
}

// Steps 2-4 of the file comment on one built step (possibly mutated).
void check_step(Checker& ck, const Case& c, const Batch& bt, const Built& o) {
  const StepDesc& d = o.desc;
  const int32_t n_real = int32_t(bt.b.seqs.size());
  const std::vector<int64_t> slab = replay_writes(c, bt, o, n_real);
  const int32_t* f = o.fi.data();
  const FiList dec{f + o.lists.off_dec_indptr, f + o.lists.off_dec_last, f + o.lists.off_dec_idx};
  const FiList pre{f + o.lists.off_pre_indptr, f + o.lists.off_pre_last, f + o.lists.off_pre_idx};
  const int32_t nd = int32_t(d.fi_decode.size()), nc = int32_t(d.fi_chunks.size());
  const int32_t* qo = f + o.lists.off_pre_qo;
  ck.expect(o.lists.pre_row0 + o.lists.pre_rows == d.rows && o.lists.pre_row0 == nd,
            "%s: decode rows [0, %d) and prefill rows [%lld, +%lld) do not partition the step's %lld rows", c.name, nd,
            (long long)o.lists.pre_row0, (long long)o.lists.pre_rows, (long long)d.rows);
  // A row's token and position as the engine laid them out.
  auto row_seq = [&](int64_t r, int32_t* pos) {
    const int32_t tok = o.h[d.off_tokens + size_t(r)];
    *pos = o.h[d.off_pos + size_t(r)];
    ck.expect(tok % kTokBase == *pos, "%s: row %lld holds token %d at position %d", c.name, (long long)r, tok, *pos);
    return tok / kTokBase;
  };
  auto check_last = [&](const FiList& l, int32_t i, const char* what) {
    ck.expect(l.last[i] >= 1 && l.last[i] <= c.P, "%s: %s request %d: last_page_len %d outside [1, %d]", c.name, what,
              i, l.last[i], c.P);
  };
  // Decode: request i is query row i and sees every key up to its position.
  for (int32_t i = 0; i < nd; ++i) {
    int32_t pos = 0;
    if (i >= n_real) {  // a graph bucket's padding row
      ck.expect(o.h[d.off_page + size_t(i)] == -1, "%s: padding row %d writes KV (page %d)", c.name, i,
                o.h[d.off_page + size_t(i)]);
      ck.expect(dec.length(i, c.P) == 1 && dec.indices[dec.indptr[i]] == bt.blocks[0][0],
                "%s: padding row %d does not read exactly the first key of sequence 0's first page", c.name, i);
      check_last(dec, i, "decode");
      check_keys(ck, c, o, slab, dec, i, 1, 0, "padding");
      continue;
    }
    const int32_t seq = row_seq(i, &pos);
    const int32_t len = dec.length(i, c.P);
    check_last(dec, i, "decode");
    ck.expect(len == pos + 1, "%s: decode row %d at position %d sees %d keys, not %d", c.name, i, pos, len, pos + 1);
    check_keys(ck, c, o, slab, dec, i, std::min(len, pos + 1), seq, "decode");
  }
  // Prefill: request j's rows follow the decode rows, causal bottom-right.
  for (int32_t j = 0; j < nc; ++j) {
    const int32_t qlen = qo[j + 1] - qo[j], len = pre.length(j, c.P);
    check_last(pre, j, "prefill");
    int32_t first_pos = 0;
    const int32_t seq = row_seq(o.lists.pre_row0 + qo[j], &first_pos);
    check_keys(ck, c, o, slab, pre, j, std::max(0, len), seq, "prefill");
    for (int32_t t = 0; t < qlen; ++t) {
      int32_t pos = 0;
      const int64_t r = o.lists.pre_row0 + qo[j] + t;
      const int32_t rs = row_seq(r, &pos);
      const int32_t sees = len - qlen + t + 1;
      ck.expect(rs == seq && sees == pos + 1,
                "%s: prefill request %d row %d (seq %d, position %d) sees %d keys of seq %d", c.name, j, t, rs, pos,
                sees, seq);
    }
  }
  // Sampled rows: every row of a graph bucket; otherwise each sampled
  // sequence's last row, in batch order.
  if (c.bucket > 0) {
    for (int32_t r = 0; r < d.num_sampled; ++r)
      ck.expect(o.h[d.off_sample + size_t(r)] == r, "%s: graph sample row %d is %d", c.name, r,
                o.h[d.off_sample + size_t(r)]);
  } else {
    int32_t k = 0;
    for (int32_t i = 0; i < n_real; ++i) {
      if (!c.seqs[size_t(i)].sample) continue;
      int32_t pos = 0;
      const bool ok = k < d.num_sampled && d.sample_seq[size_t(k)] == i;
      const int32_t rs = ok ? row_seq(o.h[d.off_sample + size_t(k)], &pos) : -1;
      ck.expect(ok && rs == i && pos == c.seqs[size_t(i)].start + c.seqs[size_t(i)].n - 1,
                "%s: sample %d is not sequence %d's last row", c.name, k, i);
      ++k;
    }
    ck.expect(k == d.num_sampled, "%s: %d sampled rows, %d sampled sequences", c.name, d.num_sampled, k);
  }
}

// The hand-written kernels' sequence lists (head dims 16/32) from the same
// buffer: each AttnSeq names its sequence's first row, positions and block table.
void check_attn_seqs(Checker& ck, const Case& c, const Batch& bt, const Built& o) {
  const StepDesc& d = o.desc;
  const AttnSeq* dseq = reinterpret_cast<const AttnSeq*>(o.h.data() + d.off_dseqs);
  const AttnSeq* cseq = reinterpret_cast<const AttnSeq*>(o.h.data() + d.off_cseqs);
  int32_t nd = 0, nc = 0;
  for (size_t i = 0; i < bt.b.seqs.size(); ++i) {
    const StepSeq& s = bt.b.seqs[i];
    const AttnSeq& a = s.num_tokens == 1 ? dseq[nd++] : cseq[nc++];
    bool ok = a.num_tokens == s.num_tokens && a.start_pos == s.start_pos && a.kv_begin == 0 &&
              a.kv_end == s.start_pos + s.num_tokens && o.h[d.off_tokens + size_t(a.q_row)] == s.tokens[0];
    for (int32_t k = 0; k < s.num_blocks; ++k) ok = ok && o.h[d.off_blocks + size_t(a.block_off + k)] == s.blocks[k];
    if (s.num_tokens == 1) ok = ok && o.h[d.off_decode_rows + size_t(nd - 1)] == a.q_row;
    ck.expect(ok, "%s: the hand-written kernels' entry for sequence %zu is wrong", c.name, i);
  }
}

// Runs the checker on the engine's descriptors (must pass), then on mutated
// copies carrying each planted bug (must fail).
void run_case(const Case& c) {
  const Batch bt = make_batch(c);
  const Built o = build(c, bt);
  Checker ck;
  check_step(ck, c, bt, o);
  if (c.bucket == 0) check_attn_seqs(ck, c, bt, o);
  CHECKF(ck.errors == 0, "%s: %d descriptor errors", c.name, ck.errors);

  auto must_fail = [&](const char* bug, Built m) {
    Checker q;
    q.quiet = true;
    check_step(q, c, bt, m);
    CHECKF(q.errors > 0, "%s: the checker missed a planted bug: %s", c.name, bug);
  };
  {  // NHD instead of HND: the strides read as [slot][head] instead of [head][slot].
    Built m = o;
    for (FiKVView& v : m.views) v.layout = FiKVLayout::kNHD;
    must_fail("NHD layout", m);
  }
  if (!o.desc.fi_decode.empty()) {  // last_page_len one short
    Built m = o;
    m.fi[m.lists.off_dec_last] -= 1;
    must_fail("decode last_page_len - 1", m);
  }
  if (!o.desc.fi_chunks.empty()) {
    Built m = o;
    m.fi[m.lists.off_pre_last + o.desc.fi_chunks.size() - 1] += 1;
    must_fail("prefill last_page_len + 1", m);
  }
  if (o.desc.n_decode > 0 && o.desc.n_chunk > 0) {
    // Chunk rows before decode rows: the engine's row arrays rotated so that
    // the chunks' rows come first, everything else unchanged.
    Built m = o;
    const StepDesc& d = o.desc;
    const size_t rows = size_t(d.rows), nd = size_t(d.n_decode);
    for (size_t off : {d.off_tokens, d.off_pos, d.off_page, d.off_slot})
      std::rotate(m.h.begin() + long(off), m.h.begin() + long(off + nd), m.h.begin() + long(off + rows));
    must_fail("chunk rows before decode rows", m);
  }
}

// FlashInfer's LSE (base 2, from its online softmax over scores scaled by
// sm_scale * log2 e) converted by the engine equals the natural LSE.
void check_lse() {
  uint64_t x = 12345;
  auto rnd = [&x] {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return double(x >> 11) / double(1ull << 53) * 2.0 - 1.0;
  };
  double worst = 0, worst_raw = 1e30;
  for (int n : {1, 7, 100, 4096}) {
    for (double amp : {0.5, 8.0, 60.0}) {
      const double scale = 1.0 / std::sqrt(128.0);
      std::vector<double> s(static_cast<size_t>(n));
      for (double& v : s) v = amp * rnd() * std::sqrt(128.0);
      // Natural LSE in double.
      const double mx = *std::max_element(s.begin(), s.end()) * scale;
      double sum = 0;
      for (double v : s) sum += std::exp(v * scale - mx);
      const double natural = mx + std::log(sum);
      // FlashInfer's: m = max(s * scale * log2 e), d = Σ 2^(x - m), lse = m + log2 d (float).
      const float log2e = 1.4426950408889634f;
      float m2 = -INFINITY, d2 = 0;
      for (double v : s) m2 = std::max(m2, float(v) * float(scale) * log2e);
      for (double v : s) d2 += std::exp2(float(v) * float(scale) * log2e - m2);
      const float lse2 = m2 + std::log2(d2);
      const double err = std::fabs(double(lse_base2_to_natural(lse2)) - natural) / std::max(1.0, std::fabs(natural));
      worst = std::max(worst, err);
      worst_raw = std::min(worst_raw, std::fabs(double(lse2) - natural) / std::max(1.0, std::fabs(natural)));
    }
  }
  CHECKF(worst <= 2e-5, "base-2 LSE x ln 2 differs from the natural LSE by %.3g (relative)", worst);
  // The unconverted base-2 value must be told apart (the check can fail).
  CHECKF(worst_raw > 1e-3, "the base-2 LSE is indistinguishable from the natural one (%.3g)", worst_raw);
}

// --- Helix: the per-member descriptors (see the file comment). ---

// One member's copy of a batch: the same tokens, its own local block tables
// (block j holds global page j * size + rank), on pages of its own.
Batch make_helix_batch(const Case& c, HelixShare share) {
  Batch out;
  const size_t n = c.seqs.size();
  out.tokens.resize(n);
  out.blocks.resize(n);
  const int32_t span = c.P * share.size;
  int32_t total = 0;
  for (const SeqSpec& s : c.seqs) total += (s.start + s.n + span - 1) / span;
  out.num_pages = total + 2;
  int32_t next = 0;
  for (size_t i = 0; i < n; ++i) {
    const SeqSpec& s = c.seqs[i];
    for (int32_t t = 0; t < s.n; ++t) out.tokens[i].push_back(token_of(int32_t(i), s.start + t));
    const int32_t nb = (s.start + s.n + span - 1) / span;
    // Scattered: member k's pages counted down from the top.
    for (int32_t k = 0; k < nb; ++k) out.blocks[i].push_back(out.num_pages - 1 - (next++));
  }
  link_batch(c, &out);
  return out;
}

struct HelixBuilt {
  StepDesc desc;
  std::vector<int32_t> h;
  int64_t page_elems = 0;
};

HelixBuilt build_helix(const Case& c, const Batch& bt, HelixShare share) {
  HelixBuilt o;
  o.page_elems = int64_t(kLayers) * 2 * kKVHeads * c.P * c.D;
  size_step_desc(bt.b, &o.desc, share);
  o.h.assign(o.desc.total, -7);
  fill_step_desc(bt.b, c.P, &o.desc, o.h.data());
  return o;
}

// Replays member `share`'s writes and reads; adds to seen[seq][pos] every
// key the member's Helix entries read for the row at (seq, row position).
// seen is indexed [row][global position].
void check_helix_member(Checker& ck, const Case& c, const Batch& bt, const HelixBuilt& o, HelixShare share,
                        std::vector<std::vector<int32_t>>* seen) {
  const StepDesc& d = o.desc;
  ck.expect(d.off_hseqs + size_t(d.rows) * (sizeof(AttnSeq) / sizeof(int32_t)) <= d.total,
            "%s: the Helix list does not fit the descriptor buffer", c.name);
  std::vector<int64_t> slab(size_t(bt.num_pages * o.page_elems), -1);
  auto write = [&](int32_t page, int32_t slot, int32_t token, int32_t pos) {
    for (int32_t l = 0; l < kLayers; ++l)
      for (int32_t kv = 0; kv < 2; ++kv)
        for (int32_t hd = 0; hd < kKVHeads; ++hd)
          for (int32_t dd = 0; dd < c.D; ++dd)
            slab[size_t(kv_page_offset(o.page_elems, c.P, kKVHeads, c.D, page, l, kv, hd) + int64_t(slot) * c.D +
                        dd)] = key_id(token, pos, l, kv, hd, dd);
  };
  const int32_t span = c.P * share.size;
  auto owns = [&](int32_t pos) { return (pos / c.P) % share.size == share.rank; };
  for (size_t i = 0; i < c.seqs.size(); ++i)
    for (int32_t p = 0; p < c.seqs[i].start; ++p)
      if (owns(p)) write(bt.blocks[i][size_t(p / span)], p % c.P, token_of(int32_t(i), p), p);
  for (int64_t r = 0; r < d.rows; ++r) {
    const int32_t page = o.h[d.off_page + size_t(r)], pos = o.h[d.off_pos + size_t(r)];
    ck.expect((page >= 0) == owns(pos), "%s: member %d of %d: row %lld at position %d %s", c.name, share.rank,
              share.size, (long long)r, pos, page >= 0 ? "writes a position it does not own" : "is not written");
    if (page < 0) continue;
    if (page >= bt.num_pages) {
      ck.expect(false, "%s: row %lld writes page %d outside the slab", c.name, (long long)r, page);
      continue;
    }
    write(page, o.h[d.off_slot + size_t(r)], o.h[d.off_tokens + size_t(r)], pos);
  }
  const AttnSeq* hs = reinterpret_cast<const AttnSeq*>(o.h.data() + d.off_hseqs);
  for (int64_t r = 0; r < d.rows; ++r) {
    const AttnSeq& a = hs[r];
    const int32_t tok = o.h[d.off_tokens + size_t(r)], pos = o.h[d.off_pos + size_t(r)];
    const int32_t seq = tok / kTokBase;
    ck.expect(a.q_row == r && a.part_row == r && a.num_tokens == 1,
              "%s: member %d: Helix entry %lld names query row %d, partial row %d, %d tokens", c.name, share.rank,
              (long long)r, a.q_row, a.part_row, a.num_tokens);
    // The decode kernel's key range: [kv_begin, min(kv_end, start_pos + 1)).
    const int32_t k1 = std::min(a.kv_end, a.start_pos + 1);
    int bad = 0;
    for (int32_t p = a.kv_begin; p < k1 && bad == 0; ++p) {
      const int32_t j = p / c.P;  // local page
      const int32_t gpos = (j * share.size + share.rank) * c.P + p % c.P;
      const int32_t page = o.h[d.off_blocks + size_t(a.block_off + j)];
      if (page < 0 || page >= bt.num_pages) {
        ++bad;
        break;
      }
      for (int32_t l = 0; l < kLayers; ++l)
        for (int32_t kv = 0; kv < 2; ++kv)
          for (int32_t hd = 0; hd < kKVHeads; ++hd) {
            const int64_t at = kv_page_offset(o.page_elems, c.P, kKVHeads, c.D, page, l, kv, hd) +
                               int64_t(p % c.P) * c.D + c.D - 1;
            bad += slab[size_t(at)] != key_id(token_of(seq, gpos), gpos, l, kv, hd, c.D - 1);
          }
      if (bad == 0) {
        ck.expect(gpos <= pos, "%s: member %d: row %lld at position %d reads the later key %d", c.name, share.rank,
                  (long long)r, pos, gpos);
        if (gpos < int32_t((*seen)[size_t(r)].size())) ++(*seen)[size_t(r)][size_t(gpos)];
      }
    }
    ck.expect(bad == 0, "%s: member %d of %d: row %lld reads a key its writer did not leave there", c.name,
              share.rank, share.size, (long long)r);
  }
}

// Checks all members of one Helix group together; returns the errors.
int check_helix(const Case& c, int32_t size, bool quiet,
                const std::function<void(HelixShare, HelixBuilt*)>& mutate = nullptr) {
  Checker ck;
  ck.quiet = quiet;
  int64_t rows = 0;
  for (const SeqSpec& s : c.seqs) rows += s.n;
  std::vector<std::vector<int32_t>> seen(static_cast<size_t>(rows));
  std::vector<int32_t> row_pos(size_t(rows), 0);
  for (int32_t k = 0; k < size; ++k) {
    const HelixShare share{size, k};
    const Batch bt = make_helix_batch(c, share);
    HelixBuilt o = build_helix(c, bt, share);
    if (k == 0)
      for (int64_t r = 0; r < rows; ++r) {
        row_pos[size_t(r)] = o.h[o.desc.off_pos + size_t(r)];
        seen[size_t(r)].assign(size_t(row_pos[size_t(r)] + 1), 0);
      }
    if (mutate) mutate(share, &o);
    check_helix_member(ck, c, bt, o, share, &seen);
  }
  for (int64_t r = 0; r < rows; ++r)
    for (int32_t p = 0; p <= row_pos[size_t(r)]; ++p)
      ck.expect(seen[size_t(r)][size_t(p)] == 1, "%s on %d members: row %lld (position %d) sees key %d %d times",
                c.name, size, (long long)r, row_pos[size_t(r)], p, seen[size_t(r)][size_t(p)]);
  return ck.errors;
}

void run_helix_case(const Case& c) {
  for (int32_t size : {2, 3}) {
    CHECKF(check_helix(c, size, false) == 0, "%s: Helix descriptors on %d members are wrong", c.name, size);
    const size_t seq_ints = sizeof(AttnSeq) / sizeof(int32_t);
    auto hseq = [&](HelixBuilt* o, int64_t r) {
      return reinterpret_cast<AttnSeq*>(o->h.data() + o->desc.off_hseqs + size_t(r) * seq_ints);
    };
    // One key too many for the last row on the member owning its page.
    CHECKF(check_helix(c, size, true,
                       [&](HelixShare share, HelixBuilt* o) {
                         const int64_t r = o->desc.rows - 1;
                         const int32_t pos = o->h[o->desc.off_pos + size_t(r)];
                         if ((pos / c.P) % share.size == share.rank) {
                           hseq(o, r)->kv_end += 1;
                           hseq(o, r)->start_pos += 1;
                         }
                       }) > 0,
           "%s: the Helix checker missed a row reading one key too many", c.name);
    // Every member writes every row.
    CHECKF(check_helix(c, size, true,
                       [&](HelixShare, HelixBuilt* o) {
                         for (int64_t r = 0; r < o->desc.rows; ++r)
                           if (o->h[o->desc.off_page + size_t(r)] < 0) o->h[o->desc.off_page + size_t(r)] = 0;
                       }) > 0,
           "%s: the Helix checker missed a member writing positions it does not own", c.name);
    // Member 1 computes its key counts as member 0 would.
    CHECKF(check_helix(c, size, true,
                       [&](HelixShare share, HelixBuilt* o) {
                         if (share.rank != 1) return;
                         for (int64_t r = 0; r < o->desc.rows; ++r) {
                           const int32_t keys = helix_local_keys(o->h[o->desc.off_pos + size_t(r)], c.P,
                                                                 HelixShare{share.size, 0});
                           hseq(o, r)->kv_end = keys;
                           hseq(o, r)->start_pos = keys - 1;
                         }
                       }) > 0,
           "%s: the Helix checker missed a member reading with another member's share", c.name);
  }
}

// --- MLA: latent pages through FlashInfer's MLA addressing. ---

constexpr int32_t kLatent = 24, kRope = 8, kLatentW = kLatent + kRope;

struct MlaBuilt {
  StepDesc desc;
  std::vector<int32_t> h, fi;
  FiMlaList list;
  std::vector<FiMlaView> views;
  int64_t page_elems = 0;
};

MlaBuilt build_mla(const Case& c, const Batch& bt) {
  MlaBuilt o;
  o.page_elems = int64_t(kLayers) * c.P * kLatentW;
  size_step_desc(bt.b, &o.desc, HelixShare{}, /*row_list=*/true);
  o.h.assign(o.desc.total, -7);
  fill_step_desc(bt.b, c.P, &o.desc, o.h.data());
  const StepDesc& d = o.desc;
  o.list = size_fi_mla_list(d.fi_decode.data(), d.n_decode, d.fi_chunks.data(), d.n_chunk, c.P);
  o.fi.assign(o.list.total, -7);
  fill_fi_mla_list(d.fi_decode.data(), d.n_decode, d.fi_chunks.data(), d.n_chunk, c.P, o.list, o.fi.data());
  for (int32_t l = 0; l < kLayers; ++l) o.views.push_back(fi_mla_view(l, c.P, kLatent, kRope, o.page_elems));
  return o;
}

// Replays the latent writes (prefix and step rows) and reads every query
// row's keys back twice: through FlashInfer's MLA request list and view, and
// through the per-row list the hand-written MLA kernel reads.
int check_mla(const Case& c, const Batch& bt, const MlaBuilt& o, bool quiet) {
  Checker ck;
  ck.quiet = quiet;
  const StepDesc& d = o.desc;
  std::vector<int64_t> slab(size_t(bt.num_pages * o.page_elems), -1);
  auto write = [&](int32_t page, int32_t slot, int32_t token, int32_t pos) {
    for (int32_t l = 0; l < kLayers; ++l)
      for (int32_t e = 0; e < kLatentW; ++e)
        slab[size_t(latent_offset(o.page_elems, c.P, kLatentW, page, l, slot) + e)] = key_id(token, pos, l, 0, 0, e);
  };
  for (size_t i = 0; i < c.seqs.size(); ++i)
    for (int32_t p = 0; p < c.seqs[i].start; ++p)
      write(bt.blocks[i][size_t(p / c.P)], p % c.P, token_of(int32_t(i), p), p);
  for (int64_t r = 0; r < d.rows; ++r)
    write(o.h[d.off_page + size_t(r)], o.h[d.off_slot + size_t(r)], o.h[d.off_tokens + size_t(r)],
          o.h[d.off_pos + size_t(r)]);
  auto read_ok = [&](int64_t ckv_at, int64_t kpe_at, int32_t seq, int32_t p, int32_t l) {
    int bad = 0;
    for (int32_t e = 0; e < kLatentW; ++e) {
      const int64_t at = e < kLatent ? ckv_at + e : kpe_at + (e - kLatent);
      bad += !(at >= 0 && at < int64_t(slab.size()) && slab[size_t(at)] == key_id(token_of(seq, p), p, l, 0, 0, e));
    }
    return bad == 0;
  };
  const int32_t* f = o.fi.data();
  int64_t row = 0;
  for (int32_t i = 0; i < o.list.batch; ++i) {
    const int32_t q0 = f[o.list.off_qo_indptr + size_t(i)], q1 = f[o.list.off_qo_indptr + size_t(i) + 1];
    const int32_t len = f[o.list.off_kv_len + size_t(i)], pg = f[o.list.off_kv_indptr + size_t(i)];
    ck.expect(q0 == row && f[o.list.off_kv_indptr + size_t(i) + 1] - pg == (len + c.P - 1) / c.P,
              "%s: MLA request %d: rows from %d (want %lld), %d pages for %d keys", c.name, i, q0, (long long)row,
              f[o.list.off_kv_indptr + size_t(i) + 1] - pg, len);
    for (int32_t t = 0; t < q1 - q0; ++t, ++row) {
      const int32_t tok = o.h[d.off_tokens + size_t(row)], pos = o.h[d.off_pos + size_t(row)];
      const int32_t seq = tok / kTokBase, sees = len - (q1 - q0) + t + 1;
      ck.expect(sees == pos + 1, "%s: MLA row %lld at position %d sees %d keys", c.name, (long long)row, pos, sees);
      for (int32_t p = 0; p < std::min(sees, pos + 1); ++p) {
        const int32_t page = f[o.list.off_indices + size_t(pg + p / c.P)];
        bool ok = true;
        for (int32_t l = 0; l < kLayers && ok; ++l) {
          const FiMlaView& v = o.views[size_t(l)];
          const int64_t base = int64_t(page) * v.stride_page + int64_t(p % c.P) * v.stride_n;
          ok = read_ok(v.ckv_offset + base, v.kpe_offset + base, seq, p, l);
        }
        ck.expect(ok, "%s: FlashInfer MLA row %lld reads a wrong latent at position %d", c.name, (long long)row, p);
        if (!ok) break;
      }
    }
  }
  ck.expect(row == d.rows, "%s: the MLA requests cover %lld of %lld rows", c.name, (long long)row, (long long)d.rows);
  // The per-row list: keys [kv_begin, min(kv_end, start_pos + 1)) through the block table.
  const AttnSeq* rs = reinterpret_cast<const AttnSeq*>(o.h.data() + d.off_hseqs);
  for (int64_t r = 0; r < d.rows; ++r) {
    const AttnSeq& a = rs[r];
    const int32_t pos = o.h[d.off_pos + size_t(r)], seq = o.h[d.off_tokens + size_t(r)] / kTokBase;
    const int32_t k1 = std::min(a.kv_end, a.start_pos + 1);
    ck.expect(a.q_row == r && a.kv_begin == 0 && k1 == pos + 1, "%s: per-row entry %lld reads keys [%d, %d), not [0, %d]",
              c.name, (long long)r, a.kv_begin, k1, pos);
    for (int32_t p = a.kv_begin; p < k1; ++p) {
      const int32_t page = o.h[d.off_blocks + size_t(a.block_off + p / c.P)];
      const int64_t at = latent_offset(o.page_elems, c.P, kLatentW, page, 1, p % c.P);
      if (!read_ok(at, at + kLatent, seq, p, 1)) {
        ck.expect(false, "%s: per-row entry %lld reads a wrong latent at position %d", c.name, (long long)r, p);
        break;
      }
    }
  }
  return ck.errors;
}

void run_mla_case(const Case& c) {
  const Batch bt = make_batch(c);
  const MlaBuilt o = build_mla(c, bt);
  CHECKF(check_mla(c, bt, o, false) == 0, "%s: MLA descriptors are wrong", c.name);
  {  // the K/V view's per-head stride instead of the latent row
    MlaBuilt m = o;
    for (FiMlaView& v : m.views) v.stride_n = kLatent;
    CHECKF(check_mla(c, bt, m, true) > 0, "%s: the MLA checker missed a wrong slot stride", c.name);
  }
  {  // kpe read from the latent's start
    MlaBuilt m = o;
    for (FiMlaView& v : m.views) v.kpe_offset = v.ckv_offset;
    CHECKF(check_mla(c, bt, m, true) > 0, "%s: the MLA checker missed a wrong kpe offset", c.name);
  }
  {  // one key too few for the first request
    MlaBuilt m = o;
    m.fi[m.list.off_kv_len] -= 1;
    CHECKF(check_mla(c, bt, m, true) > 0, "%s: the MLA checker missed a short kv_len", c.name);
  }
}

std::vector<Case> cases() {
  std::vector<Case> out;
  for (int32_t P : {16, 32, 64})
    for (int32_t D : {64, 128}) {
      // A mixed batch in a mixed batch order: a chunk first, decodes whose
      // contexts end inside, at and just after a page boundary, a chunk over
      // a prefix that ends on a page boundary, a one-token context, a
      // mid-prompt chunk that is not sampled.
      out.push_back({"mixed", P, D,
                     {{0, 40, true},
                      {P - 1, 1, true},
                      {2 * P + 3, 2 * P, true},
                      {0, 1, true},
                      {5 * P + 6, 1, false},
                      {P, P + 5, false},
                      {3 * P, 1, true},
                      {7, 2, true}}});
      out.push_back({"decode-only", P, D, {{P, 1, true}, {0, 1, true}, {3 * P - 1, 1, true}}});
      out.push_back({"chunk-only", P, D, {{0, 3 * P, true}, {P + 1, 17, true}}});
      // Decode-graph buckets 8 and 16: padded and full.
      out.push_back({"graph 5 of 8", P, D,
                     {{P - 1, 1, true}, {0, 1, true}, {2 * P, 1, true}, {9, 1, false}, {4 * P + 2, 1, true}},
                     8});
      std::vector<SeqSpec> eight, eleven, sixteen;
      for (int32_t i = 0; i < 16; ++i) {
        const SeqSpec s{(i * 13 + 5) % (4 * P), 1, i % 5 != 3};
        if (i < 8) eight.push_back(s);
        if (i < 11) eleven.push_back(s);
        sixteen.push_back(s);
      }
      out.push_back({"graph 8 of 8", P, D, eight, 8});
      out.push_back({"graph 11 of 16", P, D, eleven, 16});
      out.push_back({"graph 16 of 16", P, D, sixteen, 16});
    }
  return out;
}

}  // namespace

int main() {
  int n = 0;
  int helix = 0;
  for (const Case& c : cases()) {
    run_case(c);
    ++n;
    if (c.bucket == 0) {
      run_helix_case(c);
      run_mla_case(c);
      ++helix;
    }
  }
  check_lse();
  std::printf("test_fi_descriptors: %d steps (pages 16/32/64, head dims 64/128, graph buckets 8/16) checked; "
              "%d of them as Helix steps on 2 and 3 members and as MLA steps (latent pages)\n", n, helix);
  return check_exit_code("test_fi_descriptors");
}
