#!/usr/bin/env python3
"""make_kquant_reference.py: ggml's K-quant and Q5 formats, quantised by llama.cpp.

Most GGUF files people download are quantised with llama.cpp's "K" formats
(Q4_K_M, Q5_K_M, Q6_K, ...), which mix Q2_K .. Q6_K super-blocks of 256
elements with Q5_0, Q5_1 and Q8_0 blocks of 32. This script writes a tiny
random-weight Llama as F32 GGUF (1 layer, hidden 256, 4 heads / 2 KV heads of
64, FFN 256, tied embeddings, the byte-level tokenizer of
make_moe_reference.py), quantises it with llama.cpp (llama-cpp-python's
llama_model_quantize, an implementation this project did not write) into
every format below, and writes

  kquant-q4_k_m.gguf      the Q4_K_M file (Q4_K and Q6_K tensors)
  kquant-types.gguf       the smallest tensor of each quantised type any of
                          the files holds, its bytes copied as llama.cpp
                          wrote them, named "<type>.<tensor>"
  kquant.reference.json   per tensor of both files: type, shape and the
                          sha256 of its float32 values as the gguf
                          package's numpy dequantize computes them (ggml's
                          dequantize_row_* ported), with the first 8 values;
                          and llama.cpp's greedy continuations of the Q4_K_M
                          model (top-5 logits, gaps), as make_moe_reference.py
                          records them

under tests/testdata/kquant (or --out-dir).
Usage: see scripts/reference/README.md ("K-quants").
"""

import argparse
import ctypes
import hashlib
import importlib.metadata
import json
import os
import sys
import tempfile

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_moe_reference import PROMPTS, STEPS, continuations, tokenizer  # noqa: E402

SEED = 35001
FTYPES = {"Q2_K": 10, "Q3_K_M": 12, "Q4_K_M": 15, "Q5_K_M": 17, "Q6_K": 18, "Q5_0": 8, "Q5_1": 9, "Q8_0": 7}


def write_f32(path):
    import gguf
    rng = np.random.default_rng(SEED)
    tokens, types, merges, eos = tokenizer()
    V, H, L, NH, NKV, D, FF = len(tokens), 256, 1, 4, 2, 64, 256
    w = gguf.GGUFWriter(path, "llama")
    w.add_name("kquant-llama")
    w.add_block_count(L)
    w.add_context_length(512)
    w.add_embedding_length(H)
    w.add_feed_forward_length(FF)
    w.add_head_count(NH)
    w.add_head_count_kv(NKV)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(D)
    w.add_vocab_size(V)
    w.add_file_type(0)
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

    w.add_tensor("token_embd.weight", mat(V, H, 3.0 / np.sqrt(H)))
    for l in range(L):
        p = f"blk.{l}."
        w.add_tensor(p + "attn_norm.weight", gain(H))
        w.add_tensor(p + "attn_q.weight", mat(NH * D, H))
        w.add_tensor(p + "attn_k.weight", mat(NKV * D, H))
        w.add_tensor(p + "attn_v.weight", mat(NKV * D, H))
        w.add_tensor(p + "attn_output.weight", mat(H, NH * D))
        w.add_tensor(p + "ffn_norm.weight", gain(H))
        w.add_tensor(p + "ffn_gate.weight", mat(FF, H))
        w.add_tensor(p + "ffn_up.weight", mat(FF, H))
        w.add_tensor(p + "ffn_down.weight", mat(H, FF))
    w.add_tensor("output_norm.weight", gain(H))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def quantize(src, dst, ftype):
    import llama_cpp
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = ftype
    params.nthread = 2
    if llama_cpp.llama_model_quantize(src.encode(), dst.encode(), ctypes.byref(params)) != 0:
        sys.exit(f"llama_model_quantize {dst} (ftype {ftype}) failed")


def described(t):
    """A tensor's entry: its type, shape [rows, cols] and its dequantised values' digest."""
    from gguf import GGMLQuantizationType, quants
    qt = GGMLQuantizationType(int(t.tensor_type))
    cols = int(t.shape[0])
    vals = quants.dequantize(np.asarray(t.data), qt).astype(np.float32).reshape(-1)
    return {"type": qt.name, "rows": int(vals.size // cols), "cols": cols,
            "sha256": hashlib.sha256(vals.tobytes()).hexdigest(), "first": [float(x) for x in vals[:8]]}


def run_llama(path):
    from llama_cpp import Llama
    llm = Llama(model_path=path, logits_all=True, n_ctx=512, n_threads=2, n_threads_batch=2, seed=0,
                verbose=False, type_k=0, type_v=0, flash_attn=False)
    return continuations(llm, PROMPTS)

def main():
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out-dir", default=os.path.join(root, "tests", "testdata", "kquant"))
    args = ap.parse_args()
    os.makedirs(args.out_dir, exist_ok=True)
    import gguf
    import llama_cpp
    tmp = tempfile.mkdtemp()
    f32 = os.path.join(tmp, "f32.gguf")
    write_f32(f32)
    chosen = {}  # type name -> (file ftype, tensor)
    for name, ftype in FTYPES.items():
        dst = os.path.join(args.out_dir, "kquant-q4_k_m.gguf") if name == "Q4_K_M" else os.path.join(tmp, name + ".gguf")
        quantize(f32, dst, ftype)
        for t in gguf.GGUFReader(dst).tensors:
            qt = gguf.GGMLQuantizationType(int(t.tensor_type))
            # The smallest tensor of each type (the first of equals).
            if qt.name not in ("F32", "F16") and (qt.name not in chosen or t.n_elements < chosen[qt.name][1].n_elements):
                chosen[qt.name] = (name, t)
        print(f"{name}: {sorted({gguf.GGMLQuantizationType(int(t.tensor_type)).name for t in gguf.GGUFReader(dst).tensors})}",
              file=sys.stderr)

    types_path = os.path.join(args.out_dir, "kquant-types.gguf")
    w = gguf.GGUFWriter(types_path, "llama")
    w.add_name("kquant-types")
    for qname, (fname, t) in sorted(chosen.items()):
        raw = np.asarray(t.data).view(np.uint8).reshape(-1)
        rows = int(t.shape[1]) if len(t.shape) > 1 else 1
        w.add_tensor(f"{qname}.{t.name}", raw.reshape(rows, -1), raw_dtype=gguf.GGMLQuantizationType[qname])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()

    ref = {
        "tools": {"llama_cpp_python": llama_cpp.__version__, "gguf": importlib.metadata.version("gguf"),
                  "numpy": np.__version__},
        "conventions": {
            "tensors": "per file, per tensor: ggml type, rows, cols, sha256 of the little-endian float32 values "
                       "gguf.quants.dequantize gives (row-major), and the first 8 of them",
            "prompts": "llama.cpp's greedy continuations of kquant-q4_k_m.gguf (its own K-quant kernels, "
                       "activations quantised to 8 bits), as make_moe_reference.py records them",
        },
        "tensors": {os.path.basename(p): {t.name: described(t) for t in gguf.GGUFReader(p).tensors}
                    for p in (types_path, os.path.join(args.out_dir, "kquant-q4_k_m.gguf"))},
        "model": "kquant-q4_k_m.gguf",
        "architecture": "llama",
        "steps": STEPS,
        "prompts": run_llama(os.path.join(args.out_dir, "kquant-q4_k_m.gguf")),
    }
    with open(os.path.join(args.out_dir, "kquant.reference.json"), "w") as f:
        json.dump(ref, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
