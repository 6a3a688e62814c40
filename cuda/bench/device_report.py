#!/usr/bin/env python3
"""What scripts/device-check.sh prints and writes from the benchmarks' TSV.

    device_report.py table    BENCH.tsv [--sdpa SDPA.tsv]   the tables (stdout)
    device_report.py headline BENCH.tsv                     the summary lines (stdout)
    device_report.py measured BENCH.tsv OUT.json GPU_NAME   the twin's measured rates

BENCH.tsv rows (tab-separated; cuda/bench/bench_kernels.cu and bench_graphs.cu):
    ceiling    copy|matmul  value  unit
    decode     flashinfer|handwritten  group  batch  context  ms  GB/s  %copy
    prefill    flashinfer|handwritten  group  chunk  depth    ms  TFLOP/s  %matmul
    (a decode/prefill row whose ms is "skipped" or "error" carries the reason next)
    iteration  name  ms  ms
    mla        decode|prefill  flashinfer  heads  batch|chunk  context|depth  ms  GB/s|TFLOP/s  %ceiling
    (an mla row whose ms is "skipped" or "error" carries the reason next)
    hostgraph  batch  eager|graphs  host_us  wall_us  device_ms
SDPA.tsv rows (cuda/bench/sdpa_bench.py):
    sdpa  decode|prefill  group  batch|chunk  context|depth  ms|oom  backend

FlashInfer is the production attention (head dims 64 and 128); the hand-written
kernels serve only head dims 16/32 (the tiny preset) and are shown for
reference. Decode is judged by achieved bandwidth against the copy ceiling,
prefill by achieved FLOP/s against the bf16 matmul ceiling (DESIGN.md §7).
The twin's measured profile is based on the FlashInfer rows only.

Runs on any python3 (no third-party module), so its test runs without a GPU.
"""
import datetime
import json
import statistics
import sys

HEAD_DIM, KV_HEADS = 128, 8


def load(path):
    """Rows of a TSV file, each a list of fields. A last line without its
    newline (a benchmark killed while writing it) is dropped."""
    with open(path) as f:
        lines = f.readlines()
    if lines and not lines[-1].endswith("\n"):
        print(f"device_report: {path}: dropped an unfinished last line: {lines[-1]!r}", file=sys.stderr)
        lines.pop()
    return [line.rstrip("\n").split("\t") for line in lines if line.strip()]


def ceilings(rows):
    return {r[1]: float(r[2]) for r in rows if r[0] == "ceiling" and len(r) >= 3}


def attention(rows, kind, kernel):
    """{(group, a, b): (ms, rate, pct) or (status, reason)} of one kind and kernel."""
    out = {}
    for r in rows:
        if r[0] != kind or len(r) < 6 or r[1] != kernel:
            continue
        key = (int(r[2]), int(r[3]), int(r[4]))
        if r[5] in ("skipped", "error"):
            out[key] = (r[5], r[6] if len(r) > 6 else "")
        else:
            out[key] = (float(r[5]), float(r[6]), float(r[7]))
    return out


def sdpa_rows(path):
    out = {}
    if path is None:
        return out
    for r in load(path):
        if r[0] == "sdpa" and len(r) >= 7:
            out[(r[1], int(r[2]), int(r[3]), int(r[4]))] = (r[5], r[6])
    return out


def fmt_cell(v, rate_width=7):
    """ms, rate and % of the ceiling, or the status and reason."""
    if len(v) == 2:
        return f"{v[0]} ({v[1]})"
    return f"{v[0]:>9.4f} {v[1]:>{rate_width}.1f} {v[2]:>6.1f}%"


def table(rows, sdpa):
    c = ceilings(rows)
    copy, mm = c.get("copy"), c.get("matmul")
    out = [f"ceilings (measured in this run): device-to-device copy "
           f"{copy:.0f} GB/s (read + write), bf16 matmul 8192^3 {mm:.0f} TFLOP/s"
           if copy and mm else "ceilings: not measured (cuda_bench stopped before them)", ""]
    for kind, unit, rate, ceiling in (("decode", "context", "GB/s", "copy"), ("prefill", "depth", "TFLOP/s", "matmul")):
        fi = attention(rows, kind, "flashinfer")
        hw = attention(rows, kind, "handwritten")
        size = "batch" if kind == "decode" else "chunk"
        for group in sorted({k[0] for k in fi} | {k[0] for k in hw}):
            what = ("decode attention (paged, page 32" if kind == "decode"
                    else "prefill attention (batch 1, causal over a cached prefix, page 32")
            out.append(f"{what}, {KV_HEADS * group} q heads over {KV_HEADS} kv heads (GQA {group}:1), "
                       f"D {HEAD_DIM}): ms, {rate}, % of the {ceiling} ceiling")
            head = f"{size:>6} {unit:>7} | {'FlashInfer (production)':>25} | {'hand-written (D 16/32 only)':>27}"
            if sdpa:
                head += " | PyTorch SDPA (fastest backend)"
            out.append(head)
            keys = sorted(k for k in set(fi) | set(hw) if k[0] == group)
            for key in keys:
                line = f"{key[1]:>6} {key[2]:>7} | {fmt_cell(fi[key]) if key in fi else '-':>25} | " \
                       f"{fmt_cell(hw[key]) if key in hw else '-':>27}"
                s = sdpa.get((kind, *key))
                if s is not None:
                    line += " | " + sdpa_cell(kind, key, s, copy, mm)
                out.append(line)
            out.append("")
    mla = [r for r in rows if r[0] == "mla" and len(r) >= 7]
    if mla:
        out.append("MLA attention (FlashInfer's MLA kernel, latent 512 + rope 64, bf16 latent pages of 32): "
                   "ms, GB/s of latents (decode) or TFLOP/s (prefill), % of the copy / matmul ceiling")
        out.append(f"  {'kind':>7} {'heads':>5} {'batch|chunk':>11} {'ctx|depth':>9} | {'FlashInfer MLA':>25}")
        for r in mla:
            cell = (f"{r[6]} ({r[7] if len(r) > 7 else ''})" if r[6] in ("skipped", "error")
                    else fmt_cell((float(r[6]), float(r[7]), float(r[8]))))
            out.append(f"  {r[1]:>7} {r[3]:>5} {r[4]:>11} {r[5]:>9} | {cell:>25}")
        out.append("")
    iters = [r for r in rows if r[0] == "iteration"]
    if iters:
        out.append("llama-8b iteration (engine.h, CUDA backend, device time, median of 5)")
        out += [f"  {r[1]:<30} {r[2]:>9} {r[3]}" for r in iters]
        out.append("")
    host = [r for r in rows if r[0] == "hostgraph"]
    if host:
        out.append("llama-8b decode, host time per iteration (descriptors + plan + launches; "
                   "goal <= 100 us with the Go side), median of 15")
        out.append(f"  {'batch':>5} {'mode':>7} {'host us':>9} {'wall us':>9} {'device ms':>10}")
        out += [f"  {r[1]:>5} {r[2]:>7} {float(r[3]):>9.1f} {float(r[4]):>9.1f} {float(r[5]):>10.3f}" for r in host]
    return "\n".join(out).rstrip() + "\n"


def sdpa_cell(kind, key, s, copy, mm):
    ms, backend = s
    if ms == "oom":
        return f"out of memory ({backend})"
    ms = float(ms)
    group, a, b = key
    if kind == "decode":
        rate = a * b * KV_HEADS * HEAD_DIM * 4 / (ms * 1e6)
        pct = 100 * rate / copy if copy else 0
        return f"{ms:>9.4f} {rate:>7.1f} {pct:>5.1f}% {backend}"
    flops = 4.0 * HEAD_DIM * KV_HEADS * group * (a * b + a * (a + 1) / 2)
    rate = flops / (ms * 1e9)
    pct = 100 * rate / mm if mm else 0
    return f"{ms:>9.4f} {rate:>7.1f} {pct:>5.1f}% {backend}"


def headline(rows):
    c = ceilings(rows)
    out = []
    if "copy" in c and "matmul" in c:
        out.append(f"ceilings: copy {c['copy']:.0f} GB/s, bf16 matmul {c['matmul']:.0f} TFLOP/s")
    for kernel, label in (("flashinfer", "FlashInfer"), ("handwritten", "hand-written (D 16/32 only)")):
        dec, pre = attention(rows, "decode", kernel), attention(rows, "prefill", kernel)
        for group in sorted({k[0] for k in dec} | {k[0] for k in pre}):
            d, p = dec.get((group, 64, 8192)), pre.get((group, 8192, 32768))
            parts = []
            if d is not None:
                parts.append(f"decode 64 x 8k {d[0]:.4f} ms = {d[2]:.1f}% of copy (target >= 80%)" if len(d) == 3
                             else f"decode 64 x 8k {d[0]} ({d[1]})")
            if p is not None:
                parts.append(f"prefill 8k over 32k {p[0]:.4f} ms = {p[2]:.1f}% of matmul (target >= 50%)"
                             if len(p) == 3 else f"prefill 8k over 32k {p[0]} ({p[1]})")
            if parts:
                out.append(f"{label} GQA {group}:1: " + "; ".join(parts))
        bad = [k for k, v in list(dec.items()) + list(pre.items()) if len(v) == 2 and v[0] == "error"]
        if bad:
            out.append(f"{label}: {len(bad)} shapes failed (see table.txt)")
    for r in rows:
        if r[0] == "iteration":
            out.append(f"llama-8b {r[1]}: {r[2]} ms")
    host = {(r[1], r[2]): float(r[3]) for r in rows if r[0] == "hostgraph"}
    for b in sorted({k[0] for k in host}, key=int):
        if (b, "eager") in host and (b, "graphs") in host:
            out.append(f"host us per decode iteration, batch {b}: {host[(b, 'eager')]:.0f} eager, "
                       f"{host[(b, 'graphs')]:.0f} with graphs (goal <= 100 with the Go side)")
    return "\n".join(out) + "\n"


def measured(rows, gpu_name):
    """The twin's measured rates (bridge/twin.Measurements), from the FlashInfer rows."""
    c = ceilings(rows)
    for k in ("copy", "matmul"):
        if k not in c:
            raise SystemExit(f"measured: no {k} ceiling in the benchmark rows")
    pre = [v[1] for k, v in attention(rows, "prefill", "flashinfer").items() if len(v) == 3 and k[1] >= 2048]
    dec = [v[1] for k, v in attention(rows, "decode", "flashinfer").items() if len(v) == 3 and k[2] >= 4096]
    if not pre or not dec:
        raise SystemExit("measured: no FlashInfer prefill rows of chunk >= 2048 or decode rows of context >= 4096")
    iters = {r[1]: float(r[2]) for r in rows if r[0] == "iteration"}
    name = gpu_name.lower().replace(" ", "")
    gpu = next((g for g in ("gb300", "b200", "h200", "h100") if g in name), gpu_name.lower())
    m = {"version": 1, "gpu": gpu,
         "source": f"scripts/device-check.sh on {gpu_name}, {datetime.date.today().isoformat()} "
                   f"(FlashInfer attention rows, cuBLAS GEMMs)",
         "gemm_tflops": c["matmul"], "prefill_attention_tflops": statistics.median(pre),
         "decode_attention_gbps": statistics.median(dec), "gemm_weight_gbps": c["copy"]}
    # The step overhead: llama-8b's "decode 64 x 2k" iteration less its weight
    # reads (bf16, 8.03e9 parameters) at the copy rate and its KV reads (64
    # sequences x 2048 tokens x 32 layers x 8 heads x 128 dims x K,V x 2 bytes)
    # at the decode rate.
    weights, kv = 8.03e9 * 2, 64 * 2048 * 32 * 8 * 128 * 2 * 2
    it = iters.get("decode 64 x 2k")
    if it is None:
        raise SystemExit("measured: no llama-8b 'decode 64 x 2k' iteration row")
    m["step_overhead_ms"] = round(max(0.01, it - weights / (c["copy"] * 1e6) - kv / (m["decode_attention_gbps"] * 1e6)), 3)
    kernel_costs(rows, m)
    return m


def kernel_costs(rows, m):
    """The twin's per-kernel figures from the bench rows gemm, fixed and
    elementwise, where cuda_bench measured them: a 1-token GEMM of llama-8b's
    two shapes is kernel cost + weight bytes / streaming rate (two equations,
    two unknowns); the batch-1 short-KV attention kernels are almost all fixed
    cost; RMSNorm of 1 row is its fixed cost, of 4096 rows its bytes at the
    element-wise rate."""
    gemm = {(int(r[1]), int(r[3])): float(r[4]) for r in rows if r[0] == "gemm"}
    if (1, 6144) in gemm and (1, 28672) in gemm and gemm[(1, 28672)] > gemm[(1, 6144)]:
        b1, b2 = 4096 * 6144 * 2, 4096 * 28672 * 2
        gbps = (b2 - b1) / ((gemm[(1, 28672)] - gemm[(1, 6144)]) * 1e6)
        t0 = gemm[(1, 6144)] - b1 / (gbps * 1e6)
        if t0 > 0:
            m["gemm_weight_gbps"], m["gemm_kernel_ms"] = round(gbps, 1), round(t0, 4)
    fixed = [float(r[2]) for r in rows if r[0] == "fixed"]
    if fixed:
        m["attention_kernel_ms"] = round(min(fixed), 4)
    elem = sorted((int(r[1]), float(r[2]), float(r[3])) for r in rows if r[0] == "elementwise")
    if len(elem) >= 2 and elem[-1][2] > elem[0][2]:
        m["elementwise_kernel_ms"] = round(elem[0][2], 4)
        m["elementwise_gbps"] = round((elem[-1][1] - elem[0][1]) / ((elem[-1][2] - elem[0][2]) * 1e6), 1)


def main(argv):
    if len(argv) < 3 or argv[1] not in ("table", "headline", "measured"):
        sys.exit(__doc__)
    rows = load(argv[2])
    if argv[1] == "table":
        sdpa_path = argv[argv.index("--sdpa") + 1] if "--sdpa" in argv else None
        sys.stdout.write(table(rows, sdpa_rows(sdpa_path)))
    elif argv[1] == "headline":
        sys.stdout.write(headline(rows))
    else:
        if len(argv) != 5:
            sys.exit(__doc__)
        m = measured(rows, argv[4])
        with open(argv[3], "w") as f:
            json.dump(m, f, indent=2)
        print(json.dumps(m))


if __name__ == "__main__":
    main(sys.argv)
