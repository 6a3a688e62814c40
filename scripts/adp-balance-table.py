#!/usr/bin/env python3
"""The ADP Balance table of issue 25 on the twin, as one command.

Writes the blog-shaped workload (scripts/adp-balance-workload.py), then runs
DeepSeek-V3 on 8 B200 ranks, every request at once, for each balancing mode
(none, ADP Balance, cost leveling, both) with the twin's attention-DP
coupling off and on (docs/twin.md, "Attention DP: CUDA graphs and MoE
padding"), and prints one Markdown table: output tokens/s and its ratio to
the baseline of the same coupling, the token balance (per-iteration mean
and time-weighted), the time balance, TTFT p50, TPOT p50 and preemptions.

usage: scripts/adp-balance-table.py [--requests N] [--policy P] [--worker BIN] [--fp8]
                                    [--modes none,balance,...] [--coupling off,on]
                                    [--max-input N] [--max-output N]

--fp8 runs FP8 weights and KV (--weight-dtype fp8 --kv-dtype fp8): a B200 rank
then holds 256 requests of this workload (batch-bound, as the write-up's FP4
GB200 run), not about 125 (KV-bound).

--max-input and --max-output cap the workload's lengths (scripts/adp-balance-workload.py:
the law is truncated with its means kept; the defaults, 16 000 and 32 000, clip).

Run from the repository root after `make worker`. 16 000 requests (the
blog's count) take about a minute of CPU per run under
guaranteed_no_evict, two under max_utilization.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

MODES = {
    "none": [],
    "balance": ["--attention-dp-balance"],
    "leveling": ["--attention-dp-cost-leveling"],
    "both": ["--attention-dp-balance", "--attention-dp-cost-leveling"],
}
COUPLING = {
    "off": [],
    "on": ["--twin-cuda-graph", "fleet", "--twin-cuda-graph-max-batch-size", "256", "--twin-moe-dp-padding"],
}


def run(worker, trace, policy, extra, fp8=False):
    cmd = [worker, "run", "--engine", "twin", "--gpu", "b200", "--model", "deepseek-v3", "--ranks", "8",
           "--pages", "0", "--max-batch-size", "256", "--max-num-tokens", "8192", "--policy", policy,
           "--trace", trace, "--arrival-scale", "0", "--report", "json", "--progress", "off",
           "--log-level", "warn"] + (["--weight-dtype", "fp8", "--kv-dtype", "fp8"] if fp8 else []) + extra
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return cmd, json.loads(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=16000)
    ap.add_argument("--policy", default="guaranteed_no_evict", choices=["guaranteed_no_evict", "max_utilization"])
    ap.add_argument("--worker", default="bin/worker")
    ap.add_argument("--modes", default="none,balance,leveling,both")
    ap.add_argument("--coupling", default="off,on")
    ap.add_argument("--seed", type=int, default=25)
    ap.add_argument("--fp8", action="store_true", help="FP8 weights and KV cache")
    ap.add_argument("--max-input", type=int, default=16000, help="longest prompt of the workload")
    ap.add_argument("--max-output", type=int, default=32000, help="longest output of the workload")
    a = ap.parse_args()
    modes, couplings = a.modes.split(","), a.coupling.split(",")
    for m in modes:
        if m not in MODES:
            sys.exit(f"--modes: unknown mode {m!r} (allowed: {', '.join(MODES)})")
    for c in couplings:
        if c not in COUPLING:
            sys.exit(f"--coupling: unknown value {c!r} (allowed: off, on)")
    if not os.access(a.worker, os.X_OK):
        sys.exit(f"--worker {a.worker}: not an executable (run `make worker` first)")
    here = os.path.dirname(os.path.abspath(__file__))
    with tempfile.TemporaryDirectory() as tmp:
        trace = os.path.join(tmp, "workload.jsonl")
        caps = [str(a.max_input), str(a.max_output)]
        subprocess.run([sys.executable, os.path.join(here, "adp-balance-workload.py"), str(a.requests), trace,
                        str(a.seed)] + caps, check=True, stdout=subprocess.DEVNULL)
        print(f"DeepSeek-V3, 8 × B200 (twin), {a.requests} requests at once "
              f"(scripts/adp-balance-workload.py {a.requests} W.jsonl {a.seed} {' '.join(caps)}), --policy {a.policy}"
              f"{', FP8 weights and KV' if a.fp8 else ''}\n")
        print("| coupling | mode | output tok/s | × baseline | token balance (iter / time-weighted) | time balance "
              "| TTFT p50 (s) | TPOT p50 (ms) | preemptions | digest |")
        print("|---|---|---|---|---|---|---|---|---|---|")
        for c in couplings:
            base = None
            for m in modes:
                _, r = run(a.worker, trace, a.policy, COUPLING[c] + MODES[m], a.fp8)
                b = r["balance"]
                tps = r["output_tokens_per_s"]
                if m == "none":
                    base = tps
                ratio = f"{tps / base:.3f}×" if base else "–"
                tw = b["sol_forward_s"] / b["forward_s"] if b.get("forward_s") else 0
                pre = r.get("preemptions") or {}
                print(f"| {c} | {m} | {tps:,.0f} | {ratio} | {b['token_ratio']:.3f} / {tw:.3f} | {b['time_ratio']:.3f} "
                      f"| {r['ttft_ms']['p50'] / 1e3:,.1f} | {r['tpot_ms']['p50']:.1f} "
                      f"| {pre.get('recompute', 0) + pre.get('suspended', 0):,} | {r['output_digest'][:8]} |", flush=True)
        print("\nCoupling on: " + " ".join(COUPLING["on"]))


if __name__ == "__main__":
    main()
