#!/usr/bin/env python3
"""Writes a Mooncake-format trace shaped like the workload of TensorRT-LLM's
ADP Balance write-up (tech blog 10: mean input 803, mean output 3 653 tokens,
long-tailed), every request at t=0, for the issue 25 comparisons:

    scripts/adp-balance-workload.py N OUT.jsonl [SEED]

Lengths are log-normal (sigma 1.0 for inputs, 0.9 for outputs) with those
means, inputs capped at 16 000 and outputs at 32 000 tokens; hash_ids are
distinct per request (no prefix reuse). Same N and seed, same file.
"""
import json
import math
import random
import sys


def lognormal(rng, mean, sigma):
    mu = math.log(mean) - sigma * sigma / 2
    return max(1, int(rng.lognormvariate(mu, sigma)))


def main():
    if len(sys.argv) not in (3, 4):
        sys.exit(__doc__)
    n, out = int(sys.argv[1]), sys.argv[2]
    rng = random.Random(int(sys.argv[3]) if len(sys.argv) == 4 else 25)
    ins = outs = 0
    with open(out, "w") as f:
        for i in range(n):
            a = min(lognormal(rng, 803, 1.0), 16000)
            b = min(lognormal(rng, 3653, 0.9), 32000)
            ins, outs = ins + a, outs + b
            blocks = [i * 100 + k for k in range((a + 511) // 512)]
            f.write(json.dumps({"timestamp": 0, "input_length": a, "output_length": b, "hash_ids": blocks}) + "\n")
    print(f"{out}: {n} requests, mean input {ins / n:.1f}, mean output {outs / n:.1f}")


if __name__ == "__main__":
    main()
