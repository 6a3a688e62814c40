#!/usr/bin/env bash
# Fidelity of the digital twin against a real engine (issue 10, item 4).
#
# The CPU engine is a real engine with real timing. This script
#   1. serves a trace on the CPU engine with iteration logs on,
#   2. fits a linear cost profile of the CPU engine to those logs
#      (worker twin-profile --fit),
#   3. replays the same trace on the twin with that profile (virtual clock),
#   4. prints the twin's error against the CPU run: per-iteration device time
#      (mean, p50, p90 over iterations with a forward) and TTFT / E2E p50 and
#      p90 over requests.
# Vidur reports under 9 % error from profiled operator costs; the goal here is
# 10 %. Both runs use the non-overlap loop and one rank, so that the CPU
# engine's time is not shared with other ranks on a small machine.
#
#   scripts/twin-fidelity.sh                 # defaults below
#   LIMIT=400 ARRIVAL_SCALE=0.05 scripts/twin-fidelity.sh
set -euo pipefail
cd "$(dirname "$0")/.."
TRACE="${TRACE:-../shared/data/mooncake/synthetic_trace.jsonl}"
LIMIT="${LIMIT:-300}"
LENGTH_SCALE="${LENGTH_SCALE:-0.02}"
ARRIVAL_SCALE="${ARRIVAL_SCALE:-0.1}"
PAGES="${PAGES:-4096}"
OUT="${OUT:-$(mktemp -d /tmp/twin-fidelity.XXXXXX)}"
mkdir -p "$OUT"
[[ -x bin/worker ]] || make worker >/dev/null
COMMON=(--ranks 1 --overlap off --model tiny --pages "$PAGES" --trace "$TRACE" --limit "$LIMIT"
  --length-scale "$LENGTH_SCALE" --arrival-scale "$ARRIVAL_SCALE" --progress off --log-level warn)

echo "== CPU engine (real time)"
TLLM_PROFILE_LOG_RANKS=all bin/worker run --engine cpu "${COMMON[@]}" --report json \
  --iter-log "$OUT/cpu.{rank}.jsonl" --requests-out "$OUT/cpu.requests.jsonl" >"$OUT/cpu.report.json"
echo "== fit"
bin/worker twin-profile --fit --model tiny "$OUT/cpu.{rank}.jsonl" >"$OUT/cpu-profile.json"
echo "== twin with the fitted profile (virtual time)"
TLLM_PROFILE_LOG_RANKS=all bin/worker run --engine twin --cost-profile "$OUT/cpu-profile.json" "${COMMON[@]}" \
  --report json --iter-log "$OUT/twin.{rank}.jsonl" --requests-out "$OUT/twin.requests.jsonl" >"$OUT/twin.report.json"

python3 - "$OUT" <<'PY'
import json, sys, os
out = sys.argv[1]
def lines(p):
    with open(p) as f:
        return [json.loads(l) for l in f if l.strip()]
def pct(v, q):
    v = sorted(v)
    return v[min(len(v) - 1, int(len(v) * q / 100))] if v else float("nan")
def dev(p):
    return [r["device_ms"] for r in lines(p) if r.get("device_ms")]
def lat(p, k):
    return [r[k] for r in lines(p) if not r.get("error")]
cpu_d, twin_d = dev(os.path.join(out, "cpu.0.jsonl")), dev(os.path.join(out, "twin.0.jsonl"))
rows = []
mean = lambda v: sum(v) / len(v)
rows.append(("device ms/iter mean", mean(cpu_d), mean(twin_d)))
rows.append(("device ms/iter p50", pct(cpu_d, 50), pct(twin_d, 50)))
rows.append(("device ms/iter p90", pct(cpu_d, 90), pct(twin_d, 90)))
for k, name in (("ttft_ms", "TTFT"), ("e2e_ms", "E2E")):
    c, t = lat(os.path.join(out, "cpu.requests.jsonl"), k), lat(os.path.join(out, "twin.requests.jsonl"), k)
    for q in (50, 90):
        rows.append((f"{name} p{q} ms", pct(c, q), pct(t, q)))
cr, tr = json.load(open(os.path.join(out, "cpu.report.json"))), json.load(open(os.path.join(out, "twin.report.json")))
rows.append(("iterations with a forward", cr["iterations"], tr["iterations"]))
print(f"\n{'figure':28s} {'cpu engine':>12s} {'twin':>12s} {'error':>8s}")
worst = 0.0
for name, c, t in rows:
    err = (t - c) / c * 100 if c else float("nan")
    if "ms" in name:
        worst = max(worst, abs(err))
    print(f"{name:28s} {c:12.3f} {t:12.3f} {err:+7.1f}%")
print(f"\nworst latency/device-time error: {worst:.1f}% (goal 10%); files in {out}")
PY
