#!/usr/bin/env bash
# moe-wait-share.sh: the MoE wait share of moe-tiny under `mpirun -np 2`
# (one core per rank) with equal-cost chunking off, then on with kv_cost_offset
# and kv_depth_threshold fitted by `worker calibrate` to the off run's logs.
# The trace (the first LIMIT requests of the Mooncake conversation trace at
# LENGTH_SCALE, all arriving at once) mixes deep and shallow prompts, so one
# rank's deep chunk stretches every MoE layer of the other. Equal-cost
# chunking uses KV_OFFSET and KV_DEPTH_THRESHOLD (default 1000 and 1000:
# what `worker calibrate` recommended for an off run of this workload,
# kv_cost_offset range [769, 1184], depth p50 1087; its fit is noisy on so
# few monopoly spans, so the script prints each run's recommendation in
# calibrate.txt but does not use it).
#
#   scripts/moe-wait-share.sh [OUT_DIR]      (needs bin/worker built with MPI)
#   EXTRA_ARGS=--context-only scripts/moe-wait-share.sh   # prefill only: the chunks equal-cost caps
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-$(mktemp -d)}
mkdir -p "$OUT"
TRACE=${TRACE:-../shared/data/mooncake/conversation_trace.jsonl}
LIMIT=${LIMIT:-120}
LENGTH_SCALE=${LENGTH_SCALE:-0.1}
M=${MAX_NUM_TOKENS:-256}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 TLLM_PROFILE_LOG_RANKS=all
args=(run --model moe-tiny --trace "$TRACE" --limit "$LIMIT" --length-scale "$LENGTH_SCALE" --arrival-scale 0
  --max-num-tokens "$M" --pages 8192 --report json --progress off ${EXTRA_ARGS:-})
run() { # name, extra mpirun -x flags...
  local name=$1
  shift
  mpirun --bind-to core -np 2 -x TLLM_PROFILE_LOG_RANKS "$@" bin/worker "${args[@]}" \
    --iter-log "$OUT/$name.{rank}.jsonl" >"$OUT/$name.json" 2>"$OUT/$name.err"
}
summary() {
  python3 - "$1" "$2" <<'PY'
import json, sys
d = json.load(open(sys.argv[2]))
print(f"{sys.argv[1]:>15}: moe_wait_share {d['moe_wait_share']:.4f}  moe_wait_ms {d['moe_wait_ms']:.0f}  "
      f"device_ms(rank 0) {d['device_ms_per_rank'][0]:.0f}  lockstep_waste {d['lockstep_waste']:.4f}  "
      f"wall_s {d['wall_s']:.1f}  iterations {d['iterations']}  digest {d['output_digest'][:12]}")
PY
}
run off
bin/worker calibrate -max-num-tokens "$M" "$OUT/off.{rank}.jsonl" >"$OUT/calibrate.txt" 2>&1 || true
O=${KV_OFFSET:-1000}
D=${KV_DEPTH_THRESHOLD:-1000}
export TLLM_V2_CTX_COST_KV_OFFSET=$O TLLM_V2_CTX_COST_KV_DEPTH_THRESHOLD=$D
run on -x TLLM_V2_CTX_COST_KV_OFFSET -x TLLM_V2_CTX_COST_KV_DEPTH_THRESHOLD
echo "moe-tiny, mpirun -np 2 --bind-to core, $LIMIT conversation requests x $LENGTH_SCALE, max_num_tokens $M ($OUT)"
summary "equal-cost off" "$OUT/off.json"
summary "equal-cost on (O=$O D=$D)" "$OUT/on.json"
grep -o 'equal-cost=[^ ]*' "$OUT/on.err" | head -1
grep -E '^(kv_cost_offset|kv_depth_threshold)' "$OUT/calibrate.txt" | sed 's/^/calibrate (off run): /'
