#!/usr/bin/env python3
"""make_moe_reference.py: llama.cpp reference outputs of small random-weight MoE checkpoints.

No mixture-of-experts checkpoint small enough for the test machines can be
downloaded, so this script writes one per architecture with the `gguf` package
(random float32 weights from a fixed numpy seed, tiny dimensions, a byte-level
GPT-2 tokenizer) and runs llama.cpp (llama-cpp-python, an implementation this
project did not write) on it: greedy continuations of a fixed set of prompts,
with the top-5 logits and the top-1/top-2 gap at every step.

Architectures (each file is a few hundred KB; the gemma ones are dense):
  qwen3moe  general.architecture qwen3moe: per-head q/k RMSNorm, head_dim
            larger than hidden / heads, 16 experts, top-8 (softmax over every
            expert, top-k, renormalised), llama.cpp's NeoX (rotate-half) RoPE
  qwen3     general.architecture qwen3: the dense Qwen3 decoder (q/k norms, no
            experts), the same attention as qwen3moe without the router
  qwen2     general.architecture qwen2: the dense Qwen2 / Qwen2.5 decoder: biases
            on the q, k and v projections, NeoX RoPE, tied embeddings
  phi3      general.architecture phi3: the Phi-3 / Phi-4 decoder: q, k and v in
            one attn_qkv, gate and up in one ffn_up of twice the width, NeoX RoPE
  phi3-longrope  general.architecture phi3 as Phi-3.5-mini / Phi-4-mini: hidden 64, head_dim 16,
            partial rotary (rope.dimension_count 12), LongRoPE (rope_factors_long / _short, 6
            values each; original context 64 of 512, attn_factor sqrt(1 + ln 8 / ln 64)), tied
            embeddings; llama.cpp's n_ctx 512 > 64 selects the long factors
  granite   general.architecture granite: IBM Granite 3's Llama with four
            multipliers (embedding 12, residual 0.22, attention 1/8 instead of
            1/sqrt(head_dim), logits / 16), adjacent-pair RoPE, tied embeddings
  mixtral   general.architecture llama with expert_count: 8 experts, top-2,
            adjacent-pair RoPE (GGUF's interleaved Q/K rows), tied embeddings
  deepseek2       general.architecture deepseek2 (DeepSeek-V3-like): MLA with
                  q LoRA, attn_k_b / attn_v_b split as convert_hf_to_gguf.py
                  writes it today (llama.cpp's absorbed-MLA path), 1 leading
                  dense layer, 16 experts top-4 in 4 groups (2 used), 1 shared
                  expert, sigmoid gating + exp_probs_b bias, norm, scale 2.5
  deepseek2-lite  general.architecture deepseek2 (DeepSeek-V2-Lite-like): no q
                  LoRA, the combined attn_kv_b of older files (llama.cpp's
                  non-MLA path), v_head_dim != qk_nope_head_dim, 8 experts
                  top-2, 2 shared experts, softmax gating, no norm
  deepseek2-yarn  deepseek2's weights with DeepSeek-V3's YaRN rope scaling
                  (factor 4, original context 32, mscale_all_dim 1)
  gemma     general.architecture gemma: GeGLU (tanh GELU), embedding x sqrt(hidden),
            1 KV head, heads x head_dim = 64 != hidden 32, tied embeddings
  gemma2    general.architecture gemma2: gemma + post-attention / post-FFN norms,
            layer 0 sliding (window 8), layer 1 global, attention and final
            logit soft-capping (3 and 8, small enough to bite)
  gemma3    general.architecture gemma3: 6 layers, 0-4 sliding (window 8, rope
            base 10000), 5 global (rope base 1e6, linear scaling factor 8),
            per-head q/k norms, post norms, no soft-capping
  glm4moe   general.architecture glm4moe (GLM-4.5-Air-like): 2 trunk layers + 1 MTP (nextn) layer
            (block_count 3, nextn_predict_layers 1; llama.cpp skips the MTP layer), 4 heads / 2 KV
            heads of 16 (heads x head_dim = 64 != hidden 32), q/k/v biases, no q/k norms, NeoX
            RoPE on 8 of 16 channels (partial_rotary_factor 0.5), layer 0 dense, layer 1: 8 experts
            top-2, 1 shared expert, sigmoid gating + exp_probs_b, norm, scale 2.5; untied output

For the deepseek2 files the script also runs an independent float64 numpy
forward written from Hugging Face's DeepSeek-V2/V3 modeling code (kv_b_proj
unsplit, interleaved-pair RoPE, YaRN inv_freq and mscale^2 softmax scale,
group-limited routing with masked_fill(0)) over every prompt + greedy tokens,
and prints its largest |logit - llama.cpp| over the recorded top-5 and how
often the bias / the groups changed the routed experts (stderr only).
For the gemma files it runs a float64 numpy forward written from Hugging Face's
Gemma / Gemma2 / Gemma3 code (exact tanh GELU, where llama.cpp's CPU GELU reads
an fp16 table and is off by ~1e-3) on llama.cpp's token path, stores its top-5
per step as "f64_top", and prints its largest |logit - llama.cpp|, how often the
soft caps bite and what the window / caps / rope scaling change (stderr).
For glm4moe it runs a float64 numpy forward written from Hugging Face's GLM-4.5 code (modeling_glm4_moe.py)
and prints its largest |logit - llama.cpp|, llama.cpp's n_layer / n_layer_nextn, then reruns llama.cpp on
temporary copies (q/k/v biases zeroed, full rotation, exp_probs_b zeroed, the MTP layer's tensors perturbed)
and prints how far each moves the stored top-5 logits over every prompt (stderr).
For phi3-longrope it runs a float64 numpy forward written from Hugging Face's Phi-3 LongRoPE code and
prints its largest |logit - llama.cpp|, then reruns llama.cpp on temporary copies (short factors, no
factors, attn_factor 1, full rotation) and prints how far each moves the long prompt's top-5 (stderr).

Writes, under --out-dir (default tests/testdata/moe relative to the repo):
  <arch>.gguf            the checkpoint
  <arch>.reference.json  per prompt: text, llama.cpp's prompt ids, STEPS greedy
                         tokens, and at every step the top-5 (token, logit)
                         and the top-1 minus top-2 gap (gemma*: also f64_top,
                         the float64 forward's top-5 at every step)

Step convention: step 0 = logits after the prompt's last token; step k = after
feeding greedy token k-1. llama.cpp runs on 2 threads with an F32 KV cache and
flash attention off, so every operation is float32 (F32 weights: no activation
quantisation).

Usage: see scripts/reference/README.md ("MoE checkpoints", "DeepSeek (MLA) checkpoints", "Gemma checkpoints",
"Phi-3 LongRoPE checkpoint", "GLM-4.5 checkpoint");
--arch NAME (repeatable) or --archs a,b,c writes only those files.
"""

import argparse
import importlib.metadata
import json
import math
import os
import sys

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numpy as np

STEPS = 16
TOP_K = 5

PROMPTS = [
    ("hello", "Hello"),
    ("capital", "The capital of France is"),
    ("numbers", "1, 2, 3, 4, 5, 6,"),
    ("code", "def f(x):\n    return x * 2\n"),
    ("the_the", "the the the the"),
    ("mixed", "Zwölf Boxkämpfer jagen Viktor quer über den großen Sylter Deich."),
    ("long", "A hash table stores key-value pairs in an array of buckets. To insert a pair, the table "
             "computes a hash of the key, reduces it modulo the number of buckets, and places the pair "
             "in the resulting bucket."),
    ("single", "x"),
]

ARCHS = {
    "qwen3moe": dict(arch="qwen3moe", layers=2, hidden=32, heads=4, kv_heads=2, head_dim=16,
                     experts=16, used=8, expert_ff=8, ff=48, theta=1000000.0, eps=1e-6,
                     tied=False, seed=29001),
    "qwen3": dict(arch="qwen3", layers=2, hidden=32, heads=4, kv_heads=2, head_dim=16,
                  experts=0, used=0, expert_ff=0, ff=64, theta=1000000.0, eps=1e-6,
                  tied=False, seed=29003),
    "qwen2": dict(arch="qwen2", layers=2, hidden=32, heads=4, kv_heads=2, head_dim=8,
                  experts=0, used=0, expert_ff=0, ff=64, theta=1000000.0, eps=1e-6,
                  tied=True, seed=29004),
    "phi3": dict(arch="phi3", layers=2, hidden=32, heads=4, kv_heads=2, head_dim=8,
                 experts=0, used=0, expert_ff=0, ff=48, theta=10000.0, eps=1e-5,
                 tied=False, seed=29005),
    # Phi-3.5-mini / Phi-4-mini: partial rotary (rope.dimension_count 12 of head_dim 16, the other 4
    # dims pass through) and LongRoPE (per-frequency divisors rope_factors_long / _short, 6 = 12 / 2
    # values each, and rope.scaling.attn_factor on cos and sin), tied embeddings as Phi-4-mini.
    # context_length / original_context_length = 512 / 64: llama.cpp's n_ctx 512 > 64 picks the long factors.
    # Embedding rows of std 0.25: the layers' outputs then outweigh the tied self-token logit, so the
    # top-5 logits spread over ~3.6..9.7 and the rotation moves them (by up to 3.6 with the short factors).
    "phi3-longrope": dict(arch="phi3", layers=2, hidden=64, heads=4, kv_heads=2, head_dim=16,
                          experts=0, used=0, expert_ff=0, ff=64, theta=10000.0, eps=1e-5,
                          tied=True, seed=29010, embd_std=0.25, rope_dims=12, context_length=512,
                          longrope=dict(original_context_length=64, long_range=[1.0, 8.0],
                                        short_range=[1.0, 1.5])),
    "granite": dict(arch="granite", layers=2, hidden=32, heads=4, kv_heads=2, head_dim=8,
                    experts=0, used=0, expert_ff=0, ff=64, theta=10000.0, eps=1e-5,
                    tied=True, seed=29006, granite=(12.0, 0.22, 0.125, 16.0)),
    "mixtral": dict(arch="llama", layers=2, hidden=32, heads=4, kv_heads=2, head_dim=8,
                    experts=8, used=2, expert_ff=32, ff=32, theta=1000000.0, eps=1e-5,
                    tied=True, seed=29002),
}

# DeepSeek (general.architecture deepseek2). Field names follow Hugging Face's config.json.
DEEPSEEK = {
    "deepseek2": dict(arch="deepseek2", layers=3, hidden=32, heads=4, q_lora_rank=16, kv_lora_rank=16,
                      qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=8, first_k_dense_replace=1,
                      intermediate_size=64, n_routed_experts=16, num_experts_per_tok=4,
                      moe_intermediate_size=8, n_shared_experts=1, n_group=4, topk_group=2,
                      scoring_func="sigmoid", e_score_correction_bias=True, norm_topk_prob=True,
                      routed_scaling_factor=2.5, mla_split=True, rope_scaling=None, context_length=512,
                      theta=10000.0, eps=1e-6, tied=False, seed=31001),
    "deepseek2-lite": dict(arch="deepseek2", layers=2, hidden=32, heads=4, q_lora_rank=None, kv_lora_rank=16,
                           qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=16, first_k_dense_replace=1,
                           intermediate_size=64, n_routed_experts=8, num_experts_per_tok=2,
                           moe_intermediate_size=8, n_shared_experts=2, n_group=None, topk_group=None,
                           scoring_func="softmax", e_score_correction_bias=False, norm_topk_prob=False,
                           routed_scaling_factor=1.0, mla_split=False, rope_scaling=None, context_length=512,
                           theta=10000.0, eps=1e-6, tied=False, seed=31002),
}
# The same weights as deepseek2 (same seed), with DeepSeek-V3's rope_scaling block.
DEEPSEEK["deepseek2-yarn"] = dict(DEEPSEEK["deepseek2"], rope_scaling=dict(
    type="yarn", factor=4.0, original_max_position_embeddings=32, mscale=1.0, mscale_all_dim=1.0,
    beta_fast=32.0, beta_slow=1.0))

# GLM-4.5 (general.architecture glm4moe), shaped like GLM-4.5-Air. Field names follow Hugging Face's
# config.json (Glm4MoeConfig): num_hidden_layers (here "layers") counts the trunk only; the converter
# (conversion/glm.py: Glm4MoeModel) adds the num_nextn_predict_layers MTP layers to block_count and
# writes them as ordinary blocks plus the blk.N.nextn.* tensors. No n_group / topk_group (GLM-4.5-Air's
# are 1 / 1, a no-op), no q/k norms (GLM-4.5-Air has none), untied lm_head.
GLM = {
    "glm4moe": dict(arch="glm4moe", layers=2, num_nextn_predict_layers=1, hidden=32, heads=4, kv_heads=2,
                    head_dim=16, partial_rotary_factor=0.5, attention_bias=True, use_qk_norm=False,
                    first_k_dense_replace=1, intermediate_size=64, n_routed_experts=8, num_experts_per_tok=2,
                    moe_intermediate_size=8, n_shared_experts=1, norm_topk_prob=True,
                    routed_scaling_factor=2.5, context_length=512, theta=1000000.0, eps=1e-5, tied=False,
                    seed=29011),
}

# Gemma family (dense, written by write_gguf): tied embeddings, GeGLU with the tanh GELU, the
# embedding x sqrt(hidden), norm gains stored as the converter stores them (1 + w). Field names past
# the common ones follow Hugging Face's config.json; the sliding-window pattern (2 for gemma2, 6 for
# gemma3) and Gemma 3's local rope base (10000) are llama.cpp's defaults and are not written.
# Embedding rows of std 0.5: x sqrt(32) puts the residual stream near rms 2.8, beside the layers'
# outputs, and the tied logits spread over ~3 units (max ~18). The soft caps are small enough to
# bite: ~20% of the visible attention scores and ~17% of the logits exceed cap / 2.
GEMMA = {
    "gemma": dict(arch="gemma", layers=2, hidden=32, heads=4, kv_heads=1, head_dim=16, ff=64,
                  theta=10000.0, eps=1e-6, tied=True, seed=29007, embd_std=0.5),
    "gemma2": dict(arch="gemma2", layers=2, hidden=32, heads=4, kv_heads=2, head_dim=16, ff=64,
                   theta=10000.0, eps=1e-6, tied=True, seed=29008, embd_std=0.5,
                   sliding_window=8, sliding_window_pattern=2,
                   attn_logit_softcapping=3.0, final_logit_softcapping=8.0),
    "gemma3": dict(arch="gemma3", layers=6, hidden=32, heads=4, kv_heads=2, head_dim=16, ff=64,
                   theta=1000000.0, eps=1e-6, tied=True, seed=29009, embd_std=0.5,
                   sliding_window=8, sliding_window_pattern=6, rope_local_base_freq=10000.0,
                   rope_scaling=dict(type="linear", factor=8.0)),
}


def bytes_to_unicode():
    """GPT-2's byte -> printable character table (the byte-level BPE alphabet)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, (chr(c) for c in cs)))


def tokenizer():
    """256 byte tokens, a few merges, and <|endoftext|> (control) as BOS/EOS."""
    b2u = bytes_to_unicode()
    tokens = [b2u[b] for b in range(256)]
    merges = ["Ġ t", "h e", "Ġt he", "Ġ a", "i n", "e r"]
    for m in merges:
        tokens.append(m.replace(" ", ""))
    tokens.append("<|endoftext|>")
    types = [1] * (len(tokens) - 1) + [3]
    return tokens, types, merges, len(tokens) - 1


def longrope_attn_factor(cfg):
    """Phi3MiniModel's rope.scaling.attn_factor for rope type longrope: sqrt(1 + ln(s) / ln(orig)),
    s = context_length / original_context_length (1 when s <= 1)."""
    orig = cfg["longrope"]["original_context_length"]
    s = cfg["context_length"] / orig
    return math.sqrt(1.0 + math.log(s) / math.log(orig)) if s > 1.0 else 1.0


def write_gguf(path, cfg, variant=None):
    """Writes the checkpoint of an ARCHS or GEMMA entry; returns its tensors by GGUF name.
    variant (phi3-longrope's effect checks only; the weights stay the same): orig_ctx, attn_factor,
    rope_dims override those keys, no_factors leaves out the two rope factor tensors."""
    import gguf
    rng = np.random.default_rng(cfg["seed"])
    lr, var = cfg.get("longrope"), variant or {}
    tokens, types, merges, eos = tokenizer()
    V, H, L = len(tokens), cfg["hidden"], cfg["layers"]
    D, NH, NKV = cfg["head_dim"], cfg["heads"], cfg["kv_heads"]
    E, F = cfg.get("experts", 0), cfg.get("expert_ff", 0)
    arch = cfg["arch"]
    gemma = arch.startswith("gemma")

    w = gguf.GGUFWriter(path, arch)
    # (llama.cpp gives Phi-3's own special tokens attributes when the name
    # says phi3, and this vocabulary has none of them.)
    w.add_name("random-fused" if arch == "phi3" else os.path.splitext(os.path.basename(path))[0])
    w.add_block_count(L)
    w.add_context_length(cfg.get("context_length", 512))
    if lr:
        # Phi3MiniModel.set_gguf_parameters: original_max_position_embeddings (no rope.scaling.type)
        w.add_rope_scaling_orig_ctx_len(var.get("orig_ctx", lr["original_context_length"]))
    w.add_embedding_length(H)
    w.add_feed_forward_length(cfg["ff"])
    w.add_head_count(NH)
    w.add_head_count_kv(NKV)
    w.add_rope_freq_base(cfg["theta"])
    w.add_layer_norm_rms_eps(cfg["eps"])
    if lr:
        # Phi3MiniModel.generate_extra_tensors (rope type longrope)
        w.add_rope_scaling_attn_factors(var.get("attn_factor", longrope_attn_factor(cfg)))
    if gemma:
        # GemmaModel / Gemma2Model / Gemma3Model.set_gguf_parameters (the sliding-window pattern
        # and Gemma 3's local rope base are llama.cpp's per-architecture defaults, not written)
        if cfg.get("sliding_window"):
            w.add_sliding_window(cfg["sliding_window"])
        if cfg.get("attn_logit_softcapping"):
            w.add_attn_logit_softcapping(cfg["attn_logit_softcapping"])
        if cfg.get("final_logit_softcapping"):
            w.add_final_logit_softcapping(cfg["final_logit_softcapping"])
        if cfg.get("rope_scaling"):
            w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
            w.add_rope_scaling_factor(cfg["rope_scaling"]["factor"])
    if "granite" in cfg:
        emb, res, att, logit = cfg["granite"]
        w.add_embedding_scale(emb)
        w.add_residual_scale(res)
        w.add_attention_scale(att)
        w.add_logit_scale(logit)
    if E > 0:
        w.add_expert_count(E)
        w.add_expert_used_count(cfg["used"])
    if arch.startswith("qwen3") or gemma:
        if E > 0:
            w.add_expert_feed_forward_length(F)
        w.add_key_length(D)
        w.add_value_length(D)
    else:
        w.add_rope_dimension_count(var.get("rope_dims", cfg.get("rope_dims", D)))
    w.add_vocab_size(V)
    w.add_file_type(0)  # ALL_F32
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(eos)
    w.add_eos_token_id(eos)
    w.add_add_bos_token(False)

    def mat(rows, cols, scale=None):
        s = 1.0 / np.sqrt(cols) if scale is None else scale
        return (rng.standard_normal((rows, cols)) * s).astype(np.float32)

    def gain(n):
        return (1.0 + 0.25 * rng.standard_normal(n)).astype(np.float32)

    tensors = {}

    def add(name, a):
        tensors[name] = a
        w.add_tensor(name, a)

    if lr:
        # LongRoPE's per-frequency divisors, rope_dims / 2 of each, float32 of 2-decimal numbers and
        # increasing as in Phi-3.5-mini's config.json; the converter yields them before every other tensor.
        half = cfg["rope_dims"] // 2
        long_f = np.round(np.sort(rng.uniform(*lr["long_range"], half)), 2).astype(np.float32)
        short_f = np.round(np.sort(rng.uniform(*lr["short_range"], half)), 2).astype(np.float32)
        if not var.get("no_factors"):
            add("rope_factors_long.weight", long_f)
            add("rope_factors_short.weight", short_f)

    # numpy shape (rows, cols) is GGUF dims (cols, rows): a linear layer's [out][in].
    # (Granite's embedding scale multiplies the embedding: smaller rows keep
    # its activations at the others' size; its tied logits are divided by
    # 16, so their spread comes from the same rows. Gemma's x sqrt(hidden) likewise.)
    add("token_embd.weight", mat(V, H, cfg.get("embd_std", 1.0 / 12.0 if "granite" in cfg else 1.0)))
    for l in range(L):
        p = f"blk.{l}."
        add(p + "attn_norm.weight", gain(H))
        if arch == "phi3":
            # One fused projection, q rows then k then v.
            add(p + "attn_qkv.weight", np.concatenate([mat(NH * D, H), mat(NKV * D, H), mat(NKV * D, H)]))
        else:
            add(p + "attn_q.weight", mat(NH * D, H))
            add(p + "attn_k.weight", mat(NKV * D, H))
            add(p + "attn_v.weight", mat(NKV * D, H))
        add(p + "attn_output.weight", mat(H, NH * D))
        if arch == "qwen2":
            # Biases of unit scale (Qwen2's k biases are large): they move every logit.
            add(p + "attn_q.bias", rng.standard_normal(NH * D).astype(np.float32))
            add(p + "attn_k.bias", rng.standard_normal(NKV * D).astype(np.float32))
            add(p + "attn_v.bias", rng.standard_normal(NKV * D).astype(np.float32))
        if arch.startswith("qwen3") or arch == "gemma3":
            add(p + "attn_q_norm.weight", gain(D))
            add(p + "attn_k_norm.weight", gain(D))
        if arch in ("gemma2", "gemma3"):
            add(p + "post_attention_norm.weight", gain(H))
        add(p + "ffn_norm.weight", gain(H))
        if E == 0:
            FF = cfg["ff"]
            if arch == "phi3":
                # ffn_up of twice the width: the gate's rows, then the up projection's.
                add(p + "ffn_up.weight", np.concatenate([mat(FF, H), mat(FF, H)]))
            else:
                add(p + "ffn_gate.weight", mat(FF, H))
                add(p + "ffn_up.weight", mat(FF, H))
            add(p + "ffn_down.weight", mat(H, FF))
            if arch in ("gemma2", "gemma3"):
                add(p + "post_ffw_norm.weight", gain(H))
            continue
        # Router logits of unit scale: distinct expert choices per token.
        add(p + "ffn_gate_inp.weight", mat(E, H, 2.0 / np.sqrt(H)))
        add(p + "ffn_gate_exps.weight", (rng.standard_normal((E, F, H)) / np.sqrt(H)).astype(np.float32))
        add(p + "ffn_up_exps.weight", (rng.standard_normal((E, F, H)) / np.sqrt(H)).astype(np.float32))
        add(p + "ffn_down_exps.weight", (rng.standard_normal((E, H, F)) / np.sqrt(F)).astype(np.float32))
    add("output_norm.weight", gain(H))
    if not cfg["tied"]:
        # Logits spread over several units so that near ties are rare.
        add("output.weight", mat(V, H, 3.0 / np.sqrt(H)))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return tensors


def deepseek_weights(cfg):
    """Random float32 weights in Hugging Face's DeepSeek-V2/V3 layout ([out][in] linear layers,
    kv_b_proj unsplit), keyed by the HF parameter name without the "model." prefix."""
    rng = np.random.default_rng(cfg["seed"])
    tokens, _, _, _ = tokenizer()
    V, H, NH = len(tokens), cfg["hidden"], cfg["heads"]
    NOPE, ROPE, VD = cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"]
    QR, KVR = cfg["q_lora_rank"], cfg["kv_lora_rank"]
    E, F, S = cfg["n_routed_experts"], cfg["moe_intermediate_size"], cfg["n_shared_experts"]

    def mat(rows, cols, scale=None):
        s = 1.0 / np.sqrt(cols) if scale is None else scale
        return (rng.standard_normal((rows, cols)) * s).astype(np.float32)

    def gain(n):
        return (1.0 + 0.25 * rng.standard_normal(n)).astype(np.float32)

    W = {"embed_tokens.weight": mat(V, H, 1.0)}
    for l in range(cfg["layers"]):
        p = f"layers.{l}."
        W[p + "input_layernorm.weight"] = gain(H)
        if QR:
            W[p + "self_attn.q_a_proj.weight"] = mat(QR, H)
            W[p + "self_attn.q_a_layernorm.weight"] = gain(QR)
            W[p + "self_attn.q_b_proj.weight"] = mat(NH * (NOPE + ROPE), QR)
        else:
            W[p + "self_attn.q_proj.weight"] = mat(NH * (NOPE + ROPE), H)
        W[p + "self_attn.kv_a_proj_with_mqa.weight"] = mat(KVR + ROPE, H)
        W[p + "self_attn.kv_a_layernorm.weight"] = gain(KVR)
        W[p + "self_attn.kv_b_proj.weight"] = mat(NH * (NOPE + VD), KVR)
        W[p + "self_attn.o_proj.weight"] = mat(H, NH * VD)
        W[p + "post_attention_layernorm.weight"] = gain(H)
        if l < cfg["first_k_dense_replace"]:
            FF = cfg["intermediate_size"]
            W[p + "mlp.gate_proj.weight"] = mat(FF, H)
            W[p + "mlp.up_proj.weight"] = mat(FF, H)
            W[p + "mlp.down_proj.weight"] = mat(H, FF)
            continue
        # Router logits of unit scale: sigmoid scores spread over (0.2, 0.8).
        W[p + "mlp.gate.weight"] = mat(E, H)
        if cfg["e_score_correction_bias"]:
            # Non-negative, so sigmoid + bias > 0 and HF's masked_fill(0.0) of the dropped groups
            # selects the same experts as llama.cpp's -inf mask.
            W[p + "mlp.gate.e_score_correction_bias"] = rng.uniform(0.0, 0.2, E).astype(np.float32)
        W[p + "mlp.experts.gate_proj.weight"] = (rng.standard_normal((E, F, H)) / np.sqrt(H)).astype(np.float32)
        W[p + "mlp.experts.up_proj.weight"] = (rng.standard_normal((E, F, H)) / np.sqrt(H)).astype(np.float32)
        W[p + "mlp.experts.down_proj.weight"] = (rng.standard_normal((E, H, F)) / np.sqrt(F)).astype(np.float32)
        W[p + "mlp.shared_experts.gate_proj.weight"] = mat(S * F, H)
        W[p + "mlp.shared_experts.up_proj.weight"] = mat(S * F, H)
        W[p + "mlp.shared_experts.down_proj.weight"] = mat(H, S * F)
    W["norm.weight"] = gain(H)
    # Logits spread over several units so that near ties are rare.
    W["lm_head.weight"] = mat(V, H, 3.0 / np.sqrt(H))
    return W


def write_deepseek_gguf(path, cfg, W):
    """The GGUF that llama.cpp's convert_hf_to_gguf.py (DeepseekV2Model) writes for these weights:
    mla_split=True is today's converter (kv_b_proj split into attn_k_b, transposed, and attn_v_b;
    head_count_kv 1, key/value_length of the latent cache, *_mla lengths), mla_split=False the
    converter before the split (attn_kv_b, head_count_kv = heads, key/value_length per head)."""
    import gguf
    tokens, types, merges, eos = tokenizer()
    V, H, L, NH = len(tokens), cfg["hidden"], cfg["layers"], cfg["heads"]
    NOPE, ROPE, VD = cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"]
    QR, KVR = cfg["q_lora_rank"], cfg["kv_lora_rank"]
    rs = cfg["rope_scaling"]

    w = gguf.GGUFWriter(path, cfg["arch"])
    w.add_name(os.path.splitext(os.path.basename(path))[0])
    # TextModel.set_gguf_parameters
    w.add_block_count(L)
    w.add_context_length(cfg["context_length"])
    w.add_embedding_length(H)
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(NH)
    w.add_head_count_kv(1 if cfg["mla_split"] else NH)
    if rs is not None:
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(rs["factor"])
        w.add_rope_scaling_orig_ctx_len(rs["original_max_position_embeddings"])
        w.add_rope_scaling_yarn_beta_fast(rs["beta_fast"])
        w.add_rope_scaling_yarn_beta_slow(rs["beta_slow"])
    w.add_rope_freq_base(cfg["theta"])
    w.add_layer_norm_rms_eps(cfg["eps"])
    w.add_expert_count(cfg["n_routed_experts"])
    w.add_expert_used_count(cfg["num_experts_per_tok"])
    if cfg["n_group"]:
        w.add_expert_group_count(cfg["n_group"])
        w.add_expert_group_used_count(cfg["topk_group"])
    w.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID if cfg["scoring_func"] == "sigmoid"
                             else gguf.ExpertGatingFuncType.SOFTMAX)
    w.add_file_type(0)  # ALL_F32
    # DeepseekV2Model.set_gguf_parameters
    w.add_leading_dense_block_count(cfg["first_k_dense_replace"])
    w.add_vocab_size(V)
    # llama.cpp requires q_lora_rank unless the layer count is that of a known lite model
    # (26, 27 or 48): a small q-LoRA-less file has to say 0.
    w.add_q_lora_rank(QR or 0)
    w.add_kv_lora_rank(KVR)
    if cfg["mla_split"]:
        w.add_key_length(KVR + ROPE)
        w.add_value_length(KVR)
        w.add_key_length_mla(NOPE + ROPE)
        w.add_value_length_mla(VD)
    else:
        w.add_key_length(NOPE + ROPE)
        w.add_value_length(VD)
    w.add_expert_feed_forward_length(cfg["moe_intermediate_size"])
    w.add_expert_shared_count(cfg["n_shared_experts"])
    w.add_expert_weights_scale(cfg["routed_scaling_factor"])
    if cfg["norm_topk_prob"] or not cfg["mla_split"]:
        # (the converter before the split wrote the flag unconditionally; today's only when true)
        w.add_expert_weights_norm(cfg["norm_topk_prob"])
    w.add_rope_dimension_count(ROPE)
    if rs is not None:
        w.add_rope_scaling_yarn_log_mul(0.1 * rs["mscale_all_dim"])
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(eos)
    w.add_eos_token_id(eos)
    w.add_add_bos_token(False)

    # numpy shape (rows, cols) is GGUF ne (cols, rows).
    w.add_tensor("token_embd.weight", W["embed_tokens.weight"])
    for l in range(L):
        p, b = f"layers.{l}.", f"blk.{l}."
        w.add_tensor(b + "attn_norm.weight", W[p + "input_layernorm.weight"])
        if QR:
            w.add_tensor(b + "attn_q_a.weight", W[p + "self_attn.q_a_proj.weight"])
            w.add_tensor(b + "attn_q_a_norm.weight", W[p + "self_attn.q_a_layernorm.weight"])
            w.add_tensor(b + "attn_q_b.weight", W[p + "self_attn.q_b_proj.weight"])
        else:
            w.add_tensor(b + "attn_q.weight", W[p + "self_attn.q_proj.weight"])
        w.add_tensor(b + "attn_kv_a_mqa.weight", W[p + "self_attn.kv_a_proj_with_mqa.weight"])
        w.add_tensor(b + "attn_kv_a_norm.weight", W[p + "self_attn.kv_a_layernorm.weight"])
        kv_b = W[p + "self_attn.kv_b_proj.weight"]
        if cfg["mla_split"]:
            # DeepseekV2Model.modify_tensors: view (heads, nope + v, kv_lora), split, k_b.transpose(1, 2)
            kv_b = kv_b.reshape(NH, NOPE + VD, KVR)
            w.add_tensor(b + "attn_k_b.weight", np.ascontiguousarray(kv_b[:, :NOPE, :].transpose(0, 2, 1)))
            w.add_tensor(b + "attn_v_b.weight", np.ascontiguousarray(kv_b[:, NOPE:, :]))
        else:
            w.add_tensor(b + "attn_kv_b.weight", kv_b)
        w.add_tensor(b + "attn_output.weight", W[p + "self_attn.o_proj.weight"])
        w.add_tensor(b + "ffn_norm.weight", W[p + "post_attention_layernorm.weight"])
        if l < cfg["first_k_dense_replace"]:
            for g, h in (("gate", "gate_proj"), ("up", "up_proj"), ("down", "down_proj")):
                w.add_tensor(b + f"ffn_{g}.weight", W[p + f"mlp.{h}.weight"])
            continue
        w.add_tensor(b + "ffn_gate_inp.weight", W[p + "mlp.gate.weight"])
        if cfg["e_score_correction_bias"]:
            w.add_tensor(b + "exp_probs_b.bias", W[p + "mlp.gate.e_score_correction_bias"])
        for g, h in (("gate", "gate_proj"), ("up", "up_proj"), ("down", "down_proj")):
            w.add_tensor(b + f"ffn_{g}_exps.weight", W[p + f"mlp.experts.{h}.weight"])
        for g, h in (("gate", "gate_proj"), ("up", "up_proj"), ("down", "down_proj")):
            w.add_tensor(b + f"ffn_{g}_shexp.weight", W[p + f"mlp.shared_experts.{h}.weight"])
    w.add_tensor("output_norm.weight", W["norm.weight"])
    w.add_tensor("output.weight", W["lm_head.weight"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def deepseek_hf_forward(cfg, W, ids, stats=None):
    """float64 logits [len(ids), vocab] computed as Hugging Face's DeepSeek-V2/V3 modeling code does
    (modeling_deepseek.py / transformers' deepseek_v3), from the unsplit HF weights. A check on
    llama.cpp and on the conventions written in scripts/reference/README.md, not a fixture."""
    W = {k: v.astype(np.float64) for k, v in W.items()}
    T, H, NH = len(ids), cfg["hidden"], cfg["heads"]
    NOPE, ROPE, VD = cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"]
    KVR, eps = cfg["kv_lora_rank"], cfg["eps"]
    E, K = cfg["n_routed_experts"], cfg["num_experts_per_tok"]
    rs = cfg["rope_scaling"]

    def rms(x, g):
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * g

    def silu(x):
        return x / (1.0 + np.exp(-x))

    def mlp(x, g, u, d):
        return (silu(x @ g.T) * (x @ u.T)) @ d.T

    # RoPE over the qk_rope_head_dim tail (DeepseekV3YarnRotaryEmbedding / _compute_yarn_parameters).
    dim, base = ROPE, cfg["theta"]
    freq_extra = 1.0 / base ** (np.arange(0, dim, 2) / dim)
    softmax_scale = (NOPE + ROPE) ** -0.5
    mag = 1.0
    if rs is not None:
        fac, orig = rs["factor"], rs["original_max_position_embeddings"]

        def corr_dim(n_rot):
            return dim * np.log(orig / (n_rot * 2 * np.pi)) / (2 * np.log(base))

        low = max(np.floor(corr_dim(rs["beta_fast"])), 0)
        high = min(np.ceil(corr_dim(rs["beta_slow"])), dim - 1)
        if low == high:
            high += 0.001
        ramp = np.clip((np.arange(dim // 2) - low) / (high - low), 0, 1)
        inv_freq_mask = 1.0 - ramp
        inv_freq = freq_extra / fac * (1 - inv_freq_mask) + freq_extra * inv_freq_mask

        def get_mscale(scale, m):
            return 1.0 if scale <= 1 else 0.1 * m * np.log(scale) + 1.0

        mag = get_mscale(fac, rs["mscale"]) / get_mscale(fac, rs["mscale_all_dim"])
        softmax_scale *= get_mscale(fac, rs["mscale_all_dim"]) ** 2
    else:
        inv_freq = freq_extra
    ang = np.arange(T)[:, None] * inv_freq[None, :]
    emb = np.concatenate([ang, ang], axis=-1)
    cos, sin = np.cos(emb) * mag, np.sin(emb) * mag

    def rope(x):  # x [..., T, dim]; apply_rotary_pos_emb with the interleave de-permutation
        x = x.reshape(x.shape[:-1] + (dim // 2, 2)).swapaxes(-1, -2).reshape(x.shape)
        rot = np.concatenate([-x[..., dim // 2:], x[..., :dim // 2]], axis=-1)
        return x * cos + rot * sin

    x = W["embed_tokens.weight"][np.asarray(ids)]
    mask = np.triu(np.full((T, T), -np.inf), 1)
    for l in range(cfg["layers"]):
        p = f"layers.{l}."
        h = rms(x, W[p + "input_layernorm.weight"])
        if cfg["q_lora_rank"]:
            q = rms(h @ W[p + "self_attn.q_a_proj.weight"].T, W[p + "self_attn.q_a_layernorm.weight"])
            q = q @ W[p + "self_attn.q_b_proj.weight"].T
        else:
            q = h @ W[p + "self_attn.q_proj.weight"].T
        q = q.reshape(T, NH, NOPE + ROPE).transpose(1, 0, 2)  # [NH, T, d]
        ckv = h @ W[p + "self_attn.kv_a_proj_with_mqa.weight"].T
        c, k_pe = ckv[:, :KVR], ckv[:, KVR:]
        kv = rms(c, W[p + "self_attn.kv_a_layernorm.weight"]) @ W[p + "self_attn.kv_b_proj.weight"].T
        kv = kv.reshape(T, NH, NOPE + VD).transpose(1, 0, 2)
        k_nope, v = kv[..., :NOPE], kv[..., NOPE:]
        q_pe, k_pe = rope(q[..., NOPE:]), rope(k_pe[None])
        qs = np.concatenate([q[..., :NOPE], q_pe], axis=-1)
        ks = np.concatenate([k_nope, np.broadcast_to(k_pe, (NH, T, ROPE))], axis=-1)
        a = qs @ ks.transpose(0, 2, 1) * softmax_scale + mask
        a = np.exp(a - a.max(-1, keepdims=True))
        a /= a.sum(-1, keepdims=True)
        o = (a @ v).transpose(1, 0, 2).reshape(T, NH * VD)
        x = x + o @ W[p + "self_attn.o_proj.weight"].T
        h = rms(x, W[p + "post_attention_layernorm.weight"])
        if l < cfg["first_k_dense_replace"]:
            x = x + mlp(h, W[p + "mlp.gate_proj.weight"], W[p + "mlp.up_proj.weight"], W[p + "mlp.down_proj.weight"])
            continue
        logits = h @ W[p + "mlp.gate.weight"].T
        if cfg["scoring_func"] == "sigmoid":
            scores = 1.0 / (1.0 + np.exp(-logits))
        else:
            scores = np.exp(logits - logits.max(-1, keepdims=True))
            scores /= scores.sum(-1, keepdims=True)
        choice = scores.copy()
        if cfg["e_score_correction_bias"]:
            choice = choice + W[p + "mlp.gate.e_score_correction_bias"]
        plain = np.argsort(-scores, axis=-1, kind="stable")[:, :K]
        unmasked = np.argsort(-choice, axis=-1, kind="stable")[:, :K]
        if cfg["n_group"]:
            G = cfg["n_group"]
            grp = np.sort(choice.reshape(T, G, E // G), axis=-1)[..., -2:].sum(-1)  # top-2 sum per group
            keep = np.argsort(-grp, axis=-1, kind="stable")[:, :cfg["topk_group"]]
            gmask = np.zeros((T, G), dtype=bool)
            np.put_along_axis(gmask, keep, True, axis=-1)
            choice = np.where(np.repeat(gmask, E // G, axis=-1), choice, 0.0)
        idx = np.argsort(-choice, axis=-1, kind="stable")[:, :K]
        wts = np.take_along_axis(scores, idx, axis=-1)
        if cfg["norm_topk_prob"]:
            wts = wts / (wts.sum(-1, keepdims=True) + 1e-20)
        wts = wts * cfg["routed_scaling_factor"]
        if stats is not None:
            same = lambda a_, b_: np.sort(a_, -1) == np.sort(b_, -1)
            stats["routings"] = stats.get("routings", 0) + T
            stats["bias_changed"] = stats.get("bias_changed", 0) + int((~same(plain, unmasked).all(-1)).sum())
            stats["groups_changed"] = stats.get("groups_changed", 0) + int((~same(unmasked, idx).all(-1)).sum())
        out = np.zeros_like(h)
        gE, uE, dE = (W[p + f"mlp.experts.{n}_proj.weight"] for n in ("gate", "up", "down"))
        for t in range(T):
            for j in range(K):
                e = idx[t, j]
                out[t] += wts[t, j] * mlp(h[t], gE[e], uE[e], dE[e])
        out += mlp(h, W[p + "mlp.shared_experts.gate_proj.weight"], W[p + "mlp.shared_experts.up_proj.weight"],
                   W[p + "mlp.shared_experts.down_proj.weight"])
        x = x + out
    return rms(x, W["norm.weight"]) @ W["lm_head.weight"].T


def f64_agreement(prompts, forward, keep_top=False):
    """Runs forward (seq -> float64 logits [positions][vocab]) over every prompt and llama.cpp's greedy
    tokens; returns the largest |f64 - llama.cpp| over llama.cpp's recorded top-5, the steps where the
    f64 argmax is llama.cpp's token, and the steps (each disagreement printed to stderr). keep_top: also
    stores the f64 top-5 of every step in pr["f64_top"]."""
    worst, agree, steps = 0.0, 0, 0
    for pr in prompts:
        seq = pr["prompt_ids"] + pr["tokens"][:-1]
        lg = forward(seq)
        n = len(pr["prompt_ids"])
        if keep_top:
            pr["f64_top"] = []
        for k, top in enumerate(pr["top"]):
            row = lg[n - 1 + k]
            order = np.argsort(-row, kind="stable")
            if keep_top:
                pr["f64_top"].append([[int(t), float(row[t])] for t in order[:TOP_K]])
            worst = max(worst, max(abs(row[t] - v) for t, v in top))
            steps += 1
            if int(order[0]) == pr["tokens"][k]:
                agree += 1
            else:
                print(f"  f64 check: {pr['name']} step {k}: argmax {int(order[0])} != llama.cpp {pr['tokens'][k]} "
                      f"(llama.cpp gap {pr['gap'][k]:.2e}, f64 gap {row[order[0]] - row[order[1]]:.2e})",
                      file=sys.stderr)
    return worst, agree, steps


def check_deepseek(cfg, W, prompts):
    """Largest |numpy HF-convention logit - llama.cpp logit| over every recorded top-5, and routing stats."""
    stats = {}
    worst, _, _ = f64_agreement(prompts, lambda seq: deepseek_hf_forward(cfg, W, seq, stats))
    print(f"  numpy HF-convention forward vs llama.cpp: max |logit diff| over the top-5 {worst:.2e}; "
          f"routed choices changed by the bias {stats.get('bias_changed', 0)}/{stats.get('routings', 0)}, "
          f"by the groups {stats.get('groups_changed', 0)}/{stats.get('routings', 0)} (token x MoE layer)",
          file=sys.stderr)
    return worst


def glm_weights(cfg):
    """Random float32 weights in Hugging Face's Glm4MoeForCausalLM layout ([out][in] linear layers, experts
    unstacked as the checkpoint has them but kept as one (E, ...) array each), keyed by the HF parameter name
    without the "model." prefix. Layers from num_hidden_layers on are the MTP (nextn) layers: an ordinary
    decoder block (always MoE here) plus embed_tokens, enorm, hnorm, eh_proj and shared_head.{norm,head}."""
    rng = np.random.default_rng(cfg["seed"])
    V, H, NH, NKV, D = len(tokenizer()[0]), cfg["hidden"], cfg["heads"], cfg["kv_heads"], cfg["head_dim"]
    E, F, S, L = cfg["n_routed_experts"], cfg["moe_intermediate_size"], cfg["n_shared_experts"], cfg["layers"]

    def mat(rows, cols, scale=None):
        s = 1.0 / np.sqrt(cols) if scale is None else scale
        return (rng.standard_normal((rows, cols)) * s).astype(np.float32)

    def gain(n):
        return (1.0 + 0.25 * rng.standard_normal(n)).astype(np.float32)

    W = {"embed_tokens.weight": mat(V, H, 1.0)}
    for l in range(L + cfg["num_nextn_predict_layers"]):
        p = f"layers.{l}."
        if l >= L:
            # The MTP block's input: its own embedding of the next token, RMSNorms of that embedding and
            # of the trunk's last hidden state, and eh_proj of the two concatenated back to hidden.
            W[p + "embed_tokens.weight"] = mat(V, H, 1.0)
            W[p + "enorm.weight"] = gain(H)
            W[p + "hnorm.weight"] = gain(H)
            W[p + "eh_proj.weight"] = mat(H, 2 * H)
        W[p + "input_layernorm.weight"] = gain(H)
        for n, rows in (("q", NH * D), ("k", NKV * D), ("v", NKV * D)):
            W[p + f"self_attn.{n}_proj.weight"] = mat(rows, H)
            # attention_bias: biases of unit scale, so that they move every logit.
            W[p + f"self_attn.{n}_proj.bias"] = rng.standard_normal(rows).astype(np.float32)
        W[p + "self_attn.o_proj.weight"] = mat(H, NH * D)
        W[p + "post_attention_layernorm.weight"] = gain(H)
        if l < cfg["first_k_dense_replace"]:
            FF = cfg["intermediate_size"]
            W[p + "mlp.gate_proj.weight"] = mat(FF, H)
            W[p + "mlp.up_proj.weight"] = mat(FF, H)
            W[p + "mlp.down_proj.weight"] = mat(H, FF)
        else:
            # Router logits of unit scale (sigmoid scores over ~(0.2, 0.8)); a non-negative correction
            # bias of up to 0.2, enough to change the chosen pair of experts for many tokens.
            W[p + "mlp.gate.weight"] = mat(E, H)
            W[p + "mlp.gate.e_score_correction_bias"] = rng.uniform(0.0, 0.2, E).astype(np.float32)
            W[p + "mlp.experts.gate_proj.weight"] = (rng.standard_normal((E, F, H)) / np.sqrt(H)).astype(np.float32)
            W[p + "mlp.experts.up_proj.weight"] = (rng.standard_normal((E, F, H)) / np.sqrt(H)).astype(np.float32)
            W[p + "mlp.experts.down_proj.weight"] = (rng.standard_normal((E, H, F)) / np.sqrt(F)).astype(np.float32)
            W[p + "mlp.shared_experts.gate_proj.weight"] = mat(S * F, H)
            W[p + "mlp.shared_experts.up_proj.weight"] = mat(S * F, H)
            W[p + "mlp.shared_experts.down_proj.weight"] = mat(H, S * F)
        if l >= L:
            W[p + "shared_head.norm.weight"] = gain(H)
            W[p + "shared_head.head.weight"] = mat(V, H, 3.0 / np.sqrt(H))
    W["norm.weight"] = gain(H)
    # Logits spread over several units so that near ties are rare.
    W["lm_head.weight"] = mat(V, H, 3.0 / np.sqrt(H))
    return W


def write_glm_gguf(path, cfg, W, name):
    """The GGUF that llama.cpp's converter (conversion/glm.py: Glm4MoeModel over
    conversion/base.py: TextModel.set_gguf_parameters) writes for these weights, with this script's
    byte-level tokenizer instead of GLM's: block_count = trunk + MTP layers, nextn_predict_layers,
    rope.dimension_count = head_dim * partial_rotary_factor, no Q/K row permutation (NeoX RoPE),
    post_attention_layernorm stored as blk.N.post_attention_norm, the experts stacked."""
    import gguf
    tokens, types, merges, eos = tokenizer()
    V, H, NH, NKV, D = len(tokens), cfg["hidden"], cfg["heads"], cfg["kv_heads"], cfg["head_dim"]
    L, N = cfg["layers"], cfg["num_nextn_predict_layers"]

    w = gguf.GGUFWriter(path, cfg["arch"])
    w.add_name(name)
    # TextModel.set_gguf_parameters
    w.add_block_count(L + N)
    w.add_context_length(cfg["context_length"])
    w.add_embedding_length(H)
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(NH)
    w.add_head_count_kv(NKV)
    w.add_rope_freq_base(cfg["theta"])
    w.add_layer_norm_rms_eps(cfg["eps"])
    w.add_expert_count(cfg["n_routed_experts"])  # (Glm4MoeModel writes it again, same value)
    w.add_expert_used_count(cfg["num_experts_per_tok"])
    w.add_key_length(D)  # head_dim: heads x head_dim = 64 != hidden 32
    w.add_value_length(D)
    w.add_file_type(0)  # ALL_F32
    # Glm4MoeModel.set_gguf_parameters
    w.add_rope_dimension_count(int(D * cfg["partial_rotary_factor"]))
    w.add_expert_feed_forward_length(cfg["moe_intermediate_size"])
    w.add_expert_shared_count(cfg["n_shared_experts"])
    w.add_leading_dense_block_count(cfg["first_k_dense_replace"])
    w.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)
    w.add_expert_weights_scale(cfg["routed_scaling_factor"])
    w.add_expert_weights_norm(cfg["norm_topk_prob"])
    w.add_nextn_predict_layers(N)
    w.add_vocab_size(V)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(eos)
    w.add_eos_token_id(eos)
    w.add_add_bos_token(False)

    # numpy shape (rows, cols) is GGUF ne (cols, rows).
    w.add_tensor("token_embd.weight", W["embed_tokens.weight"])
    for l in range(L + N):
        p, b = f"layers.{l}.", f"blk.{l}."
        w.add_tensor(b + "attn_norm.weight", W[p + "input_layernorm.weight"])
        for n in "qkv":
            w.add_tensor(b + f"attn_{n}.weight", W[p + f"self_attn.{n}_proj.weight"])
            w.add_tensor(b + f"attn_{n}.bias", W[p + f"self_attn.{n}_proj.bias"])
        w.add_tensor(b + "attn_output.weight", W[p + "self_attn.o_proj.weight"])
        # GLM4_MOE's tensor list has ATTN_POST_NORM, not FFN_NORM: the MLP's input norm.
        w.add_tensor(b + "post_attention_norm.weight", W[p + "post_attention_layernorm.weight"])
        if l < cfg["first_k_dense_replace"]:
            for g in ("gate", "up", "down"):
                w.add_tensor(b + f"ffn_{g}.weight", W[p + f"mlp.{g}_proj.weight"])
        else:
            w.add_tensor(b + "ffn_gate_inp.weight", W[p + "mlp.gate.weight"])
            w.add_tensor(b + "exp_probs_b.bias", W[p + "mlp.gate.e_score_correction_bias"])
            # Glm4MoeModel.modify_tensors stacks the experts down, gate, up
            for g in ("down", "gate", "up"):
                w.add_tensor(b + f"ffn_{g}_exps.weight", W[p + f"mlp.experts.{g}_proj.weight"])
            for g in ("gate", "up", "down"):
                w.add_tensor(b + f"ffn_{g}_shexp.weight", W[p + f"mlp.shared_experts.{g}_proj.weight"])
        if l >= L:
            w.add_tensor(b + "nextn.eh_proj.weight", W[p + "eh_proj.weight"])
            w.add_tensor(b + "nextn.embed_tokens.weight", W[p + "embed_tokens.weight"])
            w.add_tensor(b + "nextn.enorm.weight", W[p + "enorm.weight"])
            w.add_tensor(b + "nextn.hnorm.weight", W[p + "hnorm.weight"])
            w.add_tensor(b + "nextn.shared_head_head.weight", W[p + "shared_head.head.weight"])
            w.add_tensor(b + "nextn.shared_head_norm.weight", W[p + "shared_head.norm.weight"])
    w.add_tensor("output_norm.weight", W["norm.weight"])
    w.add_tensor("output.weight", W["lm_head.weight"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def glm_hf_forward(cfg, W, ids, stats=None):
    """float64 logits [len(ids), vocab] computed as Hugging Face's GLM-4.5 modeling code does
    (transformers' modeling_glm4_moe.py, Glm4MoeForCausalLM): q/k/v projections with biases, rotate_half
    RoPE on the first head_dim * partial_rotary_factor channels of each head (the rest passed through),
    inv_freq = 1 / theta^(2i / rotary_dim), Glm4MoeTopkRouter (sigmoid scores, top-k of scores +
    e_score_correction_bias, weights = the unbiased scores, / (sum + 1e-20), x routed_scaling_factor) +
    the shared expert; the MTP layers (index >= num_hidden_layers) take no part. A check on llama.cpp,
    not a fixture."""
    assert not cfg["use_qk_norm"]
    W = {k: v.astype(np.float64) for k, v in W.items()}
    T, NH, NKV, D, eps = len(ids), cfg["heads"], cfg["kv_heads"], cfg["head_dim"], cfg["eps"]
    E, K = cfg["n_routed_experts"], cfg["num_experts_per_tok"]
    R = int(D * cfg["partial_rotary_factor"])
    inv_freq = 1.0 / cfg["theta"] ** (np.arange(0, R, 2) / R)
    ang = np.arange(T)[:, None] * inv_freq[None, :]
    emb = np.concatenate([ang, ang], axis=-1)
    cos, sin = np.cos(emb), np.sin(emb)

    def rms(x, g):
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * g

    def mlp(x, g, u, d):
        a = x @ g.T
        return (a / (1.0 + np.exp(-a)) * (x @ u.T)) @ d.T

    def rope(x):  # x [heads, T, D]
        xr, xp = x[..., :R], x[..., R:]
        rot = np.concatenate([-xr[..., R // 2:], xr[..., :R // 2]], axis=-1)
        return np.concatenate([xr * cos + rot * sin, xp], axis=-1)

    mask = np.triu(np.full((T, T), -np.inf), 1)
    x = W["embed_tokens.weight"][np.asarray(ids)]
    for l in range(cfg["layers"]):
        p = f"layers.{l}."
        h = rms(x, W[p + "input_layernorm.weight"])
        q, k, v = ((h @ W[p + f"self_attn.{n}_proj.weight"].T + W[p + f"self_attn.{n}_proj.bias"])
                   .reshape(T, nh, D).transpose(1, 0, 2) for n, nh in (("q", NH), ("k", NKV), ("v", NKV)))
        q, k = rope(q), rope(k)
        k, v = np.repeat(k, NH // NKV, axis=0), np.repeat(v, NH // NKV, axis=0)
        a = q @ k.transpose(0, 2, 1) * D ** -0.5 + mask
        a = np.exp(a - a.max(-1, keepdims=True))
        a /= a.sum(-1, keepdims=True)
        x = x + (a @ v).transpose(1, 0, 2).reshape(T, NH * D) @ W[p + "self_attn.o_proj.weight"].T
        h = rms(x, W[p + "post_attention_layernorm.weight"])
        if l < cfg["first_k_dense_replace"]:
            x = x + mlp(h, W[p + "mlp.gate_proj.weight"], W[p + "mlp.up_proj.weight"], W[p + "mlp.down_proj.weight"])
            continue
        scores = 1.0 / (1.0 + np.exp(-(h @ W[p + "mlp.gate.weight"].T)))
        idx = np.argsort(-(scores + W[p + "mlp.gate.e_score_correction_bias"]), axis=-1, kind="stable")[:, :K]
        wts = np.take_along_axis(scores, idx, axis=-1)
        if cfg["norm_topk_prob"]:
            wts = wts / (wts.sum(-1, keepdims=True) + 1e-20)
        wts = wts * cfg["routed_scaling_factor"]
        if stats is not None:
            plain = np.argsort(-scores, axis=-1, kind="stable")[:, :K]
            stats["routings"] = stats.get("routings", 0) + T
            stats["bias_changed"] = stats.get("bias_changed", 0) + int(
                (~(np.sort(plain, -1) == np.sort(idx, -1)).all(-1)).sum())
        out = np.zeros_like(h)
        gE, uE, dE = (W[p + f"mlp.experts.{n}_proj.weight"] for n in ("gate", "up", "down"))
        for t in range(T):
            for j in range(K):
                e = idx[t, j]
                out[t] += wts[t, j] * mlp(h[t], gE[e], uE[e], dE[e])
        out += mlp(h, W[p + "mlp.shared_experts.gate_proj.weight"], W[p + "mlp.shared_experts.up_proj.weight"],
                   W[p + "mlp.shared_experts.down_proj.weight"])
        x = x + out
    return rms(x, W["norm.weight"]) @ W["lm_head.weight"].T


def check_glm(cfg, W, path, prompts):
    """Prints (stderr only) the largest |float64 HF-convention logit - llama.cpp logit| over llama.cpp's
    top-5 on every prompt, the gaps and routing statistics, llama.cpp's layer counts, then how far the
    stored top-5 tokens' logits move (all prompts, on llama.cpp's token path) when llama.cpp runs
    temporary copies without the q/k/v biases, with full rotation, without exp_probs_b, or with the
    MTP layer's tensors perturbed (which llama.cpp does not load: nothing may change)."""
    import tempfile
    import llama_cpp
    L = cfg["layers"]
    seqs = [pr["prompt_ids"] + pr["tokens"][:-1] for pr in prompts]
    stats = {}
    worst, agree, steps = f64_agreement(prompts, lambda seq: glm_hf_forward(cfg, W, seq, stats))
    print(f"  float64 HF-convention forward vs llama.cpp: max |logit diff| over llama.cpp's top-5 {worst:.2e}; "
          f"f64 argmax == llama.cpp token at {agree}/{steps} steps; exp_probs_b changed the chosen experts in "
          f"{stats['bias_changed']}/{stats['routings']} (token x MoE layer) routings", file=sys.stderr)
    gaps = [g for pr in prompts for g in pr["gap"]]
    top1 = [top[0][1] for pr in prompts for top in pr["top"]]
    spread = [top[0][1] - top[-1][1] for pr in prompts for top in pr["top"]]
    print(f"  gaps: min {min(gaps):.2e}, {sum(g < 1e-2 for g in gaps)}/{len(gaps)} below 1e-2, "
          f"{sum(g < 1e-3 for g in gaps)} below 1e-3; top-1 logits {min(top1):.2f}..{max(top1):.2f}, "
          f"top-1 - top-5 {min(spread):.2f}..{max(spread):.2f} (median {np.median(spread):.2f})", file=sys.stderr)

    llm = open_llama(path)
    print(f"  llama.cpp: n_layer {llama_cpp.llama_model_n_layer(llm.model)}, n_layer_nextn "
          f"{llama_cpp.llama_model_n_layer_nextn(llm.model)} (block_count {L + cfg['num_nextn_predict_layers']})",
          file=sys.stderr)
    llm.close()

    def llama_rows(p):
        llm = open_llama(p)
        rows = []
        for seq in seqs:
            llm.reset()
            llm.eval(seq)
            rows.append(np.array(llm.scores[:len(seq)], dtype=np.float64))
        llm.close()
        return rows

    cols = [(i, len(pr["prompt_ids"]) - 1 + k, t) for i, pr in enumerate(prompts)
            for k, top in enumerate(pr["top"]) for t, _ in top]

    def diff(a, b):
        return max(abs(a[i][r, t] - b[i][r, t]) for i, r, t in cols)

    def flips(rows):
        return sum(int(np.argmax(rows[i][len(pr["prompt_ids"]) - 1 + k])) != tok
                   for i, pr in enumerate(prompts) for k, tok in enumerate(pr["tokens"]))

    base = llama_rows(path)
    stored = max(abs(base[i][len(pr["prompt_ids"]) - 1 + k, t] - v) for i, pr in enumerate(prompts)
                 for k, top in enumerate(pr["top"]) for t, v in top)
    print(f"  one-batch llama.cpp runs vs the stored token-by-token runs: {stored:.2e}", file=sys.stderr)

    def mtp(key):
        return key.startswith("layers.") and int(key.split(".")[1]) >= L

    noise = np.random.default_rng(cfg["seed"] + 1)
    variants = [
        ("q/k/v biases zeroed", cfg,
         {k: np.zeros_like(v) if k.endswith("_proj.bias") else v for k, v in W.items()}),
        ("rope.dimension_count 16 (full rotation)", dict(cfg, partial_rotary_factor=1.0), W),
        ("exp_probs_b zeroed", cfg,
         {k: np.zeros_like(v) if k.endswith("e_score_correction_bias") else v for k, v in W.items()}),
        (f"MTP layer's tensors perturbed (+ N(0, 1) noise on every blk.{L}.* tensor)", cfg,
         {k: (v + noise.standard_normal(v.shape)).astype(np.float32) if mtp(k) else v for k, v in W.items()}),
    ]
    with tempfile.TemporaryDirectory() as tmp:
        for what, vcfg, vW in variants:
            p = os.path.join(tmp, "variant.gguf")
            write_glm_gguf(p, vcfg, vW, os.path.splitext(os.path.basename(path))[0])
            rows = llama_rows(p)
            ref64 = [glm_hf_forward(vcfg, vW, seq) for seq in seqs]
            print(f"  {what}: max |top-5 logit change| {diff(rows, base):.4g}, greedy tokens changed "
                  f"{flips(rows)}/{steps}; llama.cpp vs the float64 forward with the same change "
                  f"{diff(rows, ref64):.2e}", file=sys.stderr)


def gemma_hf_forward(cfg, W, ids, stats=None):
    """float64 logits [len(ids), vocab] computed as Hugging Face's Gemma / Gemma2 / Gemma3 modeling code
    does (modeling_gemma.py, modeling_gemma2.py, modeling_gemma3.py), from the GGUF tensors: the
    converter permutes no Q/K rows for these NeoX-RoPE models, and every norm gain is its stored 1 + w.
    The exact tanh GELU (llama.cpp's CPU GELU reads an fp16 table). A check on llama.cpp, not a fixture."""
    W = {k: v.astype(np.float64) for k, v in W.items()}
    arch, T, H = cfg["arch"], len(ids), cfg["hidden"]
    NH, NKV, D, eps = cfg["heads"], cfg["kv_heads"], cfg["head_dim"], cfg["eps"]
    window, pattern = cfg.get("sliding_window"), cfg.get("sliding_window_pattern")
    acap, fcap, rs = cfg.get("attn_logit_softcapping"), cfg.get("final_logit_softcapping"), cfg.get("rope_scaling")
    post_norms = arch in ("gemma2", "gemma3")

    def rms(x, g):
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * g

    def gelu(x):  # gelu_pytorch_tanh
        return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x ** 3)))

    def rope_table(base, factor):  # default / linear rope: inv_freq / factor
        inv_freq = 1.0 / base ** (np.arange(0, D, 2) / D) / factor
        ang = np.arange(T)[:, None] * inv_freq[None, :]
        emb = np.concatenate([ang, ang], axis=-1)
        return np.cos(emb), np.sin(emb)

    def rope(x, table):  # x [heads, T, D]; apply_rotary_pos_emb (rotate_half)
        cos, sin = table
        return x * cos + np.concatenate([-x[..., D // 2:], x[..., :D // 2]], axis=-1) * sin

    # Global layers: rope_theta with rope_scaling; sliding layers: rope_local_base_freq, unscaled (Gemma 3).
    global_rope = rope_table(cfg["theta"], rs["factor"] if rs else 1.0)
    local_rope = rope_table(cfg.get("rope_local_base_freq") or cfg["theta"], 1.0)
    qi, kj = np.arange(T)[:, None], np.arange(T)[None, :]
    x = W["token_embd.weight"][np.asarray(ids)] * np.sqrt(H)  # normalizer = hidden_size ** 0.5
    for l in range(cfg["layers"]):
        p = f"blk.{l}."
        local = pattern is not None and (l + 1) % pattern != 0  # layer_types[l] == "sliding_attention"
        h = rms(x, W[p + "attn_norm.weight"])  # input_layernorm
        q = (h @ W[p + "attn_q.weight"].T).reshape(T, NH, D).transpose(1, 0, 2)
        k = (h @ W[p + "attn_k.weight"].T).reshape(T, NKV, D).transpose(1, 0, 2)
        v = (h @ W[p + "attn_v.weight"].T).reshape(T, NKV, D).transpose(1, 0, 2)
        if arch == "gemma3":  # q_norm / k_norm over head_dim, before RoPE
            q, k = rms(q, W[p + "attn_q_norm.weight"]), rms(k, W[p + "attn_k_norm.weight"])
        table = local_rope if local else global_rope
        q, k = rope(q, table), rope(k, table)
        k, v = np.repeat(k, NH // NKV, axis=0), np.repeat(v, NH // NKV, axis=0)  # repeat_kv
        s = q @ k.transpose(0, 2, 1) * D ** -0.5  # scaling = query_pre_attn_scalar ** -0.5, scalar = head_dim
        visible = kj <= qi
        if local and window:
            visible &= qi - kj < window
        if acap:
            if stats is not None:
                sv = np.abs(s[:, visible])
                stats["scores"] = stats.get("scores", 0) + sv.size
                stats["scores_over"] = stats.get("scores_over", 0) + int((sv > acap / 2).sum())
                stats["scores_max"] = max(stats.get("scores_max", 0.0), float(sv.max()))
            s = acap * np.tanh(s / acap)
        s = np.where(visible, s, -np.inf)
        a = np.exp(s - s.max(-1, keepdims=True))
        a /= a.sum(-1, keepdims=True)
        o = (a @ v).transpose(1, 0, 2).reshape(T, NH * D) @ W[p + "attn_output.weight"].T
        if post_norms:
            o = rms(o, W[p + "post_attention_norm.weight"])  # post_attention_layernorm (Gemma 2/3)
        x = x + o
        h = rms(x, W[p + "ffn_norm.weight"])  # pre_feedforward_layernorm (Gemma: post_attention_layernorm)
        m = (gelu(h @ W[p + "ffn_gate.weight"].T) * (h @ W[p + "ffn_up.weight"].T)) @ W[p + "ffn_down.weight"].T
        if post_norms:
            m = rms(m, W[p + "post_ffw_norm.weight"])  # post_feedforward_layernorm
        x = x + m
    logits = rms(x, W["output_norm.weight"]) @ W["token_embd.weight"].T  # tied lm_head
    if fcap:
        if stats is not None:
            stats["logits"] = stats.get("logits", 0) + logits.size
            stats["logits_over"] = stats.get("logits_over", 0) + int((np.abs(logits) > fcap / 2).sum())
            stats["logits_max"] = max(stats.get("logits_max", 0.0), float(np.abs(logits).max()))
        logits = fcap * np.tanh(logits / fcap)
    return logits


# What each Gemma feature changes: the float64 forward without it, on the long prompt.
GEMMA_ABLATIONS = {
    "sliding window": dict(sliding_window=None),
    "attention soft-cap": dict(attn_logit_softcapping=None),
    "final soft-cap": dict(final_logit_softcapping=None),
    "linear rope scaling": dict(rope_scaling=None),
    "local rope base (rope_theta on every layer)": dict(rope_local_base_freq=None),
}


def check_gemma(cfg, W, prompts):
    """Adds the float64 forward's top-5 on llama.cpp's token path to every prompt ("f64_top"); prints the
    largest |f64 - llama.cpp| over llama.cpp's top-5, the greedy agreement, how often the caps bite
    and how much each feature moves the logits (stderr only)."""
    stats = {}
    worst, agree, steps = f64_agreement(prompts, lambda seq: gemma_hf_forward(cfg, W, seq, stats), keep_top=True)
    print(f"  float64 HF-convention forward vs llama.cpp: max |logit diff| over llama.cpp's top-5 {worst:.2e}; "
          f"f64 argmax == llama.cpp token at {agree}/{steps} steps", file=sys.stderr)
    if stats.get("scores"):
        print(f"  attention scores with |s| > cap/2 = {cfg['attn_logit_softcapping'] / 2:g}: "
              f"{stats['scores_over']}/{stats['scores']} (max |s| {stats['scores_max']:.2f})", file=sys.stderr)
    if stats.get("logits"):
        print(f"  logits with |x| > cap/2 = {cfg['final_logit_softcapping'] / 2:g}: "
              f"{stats['logits_over']}/{stats['logits']} (max |x| {stats['logits_max']:.2f})", file=sys.stderr)
    long = next(pr for pr in prompts if pr["name"] == "long")
    seq = long["prompt_ids"] + long["tokens"][:-1]
    base = gemma_hf_forward(cfg, W, seq)
    for what, off in GEMMA_ABLATIONS.items():
        if all(cfg.get(key) for key in off):
            d = np.abs(gemma_hf_forward(dict(cfg, **off), W, seq) - base).max()
            print(f"  without the {what}: max |logit change| on the long prompt {d:.2e}", file=sys.stderr)
    return worst


def phi3_hf_forward(cfg, W, ids, factors="long", attn_factor=None, rope_dims=None):
    """float64 logits [len(ids), vocab] computed as Hugging Face's Phi-3 modeling code does
    (modeling_phi3.py, rope_type longrope, partial_rotary_factor = rope_dims / head_dim) from the GGUF
    tensors (the converter permutes no phi3 rows): qkv_proj split q | k | v, inv_freq = 1 / (ext_factors
    * base^(2i / rope_dims)), cos and sin times the attention factor, rotate_half on the first rope_dims
    channels of each head and the rest passed through, gate_up_proj split gate | up, tied lm_head.
    factors: "long", "short" or None (all 1); HF picks long when the sequence is longer than
    original_max_position_embeddings, llama.cpp when the context is: this always takes the given one.
    A check on llama.cpp, not a fixture."""
    W = {k: v.astype(np.float64) for k, v in W.items()}
    T, NH, NKV, D, eps = len(ids), cfg["heads"], cfg["kv_heads"], cfg["head_dim"], cfg["eps"]
    R = rope_dims or cfg["rope_dims"]
    ext = W[f"rope_factors_{factors}.weight"] if factors else np.ones(R // 2)
    mscale = longrope_attn_factor(cfg) if attn_factor is None else attn_factor
    inv_freq = 1.0 / (ext * cfg["theta"] ** (np.arange(0, R, 2) / R))
    ang = np.arange(T)[:, None] * inv_freq[None, :]
    emb = np.concatenate([ang, ang], axis=-1)
    cos, sin = np.cos(emb) * mscale, np.sin(emb) * mscale

    def rms(x, g):
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * g

    def rope(x):  # x [heads, T, D]: rotate_half on x[..., :R], x[..., R:] unchanged
        xr, xp = x[..., :R], x[..., R:]
        rot = np.concatenate([-xr[..., R // 2:], xr[..., :R // 2]], axis=-1)
        return np.concatenate([xr * cos + rot * sin, xp], axis=-1)

    mask = np.triu(np.full((T, T), -np.inf), 1)
    x = W["token_embd.weight"][np.asarray(ids)]
    for l in range(cfg["layers"]):
        p = f"blk.{l}."
        qkv = rms(x, W[p + "attn_norm.weight"]) @ W[p + "attn_qkv.weight"].T
        q = qkv[:, :NH * D].reshape(T, NH, D).transpose(1, 0, 2)
        k = qkv[:, NH * D:(NH + NKV) * D].reshape(T, NKV, D).transpose(1, 0, 2)
        v = qkv[:, (NH + NKV) * D:].reshape(T, NKV, D).transpose(1, 0, 2)
        q, k = rope(q), rope(k)
        k, v = np.repeat(k, NH // NKV, axis=0), np.repeat(v, NH // NKV, axis=0)
        a = q @ k.transpose(0, 2, 1) * D ** -0.5 + mask
        a = np.exp(a - a.max(-1, keepdims=True))
        a /= a.sum(-1, keepdims=True)
        x = x + (a @ v).transpose(1, 0, 2).reshape(T, NH * D) @ W[p + "attn_output.weight"].T
        gu = rms(x, W[p + "ffn_norm.weight"]) @ W[p + "ffn_up.weight"].T
        gate, up = gu[:, :cfg["ff"]], gu[:, cfg["ff"]:]
        x = x + (gate / (1.0 + np.exp(-gate)) * up) @ W[p + "ffn_down.weight"].T
    return rms(x, W["output_norm.weight"]) @ W["token_embd.weight"].T


# phi3-longrope's effect checks (llama.cpp on a copy with these changes, and the float64 forward
# with the matching settings), on the long prompt: (what, write_gguf variant, n_ctx, f64 settings, against).
LONGROPE_VARIANTS = [
    ("n_ctx 64 (llama.cpp pads the context to 256 > 64: still the long factors)", {}, 64,
     dict(factors="long"), "base"),
    ("short factors (a copy with original_context_length 512 >= n_ctx 512)", dict(orig_ctx=512), 512,
     dict(factors="short"), "base"),
    ("no rope factor tensors (all 1)", dict(no_factors=True), 512, dict(factors=None), "base"),
    ("attn_factor 1.0", dict(attn_factor=1.0), 512, dict(factors="long", attn_factor=1.0), "base"),
    ("full rotation (dimension_count 16, no factors) against 12 without factors",
     dict(no_factors=True, rope_dims=16), 512, dict(factors=None, rope_dims=16), "no rope factor tensors (all 1)"),
]


def check_longrope(cfg, W, path, prompts):
    """Prints (stderr only) the largest |float64 HF-convention logit - llama.cpp logit| over llama.cpp's
    top-5 on every prompt and the greedy agreement, then how much the long factors, the partial rotation
    and attn_factor move llama.cpp's logits of the stored top-5 tokens on the long prompt."""
    import tempfile
    worst, agree, steps = f64_agreement(prompts, lambda seq: phi3_hf_forward(cfg, W, seq))
    print(f"  float64 HF-convention forward (long factors, attn_factor {longrope_attn_factor(cfg):.6f}) vs "
          f"llama.cpp: max |logit diff| over llama.cpp's top-5 {worst:.2e}; f64 argmax == llama.cpp token at "
          f"{agree}/{steps} steps", file=sys.stderr)

    long = next(pr for pr in prompts if pr["name"] == "long")
    seq = long["prompt_ids"] + long["tokens"][:-1]
    n = len(long["prompt_ids"])
    cols = [(n - 1 + k, t) for k, top in enumerate(long["top"]) for t, _ in top]

    def llama_rows(p, n_ctx):
        llm = open_llama(p, n_ctx)
        if llm.n_ctx() > len(llm.input_ids):  # llama.cpp padded the context (to 256); so do the wrapper's arrays
            llm.input_ids = np.zeros(llm.n_ctx(), dtype=np.intc)
            llm.scores = np.zeros((llm.n_ctx(), llm.scores.shape[1]), dtype=np.single)
        llm.reset()
        llm.eval(seq)
        rows = np.array(llm.scores[:len(seq)], dtype=np.float64)
        llm.close()
        return rows

    def diff(a, b):
        return max(abs(a[i, t] - b[i, t]) for i, t in cols)

    def flips(rows):
        return sum(int(np.argmax(rows[n - 1 + k])) != tok for k, tok in enumerate(long["tokens"]))

    base = llama_rows(path, 512)
    stored = max(abs(base[n - 1 + k, t] - v) for k, top in enumerate(long["top"]) for t, v in top)
    print(f"  long prompt ({n} tokens, positions 0..{len(seq) - 1}): one-batch llama.cpp run vs the stored "
          f"token-by-token run {stored:.2e}", file=sys.stderr)
    runs = {"base": base}
    with tempfile.TemporaryDirectory() as tmp:
        for what, variant, n_ctx, f64, against in LONGROPE_VARIANTS:
            p = path
            if variant:
                p = os.path.join(tmp, "variant.gguf")
                write_gguf(p, cfg, variant)
            rows = runs[what] = llama_rows(p, n_ctx)
            ref64 = phi3_hf_forward(cfg, W, seq, **f64)
            print(f"  {what}: max |top-5 logit change| {diff(rows, runs[against]):.3f}, greedy tokens changed "
                  f"{flips(rows)}/{STEPS}; llama.cpp vs the float64 forward with the same settings "
                  f"{diff(rows, ref64):.2e}", file=sys.stderr)


def open_llama(path, n_ctx=512):
    from llama_cpp import Llama
    kw = dict(model_path=path, logits_all=True, n_ctx=n_ctx, n_threads=2, n_threads_batch=2, seed=0,
              verbose=False, type_k=0, type_v=0)  # GGML_TYPE_F32 KV cache
    try:
        return Llama(flash_attn=False, **kw)
    except TypeError:
        return Llama(**kw)


def run_llama(path):
    return continuations(open_llama(path), PROMPTS)


def continuations(llm, prompts, add_bos=False, special=False):
    """llama.cpp's STEPS greedy tokens after each (name, text) prompt, with the top-5 logits and the
    top-1/top-2 gap at every step (the reference format the Go tests read)."""
    out = []
    for name, text in prompts:
        ids = llm.tokenize(text.encode("utf-8"), add_bos=add_bos, special=special)
        llm.reset()
        llm.eval(ids)
        toks, tops, gaps = [], [], []
        for step in range(STEPS):
            row = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float32)
            order = np.argsort(-row, kind="stable")[:TOP_K]
            nxt = int(order[0])
            toks.append(nxt)
            tops.append([[int(t), float(row[t])] for t in order])
            gaps.append(float(row[order[0]] - row[order[1]]))
            if step + 1 < STEPS:
                llm.eval([nxt])
        out.append({"name": name, "text": text, "prompt_ids": [int(i) for i in ids],
                    "tokens": toks, "top": tops, "gap": gaps})
        print(f"  {name}: {len(ids)} prompt tokens, min gap {min(gaps):.2e}", file=sys.stderr)
    return out

def main():
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    names = sorted(ARCHS) + sorted(GEMMA) + sorted(DEEPSEEK) + sorted(GLM)
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out-dir", default=os.path.join(root, "tests", "testdata", "moe"))
    ap.add_argument("--arch", action="append", choices=names, help="default: all")
    ap.add_argument("--archs", help="comma-separated list, as --arch (e.g. deepseek2,deepseek2-lite,deepseek2-yarn)")
    args = ap.parse_args()
    chosen = list(args.arch or [])
    for name in (args.archs.split(",") if args.archs else []):
        if name not in names:
            ap.error(f"--archs: unknown {name!r} (choose from {', '.join(names)})")
        chosen.append(name)
    os.makedirs(args.out_dir, exist_ok=True)
    import gguf
    import llama_cpp
    for name in chosen or names:
        cfg = ARCHS.get(name) or GEMMA.get(name) or DEEPSEEK.get(name) or GLM[name]
        path = os.path.join(args.out_dir, name + ".gguf")
        print(f"{name}: writing {path}", file=sys.stderr)
        if name in DEEPSEEK:
            W = deepseek_weights(cfg)
            write_deepseek_gguf(path, cfg, W)
        elif name in GLM:
            W = glm_weights(cfg)
            write_glm_gguf(path, cfg, W, name)
        else:
            W = write_gguf(path, cfg)
        prompts = run_llama(path)
        if name in DEEPSEEK:
            check_deepseek(cfg, W, prompts)
        if name in GEMMA:
            check_gemma(cfg, W, prompts)
        if cfg.get("longrope"):
            check_longrope(cfg, W, path, prompts)
        if name in GLM:
            check_glm(cfg, W, path, prompts)
        ref = {
            "model": name + ".gguf",
            "architecture": cfg["arch"],
            "config": cfg,
            "steps": STEPS,
            "tools": {"llama_cpp_python": llama_cpp.__version__, "gguf": importlib.metadata.version("gguf"),
                      "numpy": np.__version__},
            "conventions": {
                "step": "step 0 = logits after the prompt's last token; step k = after feeding greedy token k-1",
                "top": "the 5 largest logits as [token, logit], descending (ties: lower id)",
                "gap": "top-1 logit minus top-2 logit",
                "llama_cpp": "llama-cpp-python, 2 threads, F32 weights, F32 KV cache, flash attention off, fed prompt_ids",
            },
            "prompts": prompts,
        }
        if cfg.get("longrope"):
            ref["conventions"]["n_ctx"] = (
                "512, more than rope.scaling.original_context_length 64: llama.cpp rotates by rope_factors_long "
                "(at a context of at most 64 it would take rope_factors_short); cos and sin times "
                "rope.scaling.attn_factor")
        if name in GLM:
            ref["conventions"]["mtp"] = (
                "block_count 3 includes 1 MTP (nextn) layer, blk.2 with its blk.2.nextn.* tensors, which llama.cpp "
                "does not load (nextn_predict_layers 1; n_layer 2): the logits are the 2 trunk layers' alone")
        if name in GEMMA:
            ref["conventions"]["f64_top"] = (
                "per step, the top-5 [token, logit] of the float64 numpy forward written from Hugging Face's "
                "modeling code (exact tanh GELU; llama.cpp's CPU GELU reads an fp16 table), run on prompt_ids + "
                "llama.cpp's greedy tokens: the reference for tolerances tighter than llama.cpp's GELU")
        with open(os.path.join(args.out_dir, name + ".reference.json"), "w") as f:
            json.dump(ref, f, indent=1)
            f.write("\n")


if __name__ == "__main__":
    main()
