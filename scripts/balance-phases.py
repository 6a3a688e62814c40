#!/usr/bin/env python3
"""Token balance of an attention-DP run by phase, from every rank's iteration log.

    scripts/balance-phases.py 'DIR/il_{rank}.jsonl' [RANKS]

Reads the per-rank iteration logs a run wrote with TLLM_PROFILE_LOG_RANKS=all and
--iter-log 'DIR/il_{rank}.jsonl' (docs/multi-rank.md, "Logs"), lines up the ranks'
records by iteration, and prints the token balance ratio (per iteration, mean/max over
the ranks of ctx_tokens + gen_tokens, averaged over the iterations where some rank had
a token; the report's balance.token_ratio) over:

  * the whole run;
  * the prompt window: from the first to the last iteration in which some rank ran a
    context chunk (TensorRT-LLM's ADP Balance write-up plots this window: "after
    iteration 12,000, all requests transition to generation phase");
  * each fifth of the iterations, with the share of iterations that ran a context,
    the ranks with a context in those, and the mean / least / most generations a rank.

RANKS defaults to the number of files that exist for 0, 1, 2, ...
"""
import json
import os
import sys


def main():
    if len(sys.argv) not in (2, 3) or "{rank}" not in sys.argv[1]:
        sys.exit(__doc__)
    pattern = sys.argv[1]
    if len(sys.argv) == 3:
        try:
            ranks = int(sys.argv[2])
        except ValueError:
            sys.exit(f"RANKS must be a whole number, got {sys.argv[2]!r}")
        missing = [r for r in range(ranks) if not os.path.exists(pattern.replace("{rank}", str(r)))]
        if missing:
            sys.exit(f"{pattern}: no log for rank {missing[0]} of the {ranks} given")
    else:
        ranks = 0
        while os.path.exists(pattern.replace("{rank}", str(ranks))):
            ranks += 1
    if ranks < 2:
        sys.exit(f"{pattern}: {ranks} rank log(s); the balance needs two or more")
    files = [open(pattern.replace("{rank}", str(r))) for r in range(ranks)]
    bal, ctx_ranks, gens = [], [], []
    for n, lines in enumerate(zip(*files)):
        recs = [json.loads(l) for l in lines]
        if len({r["iter"] for r in recs}) != 1:
            sys.exit(f"record {n}: the ranks' logs disagree on the iteration ({sorted({r['iter'] for r in recs})})")
        toks = [r["ctx_tokens"] + r["gen_tokens"] for r in recs]
        bal.append(sum(toks) / ranks / max(toks) if max(toks) > 0 else None)
        ctx_ranks.append(sum(1 for r in recs if r["ctx_tokens"] > 0))
        gens.append([r["num_gen_requests"] for r in recs])
    for r, f in enumerate(files):
        if f.readline():
            sys.exit(f"{pattern}: rank {r}'s log has more records than another rank's (a log cut short?)")
    n = len(bal)
    if n == 0:
        sys.exit(f"{pattern}: no records")

    def mean(idx):
        v = [bal[i] for i in idx if bal[i] is not None]
        return sum(v) / len(v) if v else float("nan")

    print(f"{ranks} ranks, {n} iterations")
    print(f"whole run: token balance {mean(range(n)):.3f}")
    ctx = [i for i in range(n) if ctx_ranks[i] > 0]
    if ctx:
        a, b = ctx[0], ctx[-1]
        print(f"prompt window (iterations {a}-{b}, {b - a + 1} of {n}): token balance {mean(range(a, b + 1)):.3f}")
    else:
        print("prompt window: no iteration ran a context chunk")
    print("fifth  balance  iters with ctx  ranks with ctx  generations a rank: mean / least / most")
    for q in range(5):
        idx = range(q * n // 5, (q + 1) * n // 5)
        if len(idx) == 0:
            continue
        with_ctx = [i for i in idx if ctx_ranks[i] > 0]
        share = len(with_ctx) / len(idx)
        per = sum(ctx_ranks[i] for i in with_ctx) / len(with_ctx) if with_ctx else 0
        g = [sum(gens[i]) / ranks for i in idx]
        lo = [min(gens[i]) for i in idx]
        hi = [max(gens[i]) for i in idx]
        print(f"{q + 1:>5}  {mean(idx):7.3f}  {share:14.2f}  {per:14.2f}  "
              f"{sum(g) / len(g):.0f} / {sum(lo) / len(lo):.0f} / {sum(hi) / len(hi):.0f}")


if __name__ == "__main__":
    main()
