#!/usr/bin/env python3
"""Runs the attention shapes of cuda_bench through PyTorch's
scaled_dot_product_attention and prints the final device-check table, ours
and PyTorch's side by side.

    python3 sdpa_bench.py BENCH.tsv

BENCH.tsv is cuda_bench's output (ceilings, decode, chunk, iteration rows) and
cuda_graph_bench's (hostgraph rows: host time per decode iteration).
PyTorch gets contiguous K/V (no paging) with GQA expanded by enable_gqa; the
chunk shapes with a prefix use an explicit boolean causal mask (SDPA's
is_causal aligns the mask top-left, which is wrong when depth > 0), which can
push SDPA off its flash backend. Each shape is run under every SDPA backend
(flash, cuDNN, memory-efficient; math only if none of them accepts it) and
the table shows the fastest, naming the backend that ran.
"""
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

BACKENDS = [("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION),
            ("efficient", SDPBackend.EFFICIENT_ATTENTION)]

HQ, HKV, D = 32, 8, 128


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


def sdpa_decode(batch, ctx):
    q = torch.randn(batch, HQ, 1, D, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(batch, HKV, ctx, D, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    ms, backend = best_backend(lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True), 11)
    del q, k, v
    torch.cuda.empty_cache()
    return ms, backend


def sdpa_chunk(chunk, depth):
    q = torch.randn(1, HQ, chunk, D, device="cuda", dtype=torch.bfloat16)
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
    del q, k, v
    torch.cuda.empty_cache()
    return ms, f"{backend}, {note}"


def main():
    rows = [line.rstrip("\n").split("\t") for line in open(sys.argv[1]) if line.strip()]
    ceil = {r[1]: float(r[2]) for r in rows if r[0] == "ceiling"}
    copy_gbs, mm_tf = ceil["copy"], ceil["matmul"]
    out = []
    out.append(f"ceilings: device-to-device copy {copy_gbs:.0f} GB/s (read + write), "
               f"bf16 matmul 8192^3 {mm_tf:.0f} TFLOP/s")
    out.append("")
    out.append("decode attention (32 q heads, 8 kv heads, D 128, page 32)")
    out.append(f"{'batch':>6} {'context':>8} | {'ours ms':>9} {'GB/s':>7} {'% copy':>7} | "
               f"{'sdpa ms':>9} {'GB/s':>7} {'% copy':>7} | {'speedup':>7} sdpa backend")
    for r in rows:
        if r[0] != "decode":
            continue
        batch, ctx = int(r[1]), int(r[2])
        if r[3] == "skipped":
            out.append(f"{batch:>6} {ctx:>8} | skipped ({r[4]})")
            continue
        ms, gbs, pct = float(r[3]), float(r[4]), float(r[5])
        try:
            sms, backend = sdpa_decode(batch, ctx)
            sgbs = batch * ctx * HKV * D * 4 / (sms * 1e6)
            sdpa = f"{sms:>9.4f} {sgbs:>7.0f} {100 * sgbs / copy_gbs:>6.1f}% | {sms / ms:>6.2f}x {backend}"
        except torch.OutOfMemoryError:
            sdpa = "out of memory"
        out.append(f"{batch:>6} {ctx:>8} | {ms:>9.4f} {gbs:>7.0f} {pct:>6.1f}% | {sdpa}")
    out.append("")
    out.append("context-chunk attention (batch 1, 32 q heads, GQA 4:1, D 128, causal in the chunk)")
    out.append(f"{'chunk':>6} {'depth':>7} | {'ours ms':>9} {'TFLOP/s':>8} {'% mm':>6} | "
               f"{'sdpa ms':>9} {'TFLOP/s':>8} {'% mm':>6} | {'speedup':>7} sdpa backend, mask")
    for r in rows:
        if r[0] != "chunk":
            continue
        chunk, depth = int(r[1]), int(r[2])
        ms, tf, pct = float(r[3]), float(r[4]), float(r[5])
        flops = 4.0 * D * HQ * (chunk * depth + chunk * (chunk + 1) / 2)
        try:
            sms, note = sdpa_chunk(chunk, depth)
            stf = flops / (sms * 1e9)
            sdpa = f"{sms:>9.4f} {stf:>8.1f} {100 * stf / mm_tf:>5.1f}% | {sms / ms:>6.2f}x {note}"
        except torch.OutOfMemoryError:
            sdpa = "out of memory"
        out.append(f"{chunk:>6} {depth:>7} | {ms:>9.4f} {tf:>8.1f} {pct:>5.1f}% | {sdpa}")
    out.append("")
    out.append("llama-8b iteration (engine.h, CUDA backend, device time, median of 5)")
    for r in rows:
        if r[0] == "iteration":
            out.append(f"  {r[1]:<30} {r[2]:>9} {r[3]}")
    host = [r for r in rows if r[0] == "hostgraph"]
    if host:
        out.append("")
        out.append("llama-8b decode, host time per iteration (descriptors + plan + launches; goal <= 100 us "
                   "with the Go side), median of 15")
        out.append(f"  {'batch':>5} {'mode':>7} {'host us':>9} {'wall us':>9} {'device ms':>10}")
        for r in host:
            out.append(f"  {r[1]:>5} {r[2]:>7} {float(r[3]):>9.1f} {float(r[4]):>9.1f} {float(r[5]):>10.3f}")
    print("\n".join(out))


if __name__ == "__main__":
    main()
