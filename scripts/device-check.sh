#!/usr/bin/env bash
# Device check for an H200 (or any sm_90 GPU) machine, in one command of at
# most 8 minutes: builds the engine and the CUDA tests there with the
# machine's nvcc, runs the kernel, decode-graph and end-to-end tests (the tiny preset
# through engine.h, and SmolLM2 on the CUDA engine against the CPU engine
# through bin/worker), measures the card's two ceilings (copy bandwidth, bf16
# matmul), the attention tables beside PyTorch SDPA (naming the SDPA backend
# that ran), a llama-8b iteration table, host time per decode iteration with
# and without CUDA graphs, and a measured cost profile for the
# twin. The last lines are a one-screen summary.
#
# Failing loudly is the point: every failure -- a test's non-zero exit, a
# signal (a kernel fault aborts the process), a timeout, a FAIL or SKIP line,
# or any unexpected command failure of this script -- prints
# "DEVICE-CHECK FAILED: ..." naming what failed and exits non-zero
# (scripts/test-device-check.sh checks this with a fake test binary).
#
# Outputs: exactly two files in $OUT (the device machine returns at most 8):
#   $OUT/device-check.tar.gz   every log, bench.tsv, the table, measured.json
#   $OUT/summary.txt           the one-screen summary (also printed last)
# Without $OUT they go to $BUILD_DIR/out.
#
# The machine has no Go and no network: CUDA 13 nvcc, CMake, ninja and a
# python3 with PyTorch (whose nvidia-* wheels provide cuBLAS and NCCL). What
# it needs from elsewhere is carried with the tree (scripts/pack-device-carry.sh
# packs the first two into device-carry/, unpacked below):
#   FlashInfer headers  $LOCKSTEP_CUDA_HOME/flashinfer (scripts/install-cuda.sh
#                       --headers-only on a machine with network), or
#                       LOCKSTEP_FLASHINFER_ROOT pointing at that directory
#   bin/worker          the Go worker built against a CUDA libengine
#                       (for the SmolLM2 check and the twin profile)
#   the SmolLM2 GGUF    MODEL_GGUF (default: ~/.cache/lockstep/models/...)
#
#   scripts/device-check.sh            # everything
#   FULL=0 scripts/device-check.sh     # skip the long kernel cases (--full)
#   SMOLLM2=0 ...                      # do not require the SmolLM2 check
#   SKIP_BUILD=1 BUILD_DIR=...         # reuse a build (used by the script's test)
set -Eeuo pipefail
cd "$(dirname "$0")/.."
START=$SECONDS
BUILD_DIR="${BUILD_DIR:-build-device}"
OUT_DIR="${OUT:-$BUILD_DIR/out}"
LOGS="$BUILD_DIR/device-check-logs"
FULL="${FULL:-1}"
SMOLLM2="${SMOLLM2:-1}"
PY="${PYTHON:-python3}"
TEST_TIMEOUT="${TEST_TIMEOUT:-300}"
MODEL_GGUF="${MODEL_GGUF:-$HOME/.cache/lockstep/models/SmolLM2-135M-Instruct.Q4_1.gguf}"
rm -rf "$LOGS"
mkdir -p "$LOGS" "$OUT_DIR"
SUMMARY="$LOGS/summary.txt"
: >"$SUMMARY"
CURRENT="setup"
DEFERRED=()  # failures that let the measurements still run; reported at the end

summary() { echo "$*" >>"$SUMMARY"; }
step() {
  CURRENT="$*"
  echo "== [$((SECONDS - START))s] $*"
}
fail() {
  echo "DEVICE-CHECK FAILED: $*" >&2
  summary "FAILED: $*"
  exit 1
}
# Any command that fails outside a handled branch lands here (set -E makes
# functions and subshells inherit the trap), so no failure exits silently.
on_err() {
  local rc=$1 line=$2 cmd=$3
  trap - ERR
  fail "unexpected failure (exit status $rc) in step '$CURRENT', line $line: $cmd"
}
trap 'on_err $? $LINENO "$BASH_COMMAND"' ERR
# On every exit: archive the logs, write the summary beside it, print it last.
on_exit() {
  local rc=$?
  trap - ERR EXIT
  set +e
  if ((rc == 0)); then
    summary "RESULT: PASS in $((SECONDS - START))s"
  else
    grep -q '^FAILED' "$SUMMARY" || summary "FAILED: exit status $rc in step '$CURRENT'"
    summary "RESULT: FAIL (exit status $rc) in $((SECONDS - START))s"
  fi
  tar -czf "$OUT_DIR/device-check.tar.gz" -C "$LOGS" . 2>/dev/null ||
    echo "device-check: could not write $OUT_DIR/device-check.tar.gz" >&2
  cp "$SUMMARY" "$OUT_DIR/summary.txt"
  echo
  echo "==== device-check summary ($OUT_DIR/summary.txt; logs in device-check.tar.gz)"
  cat "$SUMMARY"
  exit "$rc"
}
trap on_exit EXIT

# Why a command's exit status rc means failure, in words.
describe_exit() {
  local rc=$1 limit=$2
  if ((rc == 124)); then echo "timed out after ${limit}s"
  elif ((rc == 137)); then echo "killed (SIGKILL: timeout or out of memory)"
  elif ((rc > 128)); then echo "killed by signal $((rc - 128)) (SIG$(kill -l $((rc - 128)) 2>/dev/null || echo '?'))"
  else echo "exit status $rc"
  fi
}

step "device"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader >"$LOGS/device.txt" 2>&1 ||
  { cat "$LOGS/device.txt"; fail "nvidia-smi found no GPU"; }
cat "$LOGS/device.txt"
summary "device: $(head -n 1 "$LOGS/device.txt")"
NVCC="${CUDACXX:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}"
[[ -x "$NVCC" ]] || fail "no nvcc (set CUDACXX)"
"$NVCC" --version | tail -n 2

# cuBLAS and NCCL: the toolkit's if present, else PyTorch's nvidia wheels.
NV_SITE="$("$PY" -c 'import nvidia, os; print(os.path.dirname(list(nvidia.__path__)[0]) + "/nvidia")' 2>/dev/null || true)"
LIB_HINTS="" INC_HINTS="" NCCL_ROOT=""
if [[ -n "$NV_SITE" && -d "$NV_SITE" ]]; then
  for lib in libcublas.so.* libcublasLt.so.* libcudart.so.* libnccl.so.*; do
    f="$(find "$NV_SITE" -name "$lib" -print -quit 2>/dev/null || true)"
    if [[ -n "$f" ]]; then LIB_HINTS="$LIB_HINTS;$(dirname "$f")"; fi
  done
  for h in cublas_v2.h nccl.h; do
    f="$(find "$NV_SITE" -name "$h" -print -quit 2>/dev/null || true)"
    if [[ -n "$f" ]]; then INC_HINTS="$INC_HINTS;$(dirname "$f")"; fi
  done
  f="$(find "$NV_SITE" -name 'libnccl.so.*' -print -quit 2>/dev/null || true)"
  if [[ -n "$f" ]]; then NCCL_ROOT="$(dirname "$(dirname "$f")")"; fi
fi
LIB_HINTS="${LIB_HINTS#;}"
INC_HINTS="${INC_HINTS#;}"
echo "library hints: ${LIB_HINTS:-none}; NCCL: ${NCCL_ROOT:-toolkit}"
export LD_LIBRARY_PATH="${LIB_HINTS//;/:}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

# What scripts/pack-device-carry.sh packed on a machine with network and Go
# (carry "device-carry"; CARRY_DIR overrides): the FlashInfer headers and
# bin/worker, unpacked with python3's lzma unless the caller provides them.
CARRY_DIR="${CARRY_DIR:-device-carry}"
if [[ -d "$CARRY_DIR" ]]; then
  step "unpack device-carry"
  if [[ -z "${LOCKSTEP_FLASHINFER_ROOT:-}" && -f "$CARRY_DIR/flashinfer-headers.tar.xz" ]]; then
    mkdir -p "$BUILD_DIR/carry"
    "$PY" -c 'import sys, tarfile; tarfile.open(sys.argv[1], "r:xz").extractall(sys.argv[2])' \
      "$CARRY_DIR/flashinfer-headers.tar.xz" "$BUILD_DIR/carry" || fail "could not unpack $CARRY_DIR/flashinfer-headers.tar.xz"
    LOCKSTEP_FLASHINFER_ROOT="$(cd "$BUILD_DIR/carry/flashinfer" && pwd)"
    export LOCKSTEP_FLASHINFER_ROOT
  fi
  if [[ ! -x bin/worker && -f "$CARRY_DIR/worker.xz" ]]; then
    mkdir -p bin
    "$PY" -c 'import lzma, sys; open(sys.argv[2], "wb").write(lzma.open(sys.argv[1]).read())' \
      "$CARRY_DIR/worker.xz" bin/worker || fail "could not unpack $CARRY_DIR/worker.xz"
    chmod +x bin/worker
    (cd bin && sha256sum -c "$OLDPWD/$CARRY_DIR/SHA256SUMS" >/dev/null) ||
      fail "bin/worker unpacked from $CARRY_DIR/worker.xz does not match $CARRY_DIR/SHA256SUMS"
  fi
  summary "carried: FlashInfer headers ${LOCKSTEP_FLASHINFER_ROOT:-none}, bin/worker $([[ -x bin/worker ]] && echo yes || echo no)"
fi

if [[ "${SKIP_BUILD:-0}" != 1 ]]; then
  step "build (sm_90)"
  FI_ROOT="${LOCKSTEP_FLASHINFER_ROOT:-${LOCKSTEP_CUDA_HOME:-/opt/lockstep-cuda}/flashinfer}"
  [[ -f "$FI_ROOT/include/flashinfer/attention/decode.cuh" ]] ||
    fail "no FlashInfer headers at $FI_ROOT (run scripts/install-cuda.sh --headers-only where there is network and carry the directory; set LOCKSTEP_FLASHINFER_ROOT)"
  cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release -DENGINE_CUDA=ON -DENGINE_NCCL=ON \
    -DCMAKE_CUDA_COMPILER="$NVCC" -DLOCKSTEP_FLASHINFER_ROOT="$FI_ROOT" \
    "-DLOCKSTEP_CUDA_LIB_HINTS=$LIB_HINTS" "-DLOCKSTEP_CUDA_INCLUDE_HINTS=$INC_HINTS" \
    ${NCCL_ROOT:+-DLOCKSTEP_NCCL_ROOT=$NCCL_ROOT} \
    "-DLOCKSTEP_CUDA_GENCODE=-gencode=arch=compute_90a,code=sm_90a" >"$LOGS/configure.log" 2>&1 ||
    { tail -n 30 "$LOGS/configure.log"; fail "cmake configure (log: configure.log)"; }
  cmake --build "$BUILD_DIR" -j "$(nproc)" >"$LOGS/build.log" 2>&1 ||
    { tail -n 40 "$LOGS/build.log"; fail "build (log: build.log)"; }
  summary "build: ok ($((SECONDS - START))s)"
fi

# Runs a test binary; fails loudly on a non-zero exit (with or without a FAIL
# line: a kernel fault aborts before any is printed), a signal, a timeout, a
# FAIL line, or a SKIP line (a device machine must have a device).
run_test() {
  local name="$1"; shift
  local exe="$BUILD_DIR/cuda/tests/$name" tag="$name${1:+ $*}"
  local log="$LOGS/$name${1:+${*//[^a-z]/}}.log"
  step "test $tag"
  [[ -x "$exe" ]] || fail "$tag: test binary $exe is missing (build incomplete?)"
  local rc=0 t0=$SECONDS
  timeout --kill-after=10 "$TEST_TIMEOUT" "$exe" "$@" >"$log" 2>&1 || rc=$?
  if ((rc != 0)); then
    echo "--- last lines of $(basename "$log"):" >&2
    tail -n 25 "$log" >&2 || true
    local nfail
    nfail="$(grep -c '^FAIL' "$log" || true)"
    fail "$tag: $(describe_exit "$rc" "$TEST_TIMEOUT")${nfail:+, $nfail FAIL lines}$([[ "$nfail" == 0 ]] && echo ' (no FAIL line: crashed or aborted)')"
  fi
  if grep -q '^SKIP' "$log"; then
    cat "$log" >&2
    fail "$tag skipped: no CUDA device visible on the device machine"
  fi
  if grep -q '^FAIL' "$log"; then
    grep -m 20 '^FAIL' "$log" >&2 || true
    fail "$tag reported failures (exit status 0 but FAIL lines)"
  fi
  summary "PASS $tag ($((SECONDS - t0))s): $(tail -n 1 "$log")"
}
run_test cuda_kernels_test
run_test cuda_e2e_test
run_test cuda_graphs_test
if [[ -x "$BUILD_DIR/cuda/tests/cuda_nccl_test" || "${SKIP_BUILD:-0}" != 1 ]]; then run_test cuda_nccl_test; fi

# SmolLM2-135M (GGUF) on the CUDA engine against the CPU engine, greedy, through
# the worker: the fraction of generated tokens before each prompt's first
# divergence. Needs bin/worker (no Go here) and the model (no network here).
smollm2_check() {
  step "SmolLM2 CUDA vs CPU (greedy)"
  if [[ ! -x bin/worker ]]; then DEFERRED+=("SmolLM2 check: bin/worker was not carried (build it with a CUDA libengine)"); return; fi
  if [[ ! -f "$MODEL_GGUF" ]]; then DEFERRED+=("SmolLM2 check: no model at $MODEL_GGUF (carry it; set MODEL_GGUF)"); return; fi
  local prompts="$LOGS/smollm2-prompts.jsonl"
  "$PY" - "$prompts" <<'PY'
import json, sys
texts = ["The capital of France is", "def fibonacci(n):", "Photosynthesis is the process by which",
         "Once upon a time, in a small village,", "The three laws of thermodynamics are",
         "In 1969, the first humans", "A good night's sleep helps", "To make a cup of tea, first"]
with open(sys.argv[1], "w") as f:
    for t in texts: f.write(json.dumps({"prompt": t, "max_tokens": 48}) + "\n")
PY
  local engine rc
  for engine in cpu cuda; do
    rc=0
    timeout 180 bin/worker run --engine "$engine" --model "$MODEL_GGUF" --prompts "$prompts" --pages 512 \
      --requests-out "$LOGS/smollm2-$engine.jsonl" --report json >"$LOGS/smollm2-$engine.log" 2>&1 || rc=$?
    if ((rc != 0)); then
      tail -n 15 "$LOGS/smollm2-$engine.log" >&2 || true
      fail "SmolLM2 on the $engine engine: $(describe_exit "$rc" 180) (log: smollm2-$engine.log)"
    fi
  done
  "$PY" - "$LOGS/smollm2-cpu.jsonl" "$LOGS/smollm2-cuda.jsonl" >"$LOGS/smollm2-agreement.txt" <<'PY' ||
import json, sys
load = lambda p: {r["index"]: r["output"] for r in map(json.loads, open(p))}
cpu, gpu = load(sys.argv[1]), load(sys.argv[2])
same = total = 0
for i, ref in sorted(cpu.items()):
    out = gpu.get(i, [])
    n = next((k for k, (a, b) in enumerate(zip(ref, out)) if a != b), min(len(ref), len(out)))
    same += n; total += len(ref)
    print(f"prompt {i}: {n}/{len(ref)} tokens equal before the first divergence")
pct = 100.0 * same / max(total, 1)
print(f"agreement {pct:.1f}% ({same}/{total} tokens before each prompt's first divergence)")
sys.exit(0 if pct >= 90.0 else 1)
PY
    { cat "$LOGS/smollm2-agreement.txt" >&2; fail "SmolLM2 CUDA vs CPU greedy agreement below 90%"; }
  summary "PASS SmolLM2 $(tail -n 1 "$LOGS/smollm2-agreement.txt")"
}
if [[ "$SMOLLM2" == 1 ]]; then smollm2_check; fi

step "native CPU tests (same build)"
if [[ "${SKIP_BUILD:-0}" != 1 ]]; then
  ctest --test-dir "$BUILD_DIR" --output-on-failure -E '^(cuda_|device_check)' >"$LOGS/ctest-cpu.log" 2>&1 ||
    { tail -n 30 "$LOGS/ctest-cpu.log" >&2; fail "CPU tests (log: ctest-cpu.log)"; }
  summary "PASS native CPU tests: $(grep -m 1 'tests passed' "$LOGS/ctest-cpu.log" || echo ok)"
fi
if [[ "$FULL" == 1 ]]; then run_test cuda_kernels_test --full; fi

step "benchmarks"
BENCH="$BUILD_DIR/cuda/bench/cuda_bench"
[[ -x "$BENCH" ]] || fail "benchmark binary $BENCH is missing"
rc=0
timeout --kill-after=10 240 "$BENCH" "$LOGS/bench.tsv" >"$LOGS/bench.log" 2>&1 || rc=$?
if ((rc != 0)); then
  tail -n 20 "$LOGS/bench.log" >&2 || true
  fail "cuda_bench: $(describe_exit "$rc" 240) (log: bench.log)"
fi
GRAPH_BENCH="$BUILD_DIR/cuda/bench/cuda_graph_bench"
[[ -x "$GRAPH_BENCH" ]] || fail "benchmark binary $GRAPH_BENCH is missing"
rc=0
timeout --kill-after=10 120 "$GRAPH_BENCH" "$LOGS/bench.tsv" >"$LOGS/graph-bench.log" 2>&1 || rc=$?
if ((rc != 0)); then
  tail -n 20 "$LOGS/graph-bench.log" >&2 || true
  fail "cuda_graph_bench: $(describe_exit "$rc" 120) (log: graph-bench.log)"
fi
if grep -q '^\(SKIP\|FAIL\)' "$LOGS/graph-bench.log"; then
  grep -m 5 '^\(SKIP\|FAIL\)' "$LOGS/graph-bench.log" >&2 || true
  fail "cuda_graph_bench: SKIP or FAIL lines (log: graph-bench.log)"
fi
rc=0
PYTHONUNBUFFERED=1 timeout 210 "$PY" cuda/bench/sdpa_bench.py "$LOGS/bench.tsv" >"$LOGS/table.txt" 2>"$LOGS/sdpa.log" || rc=$?
if ((rc != 0)); then
  tail -n 20 "$LOGS/sdpa.log" >&2 || true
  echo "(PyTorch comparison failed; our numbers:)" >&2
  cat "$LOGS/bench.tsv" >&2
  fail "sdpa_bench: $(describe_exit "$rc" 210) (log: sdpa.log)"
fi

step "measured twin profile"
# The twin's cost model re-based on this card (docs/twin.md, "Measured
# profiles"): achieved GEMM rate (the matmul ceiling), prefill attention
# rate (median of the chunk rows of 2k tokens and more), decode attention
# bandwidth (median of the decode rows at 4k context and more), and the
# step overhead left when the llama-8b "decode 64 x 2k" iteration's weight
# and KV reads at those rates are taken away, and the per-kernel fixed costs
# (GEMM, attention, element-wise) with the weight-streaming and element-wise
# rates. With bin/worker carried to the machine it also writes the re-based
# llama-8b profile.
GPU_NAME="$(head -n 1 "$LOGS/device.txt" | cut -d, -f1)"
"$PY" - "$LOGS/bench.tsv" "$LOGS/measured.json" "$GPU_NAME" >"$LOGS/measured.log" 2>&1 <<'PY' ||
import json, sys, statistics, datetime
tsv, out, name = sys.argv[1], sys.argv[2], sys.argv[3]
rows = [l.rstrip("\n").split("\t") for l in open(tsv) if l.strip()]
ceil = {r[1]: float(r[2]) for r in rows if r[0] == "ceiling"}
chunk = [float(r[4]) for r in rows if r[0] == "chunk" and r[3] != "skipped" and int(r[1]) >= 2048]
decode = [float(r[4]) for r in rows if r[0] == "decode" and r[3] != "skipped" and int(r[2]) >= 4096]
iters = {r[1]: float(r[2]) for r in rows if r[0] == "iteration"}
gpu = next((g for g in ("gb300", "b200", "h200", "h100") if g in name.lower().replace(" ", "")), name.lower())
m = {"version": 1, "gpu": gpu,
     "source": f"scripts/device-check.sh on {name}, {datetime.date.today().isoformat()} (FlashInfer attention, cuBLAS GEMMs)",
     "gemm_tflops": ceil["matmul"], "prefill_attention_tflops": statistics.median(chunk),
     "decode_attention_gbps": statistics.median(decode), "gemm_weight_gbps": ceil["copy"]}
# llama-8b: bf16 weights of 8.03e9 parameters; KV of 64 sequences × 2048
# tokens × 32 layers × 8 heads × 128 dims × 2 (K, V) × 2 bytes.
weights, kv = 8.03e9 * 2, 64 * 2048 * 32 * 8 * 128 * 2 * 2
it = iters.get("decode 64 x 2k", 0.0)
m["step_overhead_ms"] = round(max(0.01, it - weights / (ceil["copy"] * 1e6) - kv / (m["decode_attention_gbps"] * 1e6)), 3)
# The twin's per-kernel figures (bench rows gemm, fixed, elementwise): a
# 1-token GEMM of the two llama-8b shapes is kernel cost + weight bytes /
# stream rate (two equations, two unknowns); the batch-1 short-KV attention
# kernels are almost all fixed cost; RMSNorm of 1 row is fixed cost, of 4096
# rows its bytes at the element-wise rate.
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
json.dump(m, open(out, "w"), indent=2)
print(json.dumps(m))
PY
  { cat "$LOGS/measured.log" >&2; fail "measured profile (log: measured.log)"; }
summary "twin: $(tail -n 1 "$LOGS/measured.log")"
if [[ -x bin/worker ]]; then
  rc=0
  bin/worker twin-profile --gpu "$("$PY" -c 'import json,sys; print(json.load(open(sys.argv[1]))["gpu"])' "$LOGS/measured.json")" \
    --model llama-8b --measured "$LOGS/measured.json" >"$LOGS/twin-profile.json" 2>"$LOGS/twin-profile.log" || rc=$?
  ((rc == 0)) || { cat "$LOGS/twin-profile.log" >&2; fail "twin-profile --measured: $(describe_exit "$rc" 0)"; }
  summary "twin profile re-based on this card: twin-profile.json (in the archive)"
fi

echo
cat "$LOGS/table.txt"
# The headline figures against the issue's targets, for the summary.
"$PY" - "$LOGS/bench.tsv" >>"$SUMMARY" 2>>"$LOGS/sdpa.log" <<'PY' || summary "(headline figures unavailable: see sdpa.log)"
import sys
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1]) if l.strip()]
c = {r[1]: r[2] for r in rows if r[0] == "ceiling"}
print(f"ceilings: copy {float(c['copy']):.0f} GB/s, bf16 matmul {float(c['matmul']):.0f} TFLOP/s")
for r in rows:
    if r[0] == "decode" and r[1:3] == ["64", "8192"]:
        print(f"decode 64 x 8k: {r[3]} ms, {r[5]}% of copy (target >= 80%)")
    if r[0] == "chunk" and r[1:3] == ["8192", "32768"]:
        print(f"chunk 8k over 32k: {r[3]} ms, {r[5]}% of matmul (target >= 50%)")
    if r[0] == "iteration":
        print(f"llama-8b {r[1]}: {r[2]} ms")
host = {(r[1], r[2]): float(r[3]) for r in rows if r[0] == "hostgraph"}
for b in ("1", "64", "256"):
    if (b, "eager") in host and (b, "graphs") in host:
        print(f"host us per decode iteration, batch {b}: {host[(b, 'eager')]:.0f} eager, "
              f"{host[(b, 'graphs')]:.0f} with graphs (goal <= 100 with the Go side)")
PY
if ((${#DEFERRED[@]} > 0)); then
  for d in "${DEFERRED[@]}"; do summary "NOT RUN: $d"; done
  fail "${#DEFERRED[@]} required check(s) could not run (see NOT RUN above)"
fi
step "done in $((SECONDS - START))s; every correctness test passed"
