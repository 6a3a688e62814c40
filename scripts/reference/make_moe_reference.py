#!/usr/bin/env python3
"""make_moe_reference.py: llama.cpp reference outputs of small random-weight MoE checkpoints.

No mixture-of-experts checkpoint small enough for the test machines can be
downloaded, so this script writes one per architecture with the `gguf` package
(random float32 weights from a fixed numpy seed, tiny dimensions, a byte-level
GPT-2 tokenizer) and runs llama.cpp (llama-cpp-python, an implementation this
project did not write) on it: greedy continuations of a fixed set of prompts,
with the top-5 logits and the top-1/top-2 gap at every step.

Architectures (each file is a few hundred KB):
  qwen3moe  general.architecture qwen3moe: per-head q/k RMSNorm, head_dim
            larger than hidden / heads, 16 experts, top-8 (softmax over every
            expert, top-k, renormalised), llama.cpp's NeoX (rotate-half) RoPE
  qwen3     general.architecture qwen3: the dense Qwen3 decoder (q/k norms, no
            experts), the same attention as qwen3moe without the router
  mixtral   general.architecture llama with expert_count: 8 experts, top-2,
            adjacent-pair RoPE (GGUF's interleaved Q/K rows), tied embeddings

Writes, under --out-dir (default tests/testdata/moe relative to the repo):
  <arch>.gguf            the checkpoint
  <arch>.reference.json  per prompt: text, llama.cpp's prompt ids, STEPS greedy
                         tokens, and at every step the top-5 (token, logit)
                         and the top-1 minus top-2 gap

Step convention: step 0 = logits after the prompt's last token; step k = after
feeding greedy token k-1. llama.cpp runs on 2 threads with an F32 KV cache and
flash attention off, so every operation is float32 (F32 weights: no activation
quantisation).

Usage: see scripts/reference/README.md ("MoE checkpoints").
"""

import argparse
import importlib.metadata
import json
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
    "mixtral": dict(arch="llama", layers=2, hidden=32, heads=4, kv_heads=2, head_dim=8,
                    experts=8, used=2, expert_ff=32, ff=32, theta=1000000.0, eps=1e-5,
                    tied=True, seed=29002),
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


def write_gguf(path, cfg):
    import gguf
    rng = np.random.default_rng(cfg["seed"])
    tokens, types, merges, eos = tokenizer()
    V, H, L = len(tokens), cfg["hidden"], cfg["layers"]
    D, NH, NKV = cfg["head_dim"], cfg["heads"], cfg["kv_heads"]
    E, F = cfg["experts"], cfg["expert_ff"]
    arch = cfg["arch"]

    w = gguf.GGUFWriter(path, arch)
    w.add_name(os.path.splitext(os.path.basename(path))[0])
    w.add_block_count(L)
    w.add_context_length(512)
    w.add_embedding_length(H)
    w.add_feed_forward_length(cfg["ff"])
    w.add_head_count(NH)
    w.add_head_count_kv(NKV)
    w.add_rope_freq_base(cfg["theta"])
    w.add_layer_norm_rms_eps(cfg["eps"])
    if E > 0:
        w.add_expert_count(E)
        w.add_expert_used_count(cfg["used"])
    if arch.startswith("qwen3"):
        if E > 0:
            w.add_expert_feed_forward_length(F)
        w.add_key_length(D)
        w.add_value_length(D)
    else:
        w.add_rope_dimension_count(D)
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

    # numpy shape (rows, cols) is GGUF dims (cols, rows): a linear layer's [out][in].
    w.add_tensor("token_embd.weight", mat(V, H, 1.0))
    for l in range(L):
        p = f"blk.{l}."
        w.add_tensor(p + "attn_norm.weight", gain(H))
        w.add_tensor(p + "attn_q.weight", mat(NH * D, H))
        w.add_tensor(p + "attn_k.weight", mat(NKV * D, H))
        w.add_tensor(p + "attn_v.weight", mat(NKV * D, H))
        w.add_tensor(p + "attn_output.weight", mat(H, NH * D))
        if arch.startswith("qwen3"):
            w.add_tensor(p + "attn_q_norm.weight", gain(D))
            w.add_tensor(p + "attn_k_norm.weight", gain(D))
        w.add_tensor(p + "ffn_norm.weight", gain(H))
        if E == 0:
            FF = cfg["ff"]
            w.add_tensor(p + "ffn_gate.weight", mat(FF, H))
            w.add_tensor(p + "ffn_up.weight", mat(FF, H))
            w.add_tensor(p + "ffn_down.weight", mat(H, FF))
            continue
        # Router logits of unit scale: distinct expert choices per token.
        w.add_tensor(p + "ffn_gate_inp.weight", mat(E, H, 2.0 / np.sqrt(H)))
        w.add_tensor(p + "ffn_gate_exps.weight", (rng.standard_normal((E, F, H)) / np.sqrt(H)).astype(np.float32))
        w.add_tensor(p + "ffn_up_exps.weight", (rng.standard_normal((E, F, H)) / np.sqrt(H)).astype(np.float32))
        w.add_tensor(p + "ffn_down_exps.weight", (rng.standard_normal((E, H, F)) / np.sqrt(F)).astype(np.float32))
    w.add_tensor("output_norm.weight", gain(H))
    if not cfg["tied"]:
        # Logits spread over several units so that near ties are rare.
        w.add_tensor("output.weight", mat(V, H, 3.0 / np.sqrt(H)))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def run_llama(path):
    from llama_cpp import Llama
    kw = dict(model_path=path, logits_all=True, n_ctx=512, n_threads=2, n_threads_batch=2, seed=0,
              verbose=False, type_k=0, type_v=0)  # GGML_TYPE_F32 KV cache
    try:
        llm = Llama(flash_attn=False, **kw)
    except TypeError:
        llm = Llama(**kw)
    out = []
    for name, text in PROMPTS:
        ids = llm.tokenize(text.encode("utf-8"), add_bos=False, special=False)
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
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out-dir", default=os.path.join(root, "tests", "testdata", "moe"))
    ap.add_argument("--arch", action="append", choices=sorted(ARCHS), help="default: all")
    args = ap.parse_args()
    os.makedirs(args.out_dir, exist_ok=True)
    import gguf
    import llama_cpp
    for name in args.arch or sorted(ARCHS):
        cfg = ARCHS[name]
        path = os.path.join(args.out_dir, name + ".gguf")
        print(f"{name}: writing {path}", file=sys.stderr)
        write_gguf(path, cfg)
        prompts = run_llama(path)
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
        with open(os.path.join(args.out_dir, name + ".reference.json"), "w") as f:
            json.dump(ref, f, indent=1)
            f.write("\n")


if __name__ == "__main__":
    main()
