#!/usr/bin/env python3
"""Times the FlashInfer attention shapes of cuda_bench through PyTorch's
scaled_dot_product_attention, for the device check's table
(cuda/bench/device_report.py puts them beside ours).

    python3 sdpa_bench.py BENCH.tsv SDPA.tsv

BENCH.tsv is cuda_bench's output; every FlashInfer decode and prefill shape
in it (GQA 4:1 and 8:1, D 128) is timed and appended to SDPA.tsv as
    sdpa  decode|prefill  group  batch|chunk  context|depth  ms|oom  backend
one row at a time (flushed), so a run stopped part-way keeps what it timed.
PyTorch gets contiguous K/V (no paging) with GQA expanded by enable_gqa; the
prefill shapes with a prefix use an explicit boolean causal mask (SDPA's
is_causal aligns the mask top-left, which is wrong when depth > 0), which can
push SDPA off its flash backend. Each shape is run under every SDPA backend
(flash, cuDNN, memory-efficient; math only if none of them accepts it) and
the fastest is kept, naming the backend that ran.
"""
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

BACKENDS = [("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION),
            ("efficient", SDPBackend.EFFICIENT_ATTENTION)]

HKV, D = 8, 128


def time_ms(fn, reps=7):
    fn()
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    times.sort()
    return times[len(times) // 2]


def best_backend(fn, reps):
    """(ms, backend name) of the fastest SDPA backend that accepts fn's call."""
    best = None
    for name, backend in BACKENDS:
        try:
            with sdpa_kernel([backend]):
                ms = time_ms(fn, reps)
        except (RuntimeError, torch.OutOfMemoryError):
            continue
        if best is None or ms < best[0]:
            best = (ms, name)
    if best is None:
        with sdpa_kernel([SDPBackend.MATH]):
            best = (time_ms(fn, reps), "math")
    return best


def sdpa_decode(group, batch, ctx):
    q = torch.randn(batch, HKV * group, 1, D, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(batch, HKV, ctx, D, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    return best_backend(lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True), 11)


def sdpa_prefill(group, chunk, depth):
    q = torch.randn(1, HKV * group, chunk, D, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(1, HKV, depth + chunk, D, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    if depth == 0:
        fn = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        note = "is_causal"
    else:
        i = torch.arange(chunk, device="cuda")[:, None]
        j = torch.arange(depth + chunk, device="cuda")[None, :]
        mask = j <= depth + i
        fn = lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
        note = "bool mask"
    ms, backend = best_backend(fn, 5)
    return ms, f"{backend}, {note}"


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    rows = [line.rstrip("\n").split("\t") for line in open(sys.argv[1]) if line.strip()]
    shapes = [(r[0], int(r[2]), int(r[3]), int(r[4])) for r in rows
              if r[0] in ("decode", "prefill") and len(r) > 5 and r[1] == "flashinfer"
              and r[5] not in ("skipped", "error")]
    with open(sys.argv[2], "a") as out:
        for kind, group, a, b in shapes:
            try:
                ms, backend = (sdpa_decode if kind == "decode" else sdpa_prefill)(group, a, b)
                cell = f"{ms:.4f}\t{backend}"
            except torch.OutOfMemoryError:
                cell = "oom\tno backend fit in memory"
            torch.cuda.empty_cache()
            out.write(f"sdpa\t{kind}\t{group}\t{a}\t{b}\t{cell}\n")
            out.flush()
            print(f"sdpa {kind} GQA {group}:1 {a} x {b}: {cell}", flush=True)


if __name__ == "__main__":
    main()
