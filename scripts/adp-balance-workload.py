#!/usr/bin/env python3
"""Writes a Mooncake-format trace shaped like the workload of TensorRT-LLM's
ADP Balance write-up (tech blog 10: mean input 803, mean output 3 653 tokens,
long-tailed), every request at t=0, for the issue 25 comparisons:

    scripts/adp-balance-workload.py N OUT.jsonl [SEED] [MAX_INPUT] [MAX_OUTPUT]

Lengths are log-normal (sigma 1.0 for inputs, 0.9 for outputs) with those
means, inputs capped at MAX_INPUT (default 16 000) and outputs at MAX_OUTPUT
(default 32 000) tokens. With other caps than the defaults a longer draw is
drawn again from a law whose location is moved so that the truncated mean is
still 803 and 3 653 tokens. hash_ids are distinct per request (no prefix reuse). Same
arguments, same file.
"""
import json
import math
import random
import sys


def lognormal(rng, mean, sigma):
    mu = math.log(mean) - sigma * sigma / 2
    return max(1, int(rng.lognormvariate(mu, sigma)))


def phi(x):
    return 0.5 * (1 + math.erf(x / math.sqrt(2)))


def truncated_mean(mu, sigma, cap):
    """E[X | X <= cap] of a log-normal X of location mu and scale sigma."""
    z = (math.log(cap) - mu) / sigma
    return math.exp(mu + sigma * sigma / 2) * phi(z - sigma) / phi(z)


def location_for(mean, sigma, cap):
    """The location whose law, truncated at cap, has the given mean."""
    lo, hi = math.log(mean) - 10, math.log(cap)
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if truncated_mean(mid, sigma, cap) < mean else (lo, mid)
    return lo


def capped(rng, mean, sigma, cap, legacy):
    """A log-normal length of the given mean, at most cap. With the default
    caps (legacy) a longer draw is clipped, as in the files measured before
    the caps were arguments; otherwise the law is truncated at cap (a longer
    draw is drawn again) with its location moved to keep the mean."""
    if legacy:
        return min(lognormal(rng, mean, sigma), cap)
    mu = location_for(mean, sigma, cap)
    while True:
        x = max(1, int(rng.lognormvariate(mu, sigma)))
        if x <= cap:
            return x


def main():
    if len(sys.argv) not in (3, 4, 5, 6):
        sys.exit(__doc__)
    n, out = int(sys.argv[1]), sys.argv[2]
    rng = random.Random(int(sys.argv[3]) if len(sys.argv) >= 4 else 25)
    max_in = int(sys.argv[4]) if len(sys.argv) >= 5 else 16000
    max_out = int(sys.argv[5]) if len(sys.argv) >= 6 else 32000
    if max_in < 1 or max_out < 1:
        sys.exit(f"adp-balance-workload: MAX_INPUT and MAX_OUTPUT must be at least 1, got {max_in} and {max_out}")
    legacy = (max_in, max_out) == (16000, 32000)
    ins = outs = 0
    with open(out, "w") as f:
        for i in range(n):
            a = capped(rng, 803, 1.0, max_in, legacy)
            b = capped(rng, 3653, 0.9, max_out, legacy)
            ins, outs = ins + a, outs + b
            blocks = [i * 100 + k for k in range((a + 511) // 512)]
            f.write(json.dumps({"timestamp": 0, "input_length": a, "output_length": b, "hash_ids": blocks}) + "\n")
    print(f"{out}: {n} requests, mean input {ins / n:.1f}, mean output {outs / n:.1f}")


if __name__ == "__main__":
    main()
