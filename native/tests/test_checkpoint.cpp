// test_checkpoint.cpp: checkpoint tensors over the C ABI (eng_tensor).
//
//  - dequantisation of every eng_dtype against hand-computed values;
//  - an engine built from tensors equal to the synthetic weights (F32 and
//    BF16-representable values as BF16) steps bit-identically to the
//    synthetic engine;
//  - interleaved (GGUF) WQ/WK rows give the same results as rotate-half rows;
//  - Q8_0, Q4_0 and Q4_1 projections, LM head and experts step with the bits
//    of their dequantised F32 values (decode steps read packed blocks);
//  - tied embeddings equal an untied model whose lm_head is the embedding;
//  - every malformed tensor set is refused, naming the tensor.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "checkpoint.h"
#include "test_engine.h"
#include "weights.h"

using namespace lockstep;

namespace {

uint16_t f2h_bits(float f);  // defined below: round-to-nearest half for test data

// The synthetic tiny model's weights as checkpoint matrices [out][in] (F32).
struct Checkpoint {
  eng_model_shape shape{};
  std::vector<std::vector<float>> store;  // keeps every matrix alive
  std::vector<eng_tensor> tensors;

  // Adds W (input-major [in][out], as weights.h stores it) as [out][in].
  void add(int32_t kind, int32_t layer, const std::vector<float>& W, int64_t in, int64_t out) {
    std::vector<float> m(static_cast<size_t>(in * out));
    for (int64_t i = 0; i < in; ++i)
      for (int64_t o = 0; o < out; ++o) m[static_cast<size_t>(o * in + i)] = W[static_cast<size_t>(i * out + o)];
    store.push_back(std::move(m));
    eng_tensor t{};
    t.kind = kind;
    t.layer = layer;
    t.dtype = ENG_DTYPE_F32;
    t.rows = out;
    t.cols = in;
    t.data = store.back().data();
    t.nbytes = in * out * 4;
    tensors.push_back(t);
  }
  // Re-points every tensor at its matrix (store may have moved).
  void fix() {
    for (size_t i = 0; i < tensors.size(); ++i) tensors[i].data = store[i].data();
  }
};

Checkpoint from_synthetic(const eng_model_shape& s, uint64_t seed) {
  const Weights w = generate_weights(s, seed);
  const int64_t H = s.hidden_size, qd = int64_t{s.num_heads} * s.head_dim,
                kvd = int64_t{s.num_kv_heads} * s.head_dim, F = s.intermediate_size, V = s.vocab_size;
  Checkpoint c;
  c.shape = s;
  c.store.reserve(64 + static_cast<size_t>(s.num_layers) * (8 + 3 * static_cast<size_t>(s.num_experts)));
  // The embedding [vocab][hidden] is already "[out][in]" with in = hidden:
  // as input-major it is [hidden][vocab], i.e. its transpose.
  std::vector<float> embT(static_cast<size_t>(V * H));
  for (int64_t v = 0; v < V; ++v)
    for (int64_t h = 0; h < H; ++h) embT[static_cast<size_t>(h * V + v)] = w.embedding[static_cast<size_t>(v * H + h)];
  c.add(ENG_WEIGHT_EMBEDDING, -1, embT, H, V);
  c.add(ENG_WEIGHT_FINAL_NORM, -1, w.final_norm, H, 1);
  c.add(ENG_WEIGHT_LM_HEAD, -1, w.lm_head, H, V);
  for (int32_t l = 0; l < s.num_layers; ++l) {
    const LayerWeights& L = w.layers[static_cast<size_t>(l)];
    c.add(ENG_WEIGHT_ATTN_NORM, l, L.attn_norm, H, 1);
    c.add(ENG_WEIGHT_WQ, l, L.wq, H, qd);
    c.add(ENG_WEIGHT_WK, l, L.wk, H, kvd);
    c.add(ENG_WEIGHT_WV, l, L.wv, H, kvd);
    c.add(ENG_WEIGHT_WO, l, L.wo, qd, H);
    c.add(ENG_WEIGHT_MLP_NORM, l, L.mlp_norm, H, 1);
    if (s.qk_norm) {
      c.add(ENG_WEIGHT_Q_NORM, l, L.q_norm, s.head_dim, 1);
      c.add(ENG_WEIGHT_K_NORM, l, L.k_norm, s.head_dim, 1);
    }
    if (s.qkv_bias) {
      c.add(ENG_WEIGHT_Q_BIAS, l, L.bq, qd, 1);
      c.add(ENG_WEIGHT_K_BIAS, l, L.bk, kvd, 1);
      c.add(ENG_WEIGHT_V_BIAS, l, L.bv, kvd, 1);
    }
    if (s.post_norms) {
      c.add(ENG_WEIGHT_ATTN_POST_NORM, l, L.attn_post_norm, H, 1);
      c.add(ENG_WEIGHT_MLP_POST_NORM, l, L.mlp_post_norm, H, 1);
    }
    if (s.num_experts == 0) {
      c.add(ENG_WEIGHT_W_GATE, l, L.w_gate, H, F);
      c.add(ENG_WEIGHT_W_UP, l, L.w_up, H, F);
      c.add(ENG_WEIGHT_W_DOWN, l, L.w_down, F, H);
      continue;
    }
    const int64_t Fm = s.moe_intermediate_size, Fs = int64_t{s.num_shared_experts} * Fm;
    c.add(ENG_WEIGHT_ROUTER, l, L.router, H, s.num_experts);
    if (Fs > 0) {
      c.add(ENG_WEIGHT_SHARED_GATE, l, L.shared.gate, H, Fs);
      c.add(ENG_WEIGHT_SHARED_UP, l, L.shared.up, H, Fs);
      c.add(ENG_WEIGHT_SHARED_DOWN, l, L.shared.down, Fs, H);
    }
    // Experts in descending id: the order of the tensors does not matter.
    for (int32_t e = s.num_experts - 1; e >= 0; --e) {
      const ExpertWeights& X = L.experts[static_cast<size_t>(e)];
      c.add(ENG_WEIGHT_EXPERT_GATE, l, X.gate, H, Fm);
      c.tensors.back().expert = e;
      c.add(ENG_WEIGHT_EXPERT_UP, l, X.up, H, Fm);
      c.tensors.back().expert = e;
      c.add(ENG_WEIGHT_EXPERT_DOWN, l, X.down, Fm, H);
      c.tensors.back().expert = e;
    }
  }
  c.fix();
  return c;
}

eng_engine_config config_for(const Checkpoint& c) {
  eng_engine_config cfg = test_config(nullptr, 32, 4);
  cfg.shape = c.shape;
  cfg.tensors = c.tensors.data();
  cfg.num_tensors = static_cast<int32_t>(c.tensors.size());
  return cfg;
}

// A prompt prefill then three decode steps; the sampled tokens and logits.
std::vector<float> run(eng_engine_t e, int32_t vocab) {
  std::vector<float> all;
  TestSeq s;
  s.tokens = test_prompt(3, 11, vocab);
  s.blocks = {0, 1, 2, 3, 4};
  s.sample = true;
  for (int step = 0; step < 4; ++step) {
    TestStepOut o = test_step(e, {s}, vocab);
    REQUIRE(o.status == ENG_OK);
    all.insert(all.end(), o.logits.begin(), o.logits.end());
    all.push_back(static_cast<float>(o.sampled[0]));
    s.start_pos += static_cast<int32_t>(s.tokens.size());
    s.tokens = {o.sampled[0]};
  }
  return all;
}

// m ([rows][cols], cols a multiple of 32) in dtype's ggml blocks (Q8_0,
// Q4_0 or Q4_1): a plain round-to-nearest quantisation, for test data.
std::vector<uint8_t> quantize_matrix(int32_t dtype, const std::vector<float>& m, int64_t rows, int64_t cols) {
  const int64_t bb = dtype == ENG_DTYPE_Q8_0 ? 34 : dtype == ENG_DTYPE_Q4_0 ? 18 : 20;
  std::vector<uint8_t> out(static_cast<size_t>(rows * cols / 32 * bb), 0);
  for (int64_t k = 0; k < rows * cols / 32; ++k) {
    const float* x = m.data() + k * 32;
    uint8_t* b = out.data() + k * bb;
    float lo = x[0], hi = x[0], amax = 0.0f;
    for (int j = 0; j < 32; ++j) {
      lo = std::min(lo, x[j]);
      hi = std::max(hi, x[j]);
      amax = std::max(amax, std::fabs(x[j]));
    }
    const float scale = dtype == ENG_DTYPE_Q8_0 ? amax / 127.0f : dtype == ENG_DTYPE_Q4_0 ? amax / 7.0f : (hi - lo) / 15.0f;
    const uint16_t dh = f2h_bits(scale), mh = f2h_bits(lo);
    const float d = lockstep::half_to_float(dh), mn = lockstep::half_to_float(mh);
    std::memcpy(b, &dh, 2);
    if (dtype == ENG_DTYPE_Q4_1) std::memcpy(b + 2, &mh, 2);
    uint8_t* q = b + (dtype == ENG_DTYPE_Q4_1 ? 4 : 2);
    for (int j = 0; j < 32; ++j) {
      if (dtype == ENG_DTYPE_Q8_0) {
        const float v = d > 0 ? std::nearbyint(x[j] / d) : 0.0f;
        q[j] = static_cast<uint8_t>(static_cast<int8_t>(std::max(-127.0f, std::min(127.0f, v))));
        continue;
      }
      const float v = d > 0 ? std::nearbyint(dtype == ENG_DTYPE_Q4_0 ? x[j] / d + 8.0f : (x[j] - mn) / d) : 8.0f;
      const uint8_t n = static_cast<uint8_t>(std::max(0.0f, std::min(15.0f, v)));
      q[j % 16] |= static_cast<uint8_t>(j < 16 ? n : n << 4);
    }
  }
  return out;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

void expect_refused(const char* what, const Checkpoint& c, const std::string& needle) {
  eng_engine_config cfg = config_for(c);
  eng_engine_t e = nullptr;
  const eng_status st = eng_engine_init(&cfg, &e);
  const std::string msg = eng_last_error();
  CHECKF(st == ENG_INVALID_ARGUMENT && e == nullptr, "%s: status %d", what, st);
  CHECKF(msg.find(needle) != std::string::npos, "%s: message %s lacks \"%s\"", what, msg.c_str(), needle.c_str());
  if (e) eng_engine_free(e);
}

uint16_t f2h_bits(float f) {
  // Test data only uses values exactly representable in half.
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const int32_t exp = static_cast<int32_t>((u >> 23) & 0xFF) - 127 + 15;
  if ((u & 0x7FFFFFFFu) == 0) return static_cast<uint16_t>(sign);
  return static_cast<uint16_t>(sign | (static_cast<uint32_t>(exp) << 10) | ((u >> 13) & 0x3FFu));
}

void test_dequantize() {
  CHECK(half_to_float(0x3C00) == 1.0f);
  CHECK(half_to_float(0xC000) == -2.0f);
  CHECK(half_to_float(0x0001) == std::ldexp(1.0f, -24));  // smallest subnormal
  CHECK(half_to_float(0x7BFF) == 65504.0f);
  CHECK(std::isinf(half_to_float(0x7C00)));
  CHECK(bf16_to_float(0x3F80) == 1.0f);
  CHECK(std::strcmp(dtype_name(ENG_DTYPE_Q4_1), "Q4_1") == 0);

  // Q8_0: d = 0.5, q = j - 16.
  uint8_t q8[34];
  const uint16_t half05 = f2h_bits(0.5f);
  std::memcpy(q8, &half05, 2);
  for (int j = 0; j < 32; ++j) q8[2 + j] = static_cast<uint8_t>(static_cast<int8_t>(j - 16));
  float out[32];
  dequantize_row(ENG_DTYPE_Q8_0, q8, 32, out);
  for (int j = 0; j < 32; ++j) CHECKF(out[j] == 0.5f * (j - 16), "q8_0[%d] = %g", j, out[j]);

  // Q4_0: d = 2, element j is the low nibble of byte j (j < 16), else the high nibble of byte j-16.
  uint8_t q40[18];
  const uint16_t half2 = f2h_bits(2.0f);
  std::memcpy(q40, &half2, 2);
  for (int j = 0; j < 16; ++j) q40[2 + j] = static_cast<uint8_t>((j & 0xF) | ((15 - j) << 4));
  dequantize_row(ENG_DTYPE_Q4_0, q40, 32, out);
  for (int j = 0; j < 16; ++j) {
    CHECKF(out[j] == 2.0f * (j - 8), "q4_0[%d] = %g", j, out[j]);
    CHECKF(out[16 + j] == 2.0f * ((15 - j) - 8), "q4_0[%d] = %g", 16 + j, out[16 + j]);
  }

  // Q4_1: d = 0.25, m = -1.
  uint8_t q41[20];
  const uint16_t hd = f2h_bits(0.25f), hm = f2h_bits(-1.0f);
  std::memcpy(q41, &hd, 2);
  std::memcpy(q41 + 2, &hm, 2);
  for (int j = 0; j < 16; ++j) q41[4 + j] = static_cast<uint8_t>(j | ((j ^ 5) << 4));
  dequantize_row(ENG_DTYPE_Q4_1, q41, 32, out);
  for (int j = 0; j < 16; ++j) {
    CHECKF(out[j] == 0.25f * j - 1.0f, "q4_1[%d] = %g", j, out[j]);
    CHECKF(out[16 + j] == 0.25f * (j ^ 5) - 1.0f, "q4_1[%d] = %g", 16 + j, out[16 + j]);
  }
  // F16 and BF16 rows.
  const uint16_t h16[3] = {0x3C00, 0xC000, 0x3800};
  dequantize_row(ENG_DTYPE_F16, h16, 3, out);
  CHECK(out[0] == 1.0f && out[1] == -2.0f && out[2] == 0.5f);
  const uint16_t b16[2] = {0x3F80, 0xC040};
  dequantize_row(ENG_DTYPE_BF16, b16, 2, out);
  CHECK(out[0] == 1.0f && out[1] == -3.0f);
  CHECK(dtype_row_bytes(ENG_DTYPE_Q4_1, 64) == 40);
  CHECK(dtype_row_bytes(ENG_DTYPE_Q4_1, 48) == -1);
}

}  // namespace

int main() {
  test_dequantize();

  eng_model_shape tiny;
  REQUIRE(eng_preset_shape("tiny", &tiny) == ENG_OK);
  const int32_t V = tiny.vocab_size;

  // Synthetic engine vs the same weights as F32 checkpoint tensors.
  eng_engine_config syn = test_config("tiny", 32, 4);
  eng_engine_t e_syn = test_engine(syn);
  const std::vector<float> want = run(e_syn, V);
  eng_engine_free(e_syn);

  Checkpoint c = from_synthetic(tiny, 7);
  {
    eng_engine_t e = test_engine(config_for(c));
    CHECKF(same_bits(run(e, V), want), "F32 checkpoint differs from the synthetic weights");
    eng_engine_free(e);
  }

  // Interleaved WQ/WK (GGUF order) restore to the same results.
  {
    Checkpoint g = from_synthetic(tiny, 7);
    const int64_t D = tiny.head_dim, half = D / 2, H = tiny.hidden_size;
    for (size_t i = 0; i < g.tensors.size(); ++i) {
      eng_tensor& t = g.tensors[i];
      if (t.kind != ENG_WEIGHT_WQ && t.kind != ENG_WEIGHT_WK) continue;
      std::vector<float>& m = g.store[i];
      std::vector<float> p(m.size());
      for (int64_t r = 0; r < t.rows; ++r) {  // GGUF row 2i+s <- HF row s*half+i
        const int64_t head = r / D, j = r % D;
        const int64_t src = head * D + (j % 2) * half + j / 2;
        std::memcpy(&p[static_cast<size_t>(r * H)], &m[static_cast<size_t>(src * H)], sizeof(float) * H);
      }
      m = p;
      t.interleaved_rope_heads = t.kind == ENG_WEIGHT_WQ ? tiny.num_heads : tiny.num_kv_heads;
    }
    g.fix();
    eng_engine_t e = test_engine(config_for(g));
    CHECKF(same_bits(run(e, V), want), "interleaved WQ/WK differ from rotate-half");
    eng_engine_free(e);
  }

  // BF16: weights rounded to bf16 run identically as F32 or as BF16 tensors.
  {
    Checkpoint f = from_synthetic(tiny, 7), b = from_synthetic(tiny, 7);
    std::vector<std::vector<uint16_t>> bits(b.tensors.size());
    for (size_t i = 0; i < f.tensors.size(); ++i) {
      for (float& x : f.store[i]) {
        uint32_t u;
        std::memcpy(&u, &x, 4);
        u &= 0xFFFF0000u;  // truncate: exactly representable in bf16
        std::memcpy(&x, &u, 4);
        bits[i].push_back(static_cast<uint16_t>(u >> 16));
      }
      b.tensors[i].dtype = ENG_DTYPE_BF16;
      b.tensors[i].data = bits[i].data();
      b.tensors[i].nbytes = b.tensors[i].rows * b.tensors[i].cols * 2;
    }
    eng_engine_t ef = test_engine(config_for(f));
    eng_engine_t eb = test_engine(config_for(b));
    CHECKF(same_bits(run(ef, V), run(eb, V)), "BF16 tensors differ from their F32 values");
    eng_engine_free(ef);
    eng_engine_free(eb);
  }

  // Quantised checkpoints (Q8_0, Q4_0, Q4_1 projections, LM head and
  // experts) step with the bits of their dequantised F32 values: the decode
  // steps read the packed blocks (packed_cpu.h), the F32 model its floats.
  for (const char* preset : {"tiny", "moe-tiny"}) {
    eng_model_shape s;
    REQUIRE(eng_preset_shape(preset, &s) == ENG_OK);
    for (int32_t dtype : {ENG_DTYPE_Q8_0, ENG_DTYPE_Q4_0, ENG_DTYPE_Q4_1}) {
      Checkpoint f = from_synthetic(s, 7), q = from_synthetic(s, 7);
      std::vector<std::vector<uint8_t>> bytes(q.tensors.size());
      int quantised = 0;
      for (size_t i = 0; i < q.tensors.size(); ++i) {
        eng_tensor& t = q.tensors[i];
        const bool projection = t.kind == ENG_WEIGHT_WQ || t.kind == ENG_WEIGHT_WK || t.kind == ENG_WEIGHT_WV ||
                                t.kind == ENG_WEIGHT_WO || t.kind == ENG_WEIGHT_W_GATE || t.kind == ENG_WEIGHT_W_UP ||
                                t.kind == ENG_WEIGHT_W_DOWN || t.kind == ENG_WEIGHT_LM_HEAD ||
                                (t.kind >= ENG_WEIGHT_EXPERT_GATE && t.kind <= ENG_WEIGHT_SHARED_DOWN);
        if (!projection || t.cols % 32 != 0) continue;
        bytes[i] = quantize_matrix(dtype, q.store[i], t.rows, t.cols);
        t.dtype = dtype;
        t.data = bytes[i].data();
        t.nbytes = static_cast<int64_t>(bytes[i].size());
        // Its F32 twin holds the dequantised values.
        const int64_t rb = t.cols / 32 * (dtype == ENG_DTYPE_Q8_0 ? 34 : dtype == ENG_DTYPE_Q4_0 ? 18 : 20);
        for (int64_t r = 0; r < t.rows; ++r)
          lockstep::dequantize_row(dtype, bytes[i].data() + r * rb, t.cols, f.store[i].data() + r * t.cols);
        ++quantised;
      }
      CHECK(quantised >= 7);
      eng_engine_t ef = test_engine(config_for(f));
      eng_engine_t eq = test_engine(config_for(q));
      CHECKF(same_bits(run(ef, s.vocab_size), run(eq, s.vocab_size)), "%s as %s differs from its F32 values", preset,
             lockstep::dtype_name(dtype));
      eng_engine_free(ef);
      eng_engine_free(eq);
    }
  }

  // Tied embeddings == an untied model whose lm_head is the embedding.
  {
    Checkpoint u = from_synthetic(tiny, 7);
    u.store[2] = u.store[0];  // lm_head [vocab][hidden] := embedding
    u.fix();
    Checkpoint t = from_synthetic(tiny, 7);
    t.shape.tied_embeddings = 1;
    t.tensors.erase(t.tensors.begin() + 2);
    t.store.erase(t.store.begin() + 2);
    t.fix();
    eng_engine_t eu = test_engine(config_for(u));
    eng_engine_t et = test_engine(config_for(t));
    CHECKF(same_bits(run(eu, V), run(et, V)), "tied embeddings differ from an untied copy");
    eng_engine_free(eu);
    eng_engine_free(et);

    // With tied embeddings an lm_head is refused.
    Checkpoint bad = from_synthetic(tiny, 7);
    bad.shape.tied_embeddings = 1;
    expect_refused("lm_head with tied", bad, "tied_embeddings");
  }

  // MoE checkpoints (router, shared and routed experts with their index)
  // and q/k norms: the same bits as the synthetic moe-tiny, with and
  // without qk_norm; q/k norm gains of ones change nothing, others do;
  // a missing or misplaced expert tensor is refused by name.
  {
    eng_model_shape moe;
    REQUIRE(eng_preset_shape("moe-tiny", &moe) == ENG_OK);
    for (int32_t qk = 0; qk < 2; ++qk) {
      eng_model_shape s = moe;
      s.qk_norm = qk;
      eng_engine_config syn_cfg = test_config(nullptr, 32, 4);
      syn_cfg.shape = s;
      syn_cfg.seed = 7;
      eng_engine_t es = test_engine(syn_cfg);
      const std::vector<float> want_moe = run(es, s.vocab_size);
      eng_engine_free(es);
      Checkpoint c = from_synthetic(s, 7);
      eng_engine_t ec = test_engine(config_for(c));
      CHECKF(same_bits(run(ec, s.vocab_size), want_moe), "MoE checkpoint (qk_norm %d) differs from synthetic", qk);
      eng_engine_free(ec);
      if (qk == 1) {
        Checkpoint ones = from_synthetic(s, 7), plain = from_synthetic(moe, 7);
        for (size_t i = 0; i < ones.tensors.size(); ++i)
          if (ones.tensors[i].kind == ENG_WEIGHT_Q_NORM || ones.tensors[i].kind == ENG_WEIGHT_K_NORM)
            for (float& x : ones.store[i]) x = 1.0f;
        eng_engine_t e1 = test_engine(config_for(ones));
        eng_engine_t e0 = test_engine(config_for(plain));
        CHECKF(!same_bits(run(e1, s.vocab_size), run(e0, s.vocab_size)), "unit q/k norms change nothing, want a normed head");
        CHECKF(!same_bits(run(e1, s.vocab_size), want_moe), "q/k norm gains are ignored");
        eng_engine_free(e1);
        eng_engine_free(e0);
      }
    }
    Checkpoint c = from_synthetic(moe, 7);
    for (size_t i = 0; i < c.tensors.size(); ++i)
      if (c.tensors[i].kind == ENG_WEIGHT_EXPERT_UP && c.tensors[i].layer == 1 && c.tensors[i].expert == 3) {
        c.tensors.erase(c.tensors.begin() + static_cast<long>(i));
        c.store.erase(c.store.begin() + static_cast<long>(i));
        break;
      }
    c.fix();
    expect_refused("missing expert", c, "missing tensor: layer 1 expert 3 expert_up");
    Checkpoint d = from_synthetic(moe, 7);
    for (eng_tensor& t : d.tensors)
      if (t.kind == ENG_WEIGHT_EXPERT_GATE && t.expert == 0) t.expert = moe.num_experts;
    expect_refused("expert out of range", d, "expert 16 out of range");
    Checkpoint e = from_synthetic(moe, 7);
    e.shape.num_shared_experts = 0;
    expect_refused("shared expert in a shape without", e, "num_shared_experts 0");
    Checkpoint dense = from_synthetic(tiny, 7);
    dense.tensors[3].kind = ENG_WEIGHT_Q_NORM;
    expect_refused("q norm without qk_norm", dense, "qk_norm 0");
  }

  // q/k/v projection biases (Qwen2): the same bits as the synthetic shape
  // with qkv_bias, with and without q/k norms and on MoE layers; zero
  // biases give the unbiased model bit for bit, the generated ones do not;
  // a missing bias, a bias without qkv_bias, a misshapen one, interleaved
  // Q/K rows with biases and qkv_bias on an MLA shape are refused by name.
  {
    eng_model_shape moe;
    REQUIRE(eng_preset_shape("moe-tiny", &moe) == ENG_OK);
    for (const eng_model_shape& base : {tiny, moe}) {
      for (int32_t qk = 0; qk < 2; ++qk) {
        eng_model_shape s = base;
        s.qkv_bias = 1;
        s.qk_norm = qk;
        eng_engine_config syn_cfg = test_config(nullptr, 32, 4);
        syn_cfg.shape = s;
        syn_cfg.seed = 7;
        eng_engine_t es = test_engine(syn_cfg);
        const std::vector<float> want = run(es, s.vocab_size);
        eng_engine_free(es);
        Checkpoint c = from_synthetic(s, 7);
        eng_engine_t ec = test_engine(config_for(c));
        CHECKF(same_bits(run(ec, s.vocab_size), want), "qkv_bias checkpoint (qk_norm %d, %d experts) differs from synthetic",
               qk, base.num_experts);
        eng_engine_free(ec);
        eng_model_shape u = base;
        u.qk_norm = qk;
        Checkpoint zero = from_synthetic(s, 7), plain = from_synthetic(u, 7);
        for (size_t i = 0; i < zero.tensors.size(); ++i)
          if (zero.tensors[i].kind >= ENG_WEIGHT_Q_BIAS)
            for (float& x : zero.store[i]) x = 0.0f;
        eng_engine_t ez = test_engine(config_for(zero));
        eng_engine_t ep = test_engine(config_for(plain));
        const std::vector<float> got_zero = run(ez, s.vocab_size);
        CHECKF(same_bits(got_zero, run(ep, s.vocab_size)), "zero biases differ from no biases (qk_norm %d)", qk);
        CHECKF(!same_bits(got_zero, want), "the generated biases change nothing (qk_norm %d)", qk);
        eng_engine_free(ez);
        eng_engine_free(ep);
      }
    }
    eng_model_shape b = tiny;
    b.qkv_bias = 1;
    Checkpoint missing = from_synthetic(b, 7);
    for (size_t i = 0; i < missing.tensors.size(); ++i)
      if (missing.tensors[i].kind == ENG_WEIGHT_V_BIAS && missing.tensors[i].layer == 1) {
        missing.tensors.erase(missing.tensors.begin() + static_cast<long>(i));
        missing.store.erase(missing.store.begin() + static_cast<long>(i));
        break;
      }
    missing.fix();
    expect_refused("missing v bias", missing, "missing tensor: layer 1 v_bias");
    Checkpoint stray = from_synthetic(b, 7);
    stray.shape.qkv_bias = 0;
    expect_refused("bias without qkv_bias", stray, "qkv_bias 0");
    Checkpoint wide = from_synthetic(b, 7);
    for (eng_tensor& t : wide.tensors)
      if (t.kind == ENG_WEIGHT_K_BIAS && t.layer == 0) t.cols = int64_t{b.num_heads} * b.head_dim, t.nbytes = t.cols * 4;
    expect_refused("k bias of q's width", wide, "layer 0 k_bias");
    Checkpoint inter = from_synthetic(b, 7);
    for (eng_tensor& t : inter.tensors)
      if (t.kind == ENG_WEIGHT_WQ) t.interleaved_rope_heads = b.num_heads;
    expect_refused("interleaved with biases", inter, "interleaved_rope_heads with qkv_bias");
    eng_model_shape mla;
    REQUIRE(eng_preset_shape("deepseek-tiny", &mla) == ENG_OK);
    mla.qkv_bias = 1;
    eng_engine_config mc = test_config(nullptr, 32, 4);
    mc.shape = mla;
    eng_engine_t none = nullptr;
    CHECK(eng_engine_init(&mc, &none) == ENG_INVALID_ARGUMENT);
    CHECK(std::string(eng_last_error()).find("MLA with qkv_bias") != std::string::npos);
  }

  // Granite's multipliers: the checkpoint path gives the synthetic
  // shape's bits with them; multipliers of one (and the default attention
  // scale written out) change nothing, bit for bit; each other value
  // changes the logits; negative or infinite ones, and any with MLA, are
  // refused by name.
  {
    eng_model_shape g = tiny;
    g.embedding_scale = 12.0f;
    g.residual_scale = 0.22f;
    g.attention_scale = 0.125f;
    g.logit_scale = 16.0f;
    eng_engine_config syn_cfg = test_config(nullptr, 32, 4);
    syn_cfg.shape = g;
    syn_cfg.seed = 7;
    eng_engine_t es = test_engine(syn_cfg);
    const std::vector<float> want = run(es, g.vocab_size);
    eng_engine_free(es);
    eng_engine_t ec = test_engine(config_for(from_synthetic(g, 7)));
    CHECKF(same_bits(run(ec, g.vocab_size), want), "Granite checkpoint differs from synthetic");
    eng_engine_free(ec);
    auto run_shape = [&](const eng_model_shape& sh) {
      eng_engine_t e = test_engine(config_for(from_synthetic(sh, 7)));
      std::vector<float> out = run(e, sh.vocab_size);
      eng_engine_free(e);
      return out;
    };
    const std::vector<float> none = run_shape(tiny);
    eng_model_shape ones = tiny;
    ones.embedding_scale = ones.residual_scale = ones.logit_scale = 1.0f;
    ones.attention_scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(tiny.head_dim)));
    CHECKF(same_bits(run_shape(ones), none), "multipliers of one change the logits");
    for (int which = 0; which < 4; ++which) {
      eng_model_shape one = tiny;
      float* f[] = {&one.embedding_scale, &one.residual_scale, &one.attention_scale, &one.logit_scale};
      *f[which] = 0.5f;
      CHECKF(!same_bits(run_shape(one), none), "Granite multiplier %d changes nothing", which);
    }
    for (const auto& [field, v, needle] : {std::tuple<int, float, const char*>{0, -1.0f, "embedding_scale"},
                                           {3, INFINITY, "logit_scale"}}) {
      eng_model_shape bad = tiny;
      float* f[] = {&bad.embedding_scale, &bad.residual_scale, &bad.attention_scale, &bad.logit_scale};
      *f[field] = v;
      eng_engine_config bc = test_config(nullptr, 32, 4);
      bc.shape = bad;
      eng_engine_t none_e = nullptr;
      CHECK(eng_engine_init(&bc, &none_e) == ENG_INVALID_ARGUMENT);
      CHECKF(std::string(eng_last_error()).find(needle) != std::string::npos, "refusal names %s: %s", needle, eng_last_error());
    }
    eng_model_shape mla;
    REQUIRE(eng_preset_shape("deepseek-tiny", &mla) == ENG_OK);
    mla.residual_scale = 0.5f;
    eng_engine_config mc = test_config(nullptr, 32, 4);
    mc.shape = mla;
    eng_engine_t none_m = nullptr;
    CHECK(eng_engine_init(&mc, &none_m) == ENG_INVALID_ARGUMENT);
    CHECK(std::string(eng_last_error()).find("MLA with Granite") != std::string::npos);
  }

  // Gemma's fields (gemma-tiny: post norms among them): the checkpoint
  // path gives the synthetic shape's bits; a missing post norm, and one
  // given to a shape without post_norms, are refused by name.
  {
    eng_model_shape g;
    REQUIRE(eng_preset_shape("gemma-tiny", &g) == ENG_OK);
    eng_engine_config syn_cfg = test_config("gemma-tiny", 32, 4);
    eng_engine_t es = test_engine(syn_cfg);
    const std::vector<float> want = run(es, g.vocab_size);
    eng_engine_free(es);
    eng_engine_t ec = test_engine(config_for(from_synthetic(g, 7)));
    CHECKF(same_bits(run(ec, g.vocab_size), want), "Gemma checkpoint differs from synthetic");
    eng_engine_free(ec);
    Checkpoint missing = from_synthetic(g, 7);
    for (size_t i = 0; i < missing.tensors.size(); ++i)
      if (missing.tensors[i].kind == ENG_WEIGHT_MLP_POST_NORM && missing.tensors[i].layer == 2) {
        missing.tensors.erase(missing.tensors.begin() + static_cast<std::ptrdiff_t>(i));
        missing.store.erase(missing.store.begin() + static_cast<std::ptrdiff_t>(i));
        break;
      }
    missing.fix();
    expect_refused("missing MLP post norm", missing, "missing tensor: layer 2 mlp_post_norm");
    Checkpoint stray = from_synthetic(g, 7);
    stray.shape.post_norms = 0;
    expect_refused("post norm without post_norms", stray, "post_norms 0");
  }

  // Engines built from the same tensors share one float copy; different
  // contents do not.
  {
    Checkpoint a = from_synthetic(tiny, 7), b = from_synthetic(tiny, 7), c = from_synthetic(tiny, 8);
    auto wa = shared_weights(a.shape, a.tensors.data(), static_cast<int32_t>(a.tensors.size()));
    auto wb = shared_weights(b.shape, b.tensors.data(), static_cast<int32_t>(b.tensors.size()));
    auto wc = shared_weights(c.shape, c.tensors.data(), static_cast<int32_t>(c.tensors.size()));
    CHECK(wa.get() == wb.get());
    CHECK(wa.get() != wc.get());
  }

  // rope_freqs: all ones change nothing (bit for bit); twos change the
  // logits; rope_freqs with rope_scaling_factor, or a zero divisor, is refused.
  {
    const int64_t half = tiny.head_dim / 2;
    std::vector<float> ones(static_cast<size_t>(half), 1.0f), twos(static_cast<size_t>(half), 2.0f),
        zero(static_cast<size_t>(half), 1.0f);
    zero[1] = 0.0f;
    auto with = [&](const std::vector<float>& f) {
      Checkpoint c = from_synthetic(tiny, 7);
      c.store.push_back(f);
      eng_tensor t{};
      t.kind = ENG_WEIGHT_ROPE_FREQS;
      t.layer = -1;
      t.dtype = ENG_DTYPE_F32;
      t.rows = 1;
      t.cols = half;
      t.nbytes = half * 4;
      c.tensors.push_back(t);
      c.fix();
      return c;
    };
    Checkpoint c1 = with(ones);
    eng_engine_t e1 = test_engine(config_for(c1));
    CHECKF(same_bits(run(e1, V), want), "rope_freqs of ones changed the results");
    eng_engine_free(e1);
    Checkpoint c2 = with(twos);
    eng_engine_t e2 = test_engine(config_for(c2));
    CHECKF(!same_bits(run(e2, V), want), "rope_freqs of twos left the results unchanged");
    eng_engine_free(e2);
    Checkpoint c3 = with(ones);
    c3.shape.rope_scaling_factor = 8;
    c3.shape.rope_low_freq_factor = 1;
    c3.shape.rope_high_freq_factor = 4;
    c3.shape.rope_original_max_positions = 64;
    expect_refused("rope_freqs with scaling", c3, "give one");
    Checkpoint c4 = with(zero);
    eng_engine_config cfg4 = config_for(c4);
    eng_engine_t e4 = nullptr;
    CHECK(eng_engine_init(&cfg4, &e4) == ENG_INVALID_ARGUMENT);
    CHECK(std::string(eng_last_error()).find("rope_freqs[1]") != std::string::npos);
  }

  // Refusals name the tensor.
  {
    Checkpoint m = from_synthetic(tiny, 7);
    m.tensors.pop_back();  // layer 1 w_down
    m.store.pop_back();
    expect_refused("missing", m, "missing tensor: layer 1 w_down");
  }
  {
    Checkpoint m = from_synthetic(tiny, 7);
    m.tensors[4].rows += 1;
    expect_refused("dims", m, "layer 0 wq");
  }
  {
    Checkpoint m = from_synthetic(tiny, 7);
    m.tensors[5].nbytes -= 4;
    expect_refused("nbytes", m, "nbytes");
  }
  {
    Checkpoint m = from_synthetic(tiny, 7);
    m.tensors[6] = m.tensors[5];
    expect_refused("duplicate", m, "duplicate of tensors[5]");
  }
  {
    Checkpoint m = from_synthetic(tiny, 7);
    m.tensors[4].dtype = ENG_DTYPE_Q4_1;  // cols 64 fine, nbytes wrong
    expect_refused("dtype size", m, "Q4_1");
    m = from_synthetic(tiny, 7);
    m.tensors[4].dtype = 42;
    expect_refused("dtype", m, "not an eng_dtype");
    m = from_synthetic(tiny, 7);
    m.tensors[4].layer = 9;
    expect_refused("layer", m, "layer 9");
    m = from_synthetic(tiny, 7);
    m.tensors[4].data = nullptr;
    expect_refused("null", m, "data is NULL");
    m = from_synthetic(tiny, 7);
    m.tensors[6].interleaved_rope_heads = 2;  // wv
    expect_refused("interleave on wv", m, "interleaved_rope_heads");
  }

  // Llama-3 RoPE scaling: short wavelengths kept, long ones divided by the factor.
  {
    eng_model_shape s = tiny;
    s.head_dim = 128;
    s.rope_theta = 500000.0f;
    const std::vector<double> plain = rope_inv_freq(s);
    s.rope_scaling_factor = 8;
    s.rope_low_freq_factor = 1;
    s.rope_high_freq_factor = 4;
    s.rope_original_max_positions = 8192;
    const std::vector<double> scaled = rope_inv_freq(s);
    CHECK(scaled[0] == plain[0]);
    CHECK(std::fabs(scaled[63] - plain[63] / 8) < 1e-18);
    int mid = 0;
    for (size_t i = 0; i < plain.size(); ++i)
      if (scaled[i] != plain[i] && std::fabs(scaled[i] - plain[i] / 8) > 1e-18 * plain[i]) ++mid;
    CHECK(mid > 0);  // the smooth band exists
  }
  return check_exit_code("test_checkpoint");
}
