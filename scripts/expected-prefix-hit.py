#!/usr/bin/env python3
"""Expected prefix-reuse hit rate of a Mooncake trace, from its hash_ids alone.

Mirrors `worker run --length-scale F` (workload/synth.go): every block but the
last has round(512*F) tokens, the last keeps its scaled partial length. A
request can reuse the longest chain of full blocks that an earlier request
already had (equal hash ids at equal positions carry equal tokens), never its
last prompt token. This is the figure a single rank reaches when the KV pool
holds everything and its page size equals the scaled block size; smaller
pools (LRU eviction), pages that do not align with trace blocks, and requests
spread over several attention-DP ranks reach less.

usage: expected-prefix-hit.py TRACE.jsonl LIMIT LENGTH_SCALE
"""
import json
import math
import sys


def rnd(x):  # Go's math.Round: half away from zero
    return int(math.floor(x + 0.5))


def main():
    path, limit, f = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    reqs = []
    with open(path) as fh:
        for line in fh:
            if line.strip():
                reqs.append(json.loads(line))
            if len(reqs) == limit:
                break
    bt = max(1, rnd(512 * f))
    seen, partial, prompt, reused = set(), {}, 0, 0
    for r in reqs:
        h, n = r["hash_ids"], len(r["hash_ids"])
        last = min(max(1, rnd((r["input_length"] - 512 * (n - 1)) * f)), bt)
        plen = bt * (n - 1) + last
        full = n if last == bt else n - 1
        m = 0
        while m < full and tuple(h[: m + 1]) in seen:
            m += 1
        tokens = m * bt
        if m < n:
            own = bt if m < n - 1 else last
            tokens += min(partial.get(tuple(h[: m + 1]), 0), own)
        prompt += plen
        reused += min(tokens, plen - 1)
        for k in range(1, full + 1):
            seen.add(tuple(h[:k]))
        if full < n:
            key = tuple(h)
            partial[key] = max(partial.get(key, 0), last)
    print(json.dumps({"block_tokens": bt, "prompt_tokens": prompt, "reusable_tokens": reused,
                      "hit_rate": round(reused / prompt, 4)}))


if __name__ == "__main__":
    main()
