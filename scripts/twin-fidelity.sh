#!/usr/bin/env bash
# Fidelity of the digital twin against a real engine (issue 10, item 4).
#
# The CPU engine is a real engine with real timing. This script
#   1. serves a trace on the CPU engine with iteration logs on, twice: a
#      training run (arrivals at TRAIN_ARRIVAL_SCALE) and an evaluation run
#      (ARRIVAL_SCALE), so that the model is judged on steps it was not fitted to,
#   2. fits a linear cost profile of the CPU engine to the training logs
#      (worker twin-profile --fit),
#   3. replays the evaluation run's trace on the twin with that profile
#      (virtual clock),
#   4. prints the errors: the profile's per-iteration device time against
#      every step of the evaluation run (same batches: mean, p50 and p90 of
#      the relative error, and the total), the two runs' device-time
#      distributions, and TTFT / E2E p50 and p90 of the twin against the
#      evaluation run.
# Vidur reports under 9 % error from profiled operator costs; the goal here is
# 10 %. Both runs use the non-overlap loop and one rank, so that the CPU
# engine's time is not shared with other ranks on a small machine.
#
# MODEL=moe-tiny RANKS=2 runs a mixture-of-experts model under expert
# parallelism: the fit and the per-iteration errors use each rank's compute
# (device_ms − moe_wait_ms), and the twin's fleet step is the slowest rank's.
#
#   scripts/twin-fidelity.sh                 # defaults below
#   LIMIT=400 ARRIVAL_SCALE=0.05 scripts/twin-fidelity.sh
#   MODEL=moe-tiny RANKS=2 scripts/twin-fidelity.sh
set -euo pipefail
cd "$(dirname "$0")/.."
TRACE="${TRACE:-../shared/data/mooncake/synthetic_trace.jsonl}"
LIMIT="${LIMIT:-200}"
LENGTH_SCALE="${LENGTH_SCALE:-0.1}"
ARRIVAL_SCALE="${ARRIVAL_SCALE:-0.5}"
TRAIN_ARRIVAL_SCALE="${TRAIN_ARRIVAL_SCALE:-0.2}"
PAGES="${PAGES:-4096}"
MODEL="${MODEL:-tiny}"
RANKS="${RANKS:-1}"
OUT="${OUT:-$(mktemp -d /tmp/twin-fidelity.XXXXXX)}"
mkdir -p "$OUT"
[[ -x bin/worker ]] || make worker >/dev/null
COMMON=(--ranks "$RANKS" --overlap off --model "$MODEL" --pages "$PAGES" --trace "$TRACE" --limit "$LIMIT"
  --length-scale "$LENGTH_SCALE" --progress off --log-level warn)

echo "== CPU engine, training run (real time, --arrival-scale $TRAIN_ARRIVAL_SCALE)"
TLLM_PROFILE_LOG_RANKS=all bin/worker run --engine cpu "${COMMON[@]}" --arrival-scale "$TRAIN_ARRIVAL_SCALE" \
  --report json --iter-log "$OUT/train.{rank}.jsonl" >"$OUT/train.report.json"
echo "== fit"
bin/worker twin-profile --fit --model "$MODEL" "$OUT/train.{rank}.jsonl" >"$OUT/cpu-profile.json"
echo "== CPU engine, evaluation run (real time, --arrival-scale $ARRIVAL_SCALE)"
TLLM_PROFILE_LOG_RANKS=all bin/worker run --engine cpu "${COMMON[@]}" --arrival-scale "$ARRIVAL_SCALE" --report json \
  --iter-log "$OUT/cpu.{rank}.jsonl" --requests-out "$OUT/cpu.requests.jsonl" >"$OUT/cpu.report.json"
echo "== twin with the fitted profile (virtual time, --arrival-scale $ARRIVAL_SCALE)"
TLLM_PROFILE_LOG_RANKS=all bin/worker run --engine twin --cost-profile "$OUT/cpu-profile.json" "${COMMON[@]}" \
  --arrival-scale "$ARRIVAL_SCALE" --report json --iter-log "$OUT/twin.{rank}.jsonl" \
  --requests-out "$OUT/twin.requests.jsonl" >"$OUT/twin.report.json"

python3 - "$OUT" <<'PY'
import json, sys, os
out = sys.argv[1]
def lines(p):
    with open(p) as f:
        return [json.loads(l) for l in f if l.strip()]
def pct(v, q):
    v = sorted(v)
    return v[min(len(v) - 1, int(len(v) * q / 100))] if v else float("nan")
mean = lambda v: sum(v) / len(v)
prof = json.load(open(os.path.join(out, "cpu-profile.json")))
lin = {k: prof["linear"][k]["value"] for k in ("overhead_ms", "token_ms", "ctx_attention_ms", "decode_kv_ms", "seq_ms")}
def predict(r):
    d = 1 if r.get("adp_dummy") else 0
    return (lin["overhead_ms"] + lin["token_ms"] * (r["ctx_tokens"] + r["gen_tokens"] + d) + lin["ctx_attention_ms"] * r["cost_s"]
            + lin["decode_kv_ms"] * (r["gen_kv_tokens"] + d) + lin["seq_ms"] * (r["num_ctx_requests"] + r["num_gen_requests"] + d))
# A MoE rank's own cost is its compute (device_ms less its MoE exchange wait).
def own(r):
    return r["device_ms"] - r.get("moe_wait_ms", 0.0)
steps = [r for r in lines(os.path.join(out, "cpu.0.jsonl")) if r.get("device_ms") and own(r) > 0]
rel = [abs(predict(r) - own(r)) / own(r) for r in steps]
total = sum(predict(r) for r in steps) / sum(own(r) for r in steps) - 1
print(f"\nper-iteration device time of the profile on the evaluation run's {len(steps)} steps (not fitted to them):")
print(f"  relative error mean {100*mean(rel):.1f}%, p50 {100*pct(rel, 50):.1f}%, p90 {100*pct(rel, 90):.1f}%; total device time {100*total:+.1f}%")
cpu_d = [r["device_ms"] for r in steps]  # as measured: a MoE rank's includes its wait
# Under expert parallelism a rank's measured step includes waiting for the
# slowest rank: compare with the twin's fleet step (own + lockstep wait).
moe = any("moe_wait_ms" in r for r in steps)
twin_d = [r["device_ms"] + (r["wait_ms"] if moe else 0) for r in lines(os.path.join(out, "twin.0.jsonl")) if r.get("device_ms")]
rows = [("device ms/iter mean", mean(cpu_d), mean(twin_d)), ("device ms/iter p50", pct(cpu_d, 50), pct(twin_d, 50)),
        ("device ms/iter p90", pct(cpu_d, 90), pct(twin_d, 90))]
lat = []
for k, name in (("ttft_ms", "TTFT"), ("e2e_ms", "E2E")):
    c = [r[k] for r in lines(os.path.join(out, "cpu.requests.jsonl")) if not r.get("error")]
    t = [r[k] for r in lines(os.path.join(out, "twin.requests.jsonl")) if not r.get("error")]
    for q in (50, 90):
        lat.append((f"{name} p{q} ms", pct(c, q), pct(t, q)))
cr, tr = json.load(open(os.path.join(out, "cpu.report.json"))), json.load(open(os.path.join(out, "twin.report.json")))
print(f"\n{'figure':28s} {'cpu engine':>12s} {'twin':>12s} {'error':>8s}")
for name, c, t in rows + lat + [("iterations with a forward", cr["iterations"], tr["iterations"])]:
    print(f"{name:28s} {c:12.3f} {t:12.3f} {(t - c) / c * 100:+7.1f}%")
worst = max(abs((t - c) / c * 100) for _, c, t in lat)
print(f"\nworst TTFT/E2E error: {worst:.1f}% (goal 10%, Vidur: under 9%); "
      f"per-iteration device time: mean {100*mean(rel):.1f}%, total {100*total:+.1f}%; files in {out}")
PY
