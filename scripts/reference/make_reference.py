#!/usr/bin/env python3
"""make_reference.py: independent reference outputs of SmolLM2-135M-Instruct.Q4_1.gguf.

Two implementations this project did not write compute greedy continuations and
top-k logits for a fixed set of prompts:

  * Hugging Face transformers (the primary logits reference): loads the GGUF,
    dequantises every tensor to fp32 (Q4_1 as q*d+m, Q8_0 as q*d) and runs the
    model in full fp32 on CPU (eager attention, no autocast).
  * llama.cpp through llama-cpp-python (the second opinion): its own tokenizer,
    its own Q4_1 kernels (which quantise activations to Q8_1, so its logits
    differ slightly from the fp32 computation).

Writes (paths relative to the repository root unless --out-dir is given):
  tests/testdata/smollm2/reference.json   per prompt: prompt ids, 32 greedy
                                          tokens and top-5 logits per step from
                                          both tools, top-1/top-2 gaps
  tests/testdata/smollm2/hf_layer0.json   HF fp32 intermediates for
                                          "The capital of France is"

Step convention: step 0 = logits after the prompt's last token; step k = logits
after feeding greedy token k-1. Generation does not stop at EOS (the fixture
always has `steps` tokens); `first_eos` records where EOS first appeared.

Usage: see scripts/reference/README.md.
"""

import argparse
import hashlib
import json
import math
import os
import platform
import sys
import time

# Before any OpenMP runtime starts (torch and llama.cpp each bring one): spinning
# worker threads starve each other on a small shared machine (30x slower decode).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numpy as np

MODEL_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_MODEL = os.path.join(os.path.expanduser("~"), ".cache", "lockstep", "models", MODEL_NAME)
STEPS = 32
TOP_K = 5

LONG_STORY = """The lighthouse on the northern cape had been built in 1871, at a time when the shipping lanes along that coast were among the most dangerous in the region. Storms arrived with little warning, and the rocks beneath the water stretched far out from the shore. Before the light was lit, merchants counted on losing at least one vessel every winter, and the families of the fishing village below the cliffs knew the names of the drowned by heart.

The first keeper was a former ship's carpenter named Elias Marrow. He lived in the small stone cottage at the foot of the tower with his wife, Agnes, and their three children. Every evening at sunset he climbed the one hundred and twelve steps to the lamp room, trimmed the wicks, polished the great brass reflectors, and wound the clockwork that turned the lens. Every morning he climbed them again to put the light out and to write in the logbook: the weather, the ships he had seen, the hours the lamp had burned, and the amount of oil it had used.

The logbooks survive. They are kept today in a glass case in the village museum, and visitors can read the careful handwriting that fills page after page. Most entries are short and plain. "Wind from the west, moderate. Two schooners passed at dawn. Lamp burned eleven hours." But some are longer. In the winter of 1883 Elias wrote four pages about a night when the clockwork failed during a gale, and he and Agnes turned the lens by hand, taking shifts of half an hour each, until the storm passed the next afternoon. A coal ship that was caught near the rocks that night saw the light and turned away in time. Its captain later sent the family a letter of thanks and a silver clock, which still stands on the mantelpiece of the cottage.

Elias kept the light for thirty-one years. When he retired, his eldest daughter, Margaret, took his place, and she became one of the first women in the country to hold the post officially. She modernised the lamp, replacing the oil burners with a paraffin vapour system that gave a brighter and steadier flame. She also started a small school in the cottage for the children of the village, teaching reading and arithmetic in the hours between her duties.

The light was automated in 1962, and the last keeper left the cape that spring. The tower still stands, painted white with a single red band, and its beam still sweeps across the water every ten seconds. People who grew up in the village say that on clear nights they can count the flashes from their bedroom windows, and that the rhythm of the light is the first thing they remember. When asked what the lighthouse meant to them, one old fisherman said simply that"""

LONG_TECH = """A hash table stores key-value pairs in an array of buckets. To insert a pair, the table computes a hash of the key, reduces it modulo the number of buckets, and places the pair in the resulting bucket. Lookups repeat the same computation and then search only that bucket, which is why the average cost of an operation does not grow with the number of stored items, provided the hash function spreads keys evenly.

Two keys can map to the same bucket. This is called a collision, and every hash table needs a strategy for it. With separate chaining, each bucket holds a small list of entries, and colliding keys are appended to the list. With open addressing, all entries live directly in the array; when the preferred slot is taken, the table probes other slots in a fixed sequence, such as the next slot (linear probing) or slots at growing distances (quadratic probing), until it finds a free one.

The load factor is the ratio of stored entries to buckets. As it rises, collisions become more frequent and operations slow down. Most implementations therefore resize the table when the load factor passes a threshold, for example 0.75: they allocate a larger array, usually twice the size, and reinsert every entry. Resizing is expensive, but because it happens rarely, the cost spread over all insertions stays constant on average.

Deleting an entry is simple with chaining, but open addressing needs care: removing an entry from the middle of a probe sequence would break lookups for keys stored after it. A common solution is to leave a special marker, often called a tombstone, that lookups skip over but insertions may reuse.

In summary, the three most important design decisions for a hash table are"""

MEDIUM = """Photosynthesis is the process by which green plants, algae and some bacteria turn light into chemical energy. Inside the chloroplasts, chlorophyll absorbs sunlight, and that energy is used to split water molecules, releasing oxygen as a by-product. The energy captured in this way is then used to combine carbon dioxide from the air into sugars, which the plant uses to grow and to store energy. Without photosynthesis, there would be almost no oxygen in the atmosphere, and most life on Earth"""

# (name, text-or-messages, chat)
PROMPTS = [
    ("capital_france", "The capital of France is", False),
    ("largest_planet", "The largest planet in the solar system is", False),
    ("water_boils", "Water boils at a temperature of", False),
    ("first_president", "The first president of the United States was", False),
    ("hello", "Hello", False),
    ("qa_water", "Q: What is the boiling point of water?\nA:", False),
    ("story_robot", "Once upon a time, there was a little robot who", False),
    ("code_python", 'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n', False),
    ("code_c", "#include <stdio.h>\n\nint main(void) {\n", False),
    ("code_js", "function add(a, b) {", False),
    ("code_json", '{"name": "Alice", "age": 30, "city": "', False),
    ("list_fruits", "Here is a list of fruits:\n1. Apple\n2. Banana\n3.", False),
    ("list_shopping", "Shopping list:\n- eggs\n- milk\n-", False),
    ("numbers_count", "1, 2, 3, 4, 5, 6,", False),
    ("numbers_sum", "12 + 30 =", False),
    ("numbers_year", "The year 1969 was when", False),
    ("repeat", "the the the the the the the the", False),
    ("emoji", "I love pizza \U0001F355 because", False),
    ("fr_capital", "La capitale de la France est", False),
    ("de_berlin", "Der schnellste Weg nach Berlin ist", False),
    ("es_story", "Había una vez un", False),
    ("zh_capital", "中国的首都是", False),
    ("ja_capital", "日本の首都は", False),
    ("ru_capital", "Столица России —", False),
    ("medium_photosynthesis", MEDIUM, False),
    ("long_tech_hashtable", LONG_TECH, False),
    ("long_story_lighthouse", LONG_STORY, False),
    ("chat_2plus2", [{"role": "user", "content": "What is 2+2?"}], True),
    ("chat_haiku", [{"role": "user", "content": "Write a haiku about the sea."}], True),
    ("chat_system_colors", [
        {"role": "system", "content": "You are a terse assistant."},
        {"role": "user", "content": "Name three primary colors."},
    ], True),
    ("chat_translate", [{"role": "user", "content": "Translate 'good morning' into French."}], True),
    ("chat_multiturn", [
        {"role": "user", "content": "Hi! What's your name?"},
        {"role": "assistant", "content": "I'm SmolLM, an AI assistant. How can I help you today?"},
        {"role": "user", "content": "Tell me one fact about the Moon."},
    ], True),
]


def sig6(x):
    """float32 value rounded to 6 significant digits, as a JSON-friendly float."""
    x = float(x)
    if x == 0.0 or not math.isfinite(x):
        return x
    return float(f"{x:.6g}")


def f32(x):
    """Exact float32 value as a Python float (repr round-trips the float32)."""
    return float(np.float32(x))


def topk_entry(logits_row, k):
    """logits_row: 1-D float32 numpy array. Returns (top [[id, logit]*k], gap, argmax)."""
    row = np.asarray(logits_row, dtype=np.float32)
    # stable ordering: by value descending, ties by lower id
    idx = np.lexsort((np.arange(row.shape[0]), -row))[:k]
    top = [[int(i), sig6(row[i])] for i in idx]
    gap = float(row[idx[0]]) - float(row[idx[1]])
    return top, sig6(gap), int(idx[0])


def sha256_of(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


# --------------------------------------------------------------------------
# Hugging Face transformers


def load_hf(model_path):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    d, name = os.path.split(os.path.abspath(model_path))
    tok = AutoTokenizer.from_pretrained(d, gguf_file=name)
    kw = dict(gguf_file=name, attn_implementation="eager")
    try:
        model = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32, **kw)
    except TypeError:  # transformers < 4.56 spells it torch_dtype
        model = AutoModelForCausalLM.from_pretrained(d, torch_dtype=torch.float32, **kw)
    model.eval()
    for n, p in model.named_parameters():
        assert p.dtype == torch.float32, (n, p.dtype)
    return tok, model


def check_hf_dequant(model, model_path):
    """Independent check that HF holds q*d+m (Q4_1) / q*d (Q8_0) in fp32, and that
    the LM head is tied to the embedding. Block layouts per the GGUF spec."""
    import gguf

    r = gguf.GGUFReader(model_path)
    t = {x.name: x for x in r.tensors}

    def blocks(name, bsize):
        raw = np.asarray(t[name].data).view(np.uint8).reshape(-1, bsize)
        return raw

    # Q4_1: f16 d, f16 m, 16 bytes: low nibbles = elements 0..15, high = 16..31
    raw = blocks("blk.0.ffn_down.weight", 20)
    d = raw[:, 0:2].copy().view(np.float16).astype(np.float32)
    m = raw[:, 2:4].copy().view(np.float16).astype(np.float32)
    qs = raw[:, 4:20]
    q = np.concatenate([qs & 0x0F, qs >> 4], axis=1).astype(np.float32)
    w = (q * d + m).reshape(576, 1536)
    hf = model.model.layers[0].mlp.down_proj.weight.detach().numpy()
    assert np.array_equal(w, hf), "Q4_1 dequant mismatch (ffn_down)"

    # Q8_0: f16 d, 32 int8
    raw = blocks("token_embd.weight", 34)
    d = raw[:, 0:2].copy().view(np.float16).astype(np.float32)
    q = raw[:, 2:34].copy().view(np.int8).astype(np.float32)
    e = (q * d).reshape(49152, 576)
    hf_e = model.model.embed_tokens.weight.detach().numpy()
    assert np.array_equal(e, hf_e), "Q8_0 dequant mismatch (token_embd)"
    lm = model.get_output_embeddings().weight.detach().numpy()
    assert np.array_equal(lm, hf_e), "LM head is not the tied embedding"
    return {"q4_1_ffn_down_blk0": "q*d+m exact", "q8_0_token_embd": "q*d exact", "lm_head_tied": True}


def hf_prompt_ids(tok, prompt, chat, chat_template):
    if chat:
        text = tok.apply_chat_template(prompt, chat_template=chat_template,
                                       add_generation_prompt=True, tokenize=False)
    else:
        text = prompt
    # add_bos_token is false in the GGUF; special tokens (<|im_start|> ...) in the
    # rendered chat text are parsed as special tokens by the HF tokenizer.
    ids = tok(text, add_special_tokens=False).input_ids
    return text, [int(i) for i in ids]


def hf_generate(model, ids, steps, k):
    """Full causal prefill of the prompt, then one token at a time with the KV cache."""
    import torch

    assert not torch.is_autocast_enabled()
    out_tokens, tops, gaps = [], [], []
    logits_steps = []
    with torch.no_grad():
        out = model(input_ids=torch.tensor([ids]), use_cache=True)
        past = out.past_key_values
        row = out.logits[0, -1].to(torch.float32).numpy()
        for s in range(steps):
            assert row.dtype == np.float32
            logits_steps.append(row.copy())
            top, gap, nxt = topk_entry(row, k)
            tops.append(top)
            gaps.append(gap)
            out_tokens.append(nxt)
            if s == steps - 1:
                break
            out = model(input_ids=torch.tensor([[nxt]]), past_key_values=past, use_cache=True)
            past = out.past_key_values
            row = out.logits[0, -1].to(torch.float32).numpy()
    return out_tokens, tops, gaps, np.stack(logits_steps)


def hf_recompute_check(model, ids, tokens, cached_logits):
    """One forward over prompt+generated tokens without a cache; max |diff| of the
    full logit rows versus the cached decode (a measure of summation-order noise)."""
    import torch

    seq = ids + tokens[:-1]
    with torch.no_grad():
        out = model(input_ids=torch.tensor([seq]), use_cache=False)
    full = out.logits[0, len(ids) - 1:].numpy()
    assert full.shape == cached_logits.shape
    same_argmax = bool((full.argmax(-1) == cached_logits.argmax(-1)).all())
    return float(np.abs(full - cached_logits).max()), same_argmax


def hf_layer0_dump(model, tok, path, model_sha):
    import torch

    text = "The capital of France is"
    ids = [int(i) for i in tok(text, add_special_tokens=False).input_ids]
    captured = {}
    layer0 = model.model.layers[0]

    def hook(name):
        def f(mod, inp, out):
            o = out[0] if isinstance(out, tuple) else out
            captured[name] = o.detach()[0].numpy().copy()
        return f

    hooks = [
        layer0.input_layernorm.register_forward_hook(hook("layer0_attn_norm")),
        layer0.self_attn.register_forward_hook(hook("layer0_attn_out")),
        layer0.post_attention_layernorm.register_forward_hook(hook("layer0_ffn_norm")),
        layer0.mlp.register_forward_hook(hook("layer0_ffn_out")),
    ]
    with torch.no_grad():
        out = model(input_ids=torch.tensor([ids]), output_hidden_states=True, use_cache=False)
    for h in hooks:
        h.remove()
    hs = out.hidden_states  # [embeddings, after layer 0, ..., final (after output norm)]
    assert len(hs) == model.config.num_hidden_layers + 1

    def rows(a, n=8):
        a = np.asarray(a, dtype=np.float32)
        return {"first8": [[f32(v) for v in r[:n]] for r in a],
                "l2": [f32(np.linalg.norm(r.astype(np.float64))) for r in a],
                "sum": [f32(r.astype(np.float64).sum()) for r in a]}

    emb = hs[0][0].numpy()
    l0 = hs[1][0].numpy()
    final = hs[-1][0].numpy()
    logits = out.logits[0].numpy()
    doc = {
        "model": MODEL_NAME,
        "sha256": model_sha,
        "text": text,
        "prompt_ids": ids,
        "note": ("HF transformers fp32 (eager attention), no cache. Each entry holds, per prompt "
                 "position, the first 8 values of the 576-wide row, the row's L2 norm and sum "
                 "(computed in float64 from the float32 row). layer0_attn_out is the attention "
                 "block's output (o_proj) before the residual add; layer0_ffn_out the MLP output "
                 "before the residual add; final_norm is after the output RMSNorm. "
                 "rms_norm_eps is float32(1e-5) = 9.999999747378752e-06 as stored in the GGUF."),
        "embedding": rows(emb),
        "layer0_attn_norm": rows(captured["layer0_attn_norm"]),
        "layer0_attn_out": rows(captured["layer0_attn_out"]),
        "layer0_ffn_norm": rows(captured["layer0_ffn_norm"]),
        "layer0_ffn_out": rows(captured["layer0_ffn_out"]),
        "after_layer0": rows(l0),
        "after_layer1": rows(hs[2][0].numpy()),
        "final_norm": rows(final),
        "logits_last_top5": [[int(i), f32(logits[-1, i])] for i in
                             np.lexsort((np.arange(logits.shape[1]), -logits[-1]))[:5]],
        "logits_all_positions_top1": [[int(r.argmax()), f32(r.max())] for r in logits],
    }
    with open(path, "w") as f:
        json.dump(doc, f, indent=1, ensure_ascii=False)
        f.write("\n")


# --------------------------------------------------------------------------
# llama.cpp


def load_llama(model_path, n_ctx):
    from llama_cpp import Llama

    return Llama(model_path=model_path, logits_all=True, n_ctx=n_ctx, n_threads=2,
                 n_threads_batch=2, seed=0, verbose=False)


def llama_generate(llm, ids, steps, k):
    llm.reset()
    llm.eval(ids)
    out_tokens, tops, gaps, rows = [], [], [], []
    for s in range(steps):
        row = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float32)
        rows.append(row)
        top, gap, nxt = topk_entry(row, k)
        tops.append(top)
        gaps.append(gap)
        out_tokens.append(nxt)
        if s == steps - 1:
            break
        llm.eval([nxt])
    return out_tokens, tops, gaps, np.stack(rows)


# --------------------------------------------------------------------------


def first_eos(tokens, eos_ids):
    for i, t in enumerate(tokens):
        if t in eos_ids:
            return i
    return None


def agreement(a, b):
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def compare(toks, tops, rows, otoks, otops, orows):
    """Agreement of another run with HF: greedy prefix, and logit differences over
    the steps whose context is identical (steps 0..greedy_prefix)."""
    agree = agreement(toks, otoks)
    ids0 = {t[0] for t in tops[0]} | {t[0] for t in otops[0]}
    d0 = max(abs(float(rows[0][i]) - float(orows[0][i])) for i in ids0)
    n_same_ctx = min(agree + 1, len(toks))
    dfull = float(np.abs(rows[:n_same_ctx] - orows[:n_same_ctx]).max())
    dtop = max(abs(float(rows[s][t[0]]) - float(orows[s][t[0]]))
               for s in range(n_same_ctx) for t in tops[s])
    return {
        "greedy_prefix": agree,
        "step0_top5_max_abs_diff": sig6(d0),
        "shared_context_steps": n_same_ctx,
        "top5_max_abs_diff": sig6(dtop),
        "full_row_max_abs_diff": sig6(dfull),
    }


def write_f32_gguf(src, dst):
    """Copy of the GGUF with every tensor dequantised to F32 (for llama.cpp's fp32 path)."""
    import gguf

    r = gguf.GGUFReader(src)
    w = gguf.GGUFWriter(dst, arch=r.fields["general.architecture"].contents())
    for k, f in r.fields.items():
        if k.startswith("GGUF.") or k == "general.architecture":
            continue
        if k == "general.file_type":
            w.add_uint32(k, 0)  # ALL_F32
            continue
        vt = f.types[0]
        sub = f.types[-1] if vt == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(k, f.contents(), vt, sub_type=sub)
    for t in r.tensors:
        a = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
        w.add_tensor(t.name, a, raw_dtype=gguf.GGMLQuantizationType.F32)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=os.environ.get("LOCKSTEP_MODEL", DEFAULT_MODEL))
    ap.add_argument("--out-dir", default=None, help="default: <repo>/tests/testdata/smollm2")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--skip-llama", action="store_true", help="HF only (llama_cpp fields omitted)")
    ap.add_argument("--skip-f32", action="store_true",
                    help="omit the llama_cpp_f32 run (llama.cpp on an all-F32 dequantised copy, F32 KV cache)")
    ap.add_argument("--tmp-dir", default=None, help="where the temporary F32 GGUF (~540 MB) goes")
    args = ap.parse_args()

    repo = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
    out_dir = args.out_dir or os.path.join(repo, "tests", "testdata", "smollm2")
    os.makedirs(out_dir, exist_ok=True)

    import torch
    import transformers
    import gguf

    torch.set_num_threads(args.threads)
    torch.set_grad_enabled(False)
    torch.manual_seed(0)

    tools = {
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "gguf": getattr(gguf, "__version__", None),
        "llama_cpp_python": None,
        "python": platform.python_version(),
        "numpy": np.__version__,
    }
    if tools["gguf"] is None:
        from importlib.metadata import version
        tools["gguf"] = version("gguf")

    model_sha = sha256_of(args.model)
    t0 = time.time()
    tok, model = load_hf(args.model)
    print(f"[hf] loaded in {time.time() - t0:.1f}s", file=sys.stderr)
    dequant = check_hf_dequant(model, args.model)

    # chat template straight from the GGUF metadata
    r = gguf.GGUFReader(args.model)
    chat_template = r.fields["tokenizer.chat_template"].contents()
    eos_id = int(r.fields["tokenizer.ggml.eos_token_id"].contents())
    add_bos = bool(r.fields["tokenizer.ggml.add_bos_token"].contents())
    assert not add_bos
    del r
    eos_ids = {eos_id}

    hf_layer0_dump(model, tok, os.path.join(out_dir, "hf_layer0.json"), model_sha)

    llm = None
    if not args.skip_llama:
        import llama_cpp
        tools["llama_cpp_python"] = llama_cpp.__version__
        llm = load_llama(args.model, n_ctx=2048)
    llm32 = None
    tmpdir = None
    if not args.skip_llama and not args.skip_f32:
        import tempfile
        from llama_cpp import Llama
        tmpdir = tempfile.TemporaryDirectory(dir=args.tmp_dir)
        f32_path = os.path.join(tmpdir.name, "model-f32.gguf")
        write_f32_gguf(args.model, f32_path)
        llm32 = Llama(model_path=f32_path, logits_all=True, n_ctx=2048, n_threads=2,
                      n_threads_batch=2, seed=0, verbose=False,
                      type_k=0, type_v=0)  # GGML_TYPE_F32 KV cache

    prompts_out = []
    summary = []
    for name, prompt, chat in PROMPTS:
        t1 = time.time()
        text, ids = hf_prompt_ids(tok, prompt, chat, chat_template)
        toks, tops, gaps, hf_rows = hf_generate(model, ids, STEPS, TOP_K)
        recompute_diff, recompute_same = hf_recompute_check(model, ids, toks, hf_rows)
        entry = {
            "name": name,
            "text": text,
            "chat": chat,
        }
        if chat:
            entry["messages"] = prompt
        entry["prompt_ids"] = ids
        entry["n_prompt"] = len(ids)
        entry["hf"] = {
            "tokens": toks,
            "text": tok.decode(toks),
            "first_eos": first_eos(toks, eos_ids),
            "top": tops,
            "gap": gaps,
            "min_gap": min(gaps),
            "cache_vs_recompute_max_abs": sig6(recompute_diff),
        }
        row = {"name": name, "n_prompt": len(ids), "recompute": recompute_diff,
               "recompute_same": recompute_same, "hf_min_gap": min(gaps)}
        if llm is not None:
            lids = [int(i) for i in llm.tokenize(text.encode("utf-8"), add_bos=False, special=chat)]
            ltoks, ltops, lgaps, l_rows = llama_generate(llm, lids, STEPS, TOP_K)
            entry["llama_cpp"] = {
                "prompt_ids": lids,
                "prompt_ids_match_hf": lids == ids,
                "tokens": ltoks,
                "text": tok.decode(ltoks),
                "first_eos": first_eos(ltoks, eos_ids),
                "top": ltops,
                "gap": lgaps,
            }
            ag = compare(toks, tops, hf_rows, ltoks, ltops, l_rows)
            entry["agreement"] = ag
            row.update(prompt_match=lids == ids, agree=ag["greedy_prefix"],
                       d0=ag["step0_top5_max_abs_diff"], dtop=ag["top5_max_abs_diff"],
                       dfull=ag["full_row_max_abs_diff"],
                       hf_text=tok.decode(toks[:8]), ll_text=tok.decode(ltoks[:8]))
        if llm32 is not None:
            # fed HF's prompt ids (identical to llama.cpp's tokenization wherever checked)
            ftoks, ftops, fgaps, f_rows = llama_generate(llm32, ids, STEPS, TOP_K)
            ag = compare(toks, tops, hf_rows, ftoks, ftops, f_rows)
            entry["llama_cpp_f32"] = {
                "tokens": ftoks,
                "top": ftops,
                "gap": fgaps,
                "agreement_with_hf": ag,
            }
            row.update(f32_agree=ag["greedy_prefix"], f32_d0=ag["step0_top5_max_abs_diff"],
                       f32_dfull=ag["full_row_max_abs_diff"])
        prompts_out.append(entry)
        summary.append(row)
        print(f"[{name}] n={len(ids)} {time.time() - t1:.1f}s " +
              json.dumps({k: v for k, v in row.items() if k != 'name'}, ensure_ascii=False),
              file=sys.stderr)

    doc = {
        "model": MODEL_NAME,
        "sha256": model_sha,
        "tools": tools,
        "steps": STEPS,
        "top_k": TOP_K,
        "eos_ids": sorted(eos_ids),
        "conventions": {
            "step": "step 0 = logits after the prompt's last token; step k = after feeding greedy token k-1",
            "generation": "greedy argmax (ties -> lowest id), no early stop at EOS; first_eos = first step whose token is an EOS id, or null",
            "top": "[[token_id, logit]] * top_k per step, logits float32 rounded to 6 significant digits",
            "gap": "top-1 logit minus top-2 logit per step (from unrounded float32), 6 significant digits",
            "prompt_ids": "HF tokenizer built from the GGUF, add_special_tokens=False (tokenizer.ggml.add_bos_token=false); chat prompts rendered with the GGUF chat template, add_generation_prompt=True, special tokens parsed",
            "hf": "transformers, all weights dequantised to fp32 (Q4_1 q*d+m, Q8_0 q*d), fp32 compute, eager attention, full causal prefill then KV-cache decode",
            "hf.cache_vs_recompute_max_abs": "max |logit| difference over the full vocab and all steps between the cached decode and one uncached forward over prompt+tokens (summation-order noise of the same fp32 model)",
            "llama_cpp": "llama-cpp-python (CPU, n_threads=2) fed its own tokenization of the same text; Q4_1 matmuls quantise activations, so logits differ slightly from fp32",
            "llama_cpp_f32": "llama.cpp on a copy of the GGUF with every tensor dequantised to F32 (gguf-py), F32 KV cache, fed the HF prompt_ids: an independent fp32 implementation; agreement_with_hf as for agreement",
            "agreement": "greedy_prefix = identical greedy tokens before the first divergence; step0_top5_max_abs_diff over the union of both top-5 ids at step 0; top5/full_row diffs over steps with identical context",
        },
        "hf_dequant_check": dequant,
        "prompts": prompts_out,
    }
    path = os.path.join(out_dir, "reference.json")
    with open(path, "w") as f:
        json.dump(doc, f, ensure_ascii=False, separators=(",", ":"))
        f.write("\n")
    print(f"wrote {path} ({os.path.getsize(path)} bytes) in {time.time() - t0:.0f}s", file=sys.stderr)

    # summary table on stdout
    if tmpdir is not None:
        del llm32
        tmpdir.cleanup()
    nan = float("nan")
    print("| prompt | n | ids HF=llama.cpp | Q4_1 greedy agree | Q4_1 step0 top5 max|d| | Q4_1 top5 max|d| (shared ctx) "
          "| F32 greedy agree | F32 step0 top5 max|d| | F32 full-row max|d| (shared ctx) | HF min gap | HF cache-vs-recompute |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r_ in summary:
        print(f"| {r_['name']} | {r_['n_prompt']} | {r_.get('prompt_match', '-')} | {r_.get('agree', '-')}/{STEPS} | "
              f"{r_.get('d0', nan):.4f} | {r_.get('dtop', nan):.4f} | {r_.get('f32_agree', '-')}/{STEPS} | "
              f"{r_.get('f32_d0', nan):.2e} | {r_.get('f32_dfull', nan):.2e} | {r_['hf_min_gap']:.4f} | {r_['recompute']:.2e} |")


if __name__ == "__main__":
    main()
