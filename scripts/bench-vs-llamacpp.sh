#!/usr/bin/env bash
# bench-vs-llamacpp.sh: lockstep's CPU engine beside llama.cpp on the same GGUF
# (SmolLM2-135M-Instruct Q4_1, scripts/fetch-model.sh) and the same thread
# counts (issue 31 item 4). llama.cpp is node-llama-cpp 3.22.1's prebuilt CPU
# build from the npm registry (no compiler), installed once into
# $LOCKSTEP_NLC_DIR (default ~/.cache/lockstep/node-llama-cpp).
#
#   scripts/bench-vs-llamacpp.sh [RUNS]      (default 3 runs of each, medians)
#
# Shapes (both engines): prefill of one 512-token prompt, decode of one
# sequence, and decode of 8 sequences together after their 512-token
# prompts; greedy. lockstep's figures are BenchmarkSmolLM2's
# (bridge/native; 32 decode steps, llama.cpp's 128), with the exact and the
# quantised kernels (--cpu-kernels). Run it on a quiet machine: the engines
# run one after the other.
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS="${1:-3}"
export CGO_CFLAGS="${CGO_CFLAGS:--O2 -g -Wno-deprecated-declarations}"
MODEL="$(scripts/fetch-model.sh)"
NLC="${LOCKSTEP_NLC_DIR:-$HOME/.cache/lockstep/node-llama-cpp}"
command -v node >/dev/null || { echo "bench-vs-llamacpp: node (Node.js >= 20) is needed for llama.cpp's build" >&2; exit 1; }
if [ ! -d "$NLC/node_modules/node-llama-cpp" ]; then
  echo "bench-vs-llamacpp: installing node-llama-cpp 3.22.1 into $NLC" >&2
  mkdir -p "$NLC"
  cp scripts/llamacpp/package.json "$NLC/"
  (cd "$NLC" && npm install --no-audit --no-fund --ignore-scripts >&2)
fi
cp scripts/llamacpp/bench.mjs "$NLC/bench.mjs"

make -s native >&2  # the engine library the benchmark links, up to date
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
# The library's hash in the binary (as the Makefile stamps it): go's build
# cache does not look at libengine.a, and would otherwise hand back a test
# binary linked against an older build of it.
go test -tags native -c -ldflags "-X github.com/lockstep-ai/lockstep/bridge/native.EngineLibrary=$(sha256sum build/native/libengine.a | cut -c1-16)" \
  -o "$tmp/native.test" ./bridge/native/ >&2
for r in $(seq "$RUNS"); do
  for t in 1 2; do
    for k in exact quant; do
      echo "bench-vs-llamacpp: run $r, $t thread(s), lockstep $k" >&2
      (cd bridge/native && "$tmp/native.test" -test.run '^$' -test.bench "SmolLM2/kernels=$k/batch=(1|8)/threads=$t\$" \
        -test.benchtime 1x) | awk -v t="$t" -v k="$k" '/^BenchmarkSmolLM2/ {
          split($1, a, "/"); b = a[3]; sub("batch=", "", b)
          for (i = 2; i <= NF; i++) { if ($i == "prefill_tok/s") p[b] = $(i-1); if ($i == "decode_tok/s") d[b] = $(i-1) }
        }
        END { printf("{\"engine\":\"lockstep %s\",\"threads\":%s,\"prefill_tok_s\":%s,\"decode_tok_s\":%s,\"batch8_decode_tok_s\":%s}\n", k, t, p["1"], d["1"], d["8"]) }' >> "$tmp/runs.jsonl"
    done
    echo "bench-vs-llamacpp: run $r, $t thread(s), llama.cpp" >&2
    (cd "$NLC" && node bench.mjs "$MODEL" "$t") >> "$tmp/runs.jsonl"
  done
done
python3 - "$tmp/runs.jsonl" <<'PYEOF'
import json, statistics, sys
runs = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
def med(engine, t, key):
    return statistics.median(r[key] for r in runs if r["engine"] == engine and r["threads"] == t)
print("| threads | measure | lockstep exact | lockstep quant | llama.cpp | exact / llama.cpp | quant / llama.cpp |")
print("|---|---|---|---|---|---|---|")
for t in (1, 2):
    for key, name in (("prefill_tok_s", "prefill tok/s (512-token prompt)"), ("decode_tok_s", "decode tok/s (1 sequence)"),
                      ("batch8_decode_tok_s", "decode tok/s (8 sequences)")):
        a, q, b = med("lockstep exact", t, key), med("lockstep quant", t, key), med("llama.cpp", t, key)
        print(f"| {t} | {name} | {a:.1f} | {q:.1f} | {b:.1f} | {a / b:.2f}× | {q / b:.2f}× |")
n = len(runs) // 6
for k in ("exact", "quant"):
    e = "lockstep " + k
    print(f"\nlockstep {k}, 2 threads / 1 thread (medians of {n} run(s)): prefill "
          f"{med(e, 2, 'prefill_tok_s') / med(e, 1, 'prefill_tok_s'):.2f}×, decode "
          f"{med(e, 2, 'decode_tok_s') / med(e, 1, 'decode_tok_s'):.2f}×, 8 sequences "
          f"{med(e, 2, 'batch8_decode_tok_s') / med(e, 1, 'batch8_decode_tok_s'):.2f}×")
PYEOF
