#!/usr/bin/env bash
# Device check for an H200 (or any sm_90 GPU) machine, in one command that
# keeps a total time budget (BUDGET, default 480 s): builds the engine and the
# CUDA tests there with the machine's nvcc (sm_90a), runs the kernel,
# end-to-end (the tiny preset and a SmolLM2-shaped model, CUDA vs CPU through
# engine.h), decode-graph and NCCL tests (one rank, then two ranks on the one
# GPU), measures the card's two ceilings (copy bandwidth, bf16 matmul), the
# production attention (FlashInfer decode and prefill, GQA 4:1 and 8:1) and
# the hand-written kernels against them, llama-8b iterations, host time per
# decode iteration with and without CUDA graphs, writes the measured cost
# profile for the twin, then (budget permitting) SmolLM2 on the CUDA engine
# against the CPU engine through bin/worker, PyTorch SDPA on the same shapes,
# the CPU tests of the same build and the long kernel sweep (FULL=1).
#
# The budget. Every step has a rough need (seconds); a step starts only when
# the budget left (less RESERVE seconds kept for the archive) covers it, and
# every command runs under a timeout of at most what is left, so the check
# ends by BUDGET + about RESERVE whatever hangs. A step that does not fit is
# skipped and named ("SKIPPED (budget): ..."); a skipped or overrunning step
# makes the check exit non-zero. The steps are ordered by what the first
# device run must return: correctness tests, then the tables, then the rest.
#
# Failing loudly. A test's non-zero exit, a signal (a kernel fault aborts the
# process), a timeout, a FAIL or SKIP line is reported as "DEVICE-CHECK
# FAILED: ..." naming what failed; the later steps still run (their figures
# are worth having) and the check exits non-zero. No device, no nvcc, a failed
# build, or any unexpected command failure of this script stops it at once
# (the steps not reached are named). scripts/test-device-check.sh checks all
# of this with fake binaries (ctest device_check_script).
#
# Outputs in $OUT (the device machine returns at most 8 files), refreshed
# after every step so that a SIGKILL at the tool's limit still returns what
# was measured:
#   $OUT/summary.txt           the one-screen summary (also printed last); while
#                              the check runs it ends with the step in progress
#                              and the steps still to come
#   $OUT/table.txt             the attention tables against the ceilings
#   $OUT/bench.tsv             the raw measurements (cuda/bench/device_report.py)
#   $OUT/device-check.tar.gz   every log, bench.tsv, the table, measured.json,
#                              twin-profile.json
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
#   scripts/device-check.sh            # the quick set within 480 s
#   BUDGET=540 ...                     # another budget (seconds)
#   FULL=1 ...                         # add the long float64-reference sweep (--full)
#   SMOLLM2=0 ...                      # do not require the SmolLM2 check (no GGUF carried)
#   SDPA=0 ...                         # leave out the PyTorch SDPA comparison
#   SKIP_BUILD=1 BUILD_DIR=...         # reuse a build (used by the script's test)
set -Eeuo pipefail
cd "$(dirname "$0")/.."
START=$SECONDS
BUILD_DIR="${BUILD_DIR:-build-device}"
OUT_DIR="${OUT:-$BUILD_DIR/out}"
LOGS="$BUILD_DIR/device-check-logs"
BUDGET="${BUDGET:-480}"
RESERVE="${RESERVE:-10}"
FULL="${FULL:-0}"
SMOLLM2="${SMOLLM2:-1}"
SDPA="${SDPA:-1}"
PY="${PYTHON:-python3}"
TEST_TIMEOUT="${TEST_TIMEOUT:-150}"
MODEL_GGUF="${MODEL_GGUF:-$HOME/.cache/lockstep/models/SmolLM2-135M-Instruct.Q4_1.gguf}"
for v in BUDGET RESERVE TEST_TIMEOUT; do
  [[ "${!v}" =~ ^[0-9]+$ ]] || { echo "device-check: $v must be a whole number of seconds, got '${!v}'" >&2; exit 2; }
done
((BUDGET > RESERVE)) || { echo "device-check: BUDGET ($BUDGET s) must exceed RESERVE ($RESERVE s)" >&2; exit 2; }
rm -rf "$LOGS"
mkdir -p "$LOGS" "$OUT_DIR"
SUMMARY="$LOGS/summary.txt"
: >"$SUMMARY"
CURRENT="setup"
FAILURES=()  # correctness failures: the later steps still run
SKIPPED=()   # steps the budget left out
DEFERRED=()  # required checks that could not run (an input missing)
PENDING=()   # steps not started yet (named if the check stops early)

summary() { echo "$*" >>"$SUMMARY"; }
elapsed() { echo $((SECONDS - START)); }
# Seconds of the budget left for work (the reserve is kept for the archive).
budget_left() { echo $((BUDGET - RESERVE - (SECONDS - START))); }
step() {
  CURRENT="$*"
  echo "== [$(elapsed)s] $*"
}
# A correctness failure: reported at once, the check goes on, exits non-zero.
failed() {
  FAILURES+=("$*")
  echo "DEVICE-CHECK FAILED: $*" >&2
  summary "FAILED: $*"
}
# A failure after which nothing can run.
fatal() {
  failed "$*"
  exit 1
}

# Copies what was measured so far into $OUT (each file replaced whole, so a
# kill mid-copy leaves the previous one): the summary with the step in
# progress and the steps to come, the table, the raw TSV, the log archive.
checkpoint() {
  local running="${1:-}"
  {
    cat "$SUMMARY"
    if [[ -n "$running" ]]; then
      echo "RUNNING: $running (started $(elapsed)s into BUDGET=${BUDGET}s)"
      ((${#PENDING[@]} == 0)) || echo "NOT YET RUN: $(IFS=';'; echo "${PENDING[*]}" | sed 's/;/; /g')"
    fi
  } >"$OUT_DIR/.summary.tmp" && mv -f "$OUT_DIR/.summary.tmp" "$OUT_DIR/summary.txt"
  local f
  for f in table.txt bench.tsv; do
    [[ ! -s "$LOGS/$f" ]] || { cp "$LOGS/$f" "$OUT_DIR/.$f.tmp" && mv -f "$OUT_DIR/.$f.tmp" "$OUT_DIR/$f"; }
  done
  tar -czf "$OUT_DIR/.archive.tmp" -C "$LOGS" . 2>/dev/null && mv -f "$OUT_DIR/.archive.tmp" "$OUT_DIR/device-check.tar.gz" ||
    echo "device-check: could not write $OUT_DIR/device-check.tar.gz" >&2
}

# Any command that fails outside a handled branch lands here (set -E makes
# functions and subshells inherit the trap), so no failure exits silently.
on_err() {
  local rc=$1 line=$2 cmd=$3
  trap - ERR
  fatal "unexpected failure (exit status $rc) in step '$CURRENT', line $line: $cmd"
}
trap 'on_err $? $LINENO "$BASH_COMMAND"' ERR
# On every exit: the final summary (what did not run, the result), the
# archive, the summary beside it, printed last.
on_exit() {
  local rc=$?
  trap - ERR EXIT
  set +e
  ((${#PENDING[@]} == 0)) || summary "NOT RUN (the check stopped before them): $(IFS=';'; echo "${PENDING[*]}" | sed 's/;/; /g')"
  if ((rc == 0)); then
    summary "RESULT: PASS in $(elapsed)s (BUDGET=${BUDGET}s)"
  else
    grep -q '^FAILED' "$SUMMARY" || summary "FAILED: exit status $rc in step '$CURRENT'"
    summary "RESULT: FAIL (exit status $rc) in $(elapsed)s (BUDGET=${BUDGET}s)"
  fi
  checkpoint
  rm -f "$OUT_DIR"/.*.tmp
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

# run_limited CAP LOG CMD...: runs CMD (an executable, not a function) with
# its output in LOG for at most CAP seconds or what is left of the budget,
# whichever is less. Sets RC (its exit status) and WHY (RC in words; empty
# when RC is 0; "overran the budget" when the budget's limit stopped it).
run_limited() {
  local cap=$1 log=$2 left lim
  shift 2
  left="$(budget_left)"
  lim=$((cap < left ? cap : left))
  ((lim >= 1)) || lim=1
  RC=0
  timeout --kill-after=5 "$lim" "$@" >"$log" 2>&1 || RC=$?
  WHY=""
  if ((RC != 0)); then
    WHY="$(describe_exit "$RC" "$lim")"
    if ((lim < cap)) && ((RC == 124 || RC == 137)); then
      WHY="overran the budget: stopped after ${lim}s, $(elapsed)s into BUDGET=${BUDGET}s"
    fi
  fi
}

step "device"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader >"$LOGS/device.txt" 2>&1 ||
  { cat "$LOGS/device.txt"; fatal "nvidia-smi found no GPU"; }
cat "$LOGS/device.txt"
summary "device: $(head -n 1 "$LOGS/device.txt"); BUDGET=${BUDGET}s FULL=$FULL SMOLLM2=$SMOLLM2 SDPA=$SDPA"
NVCC="${CUDACXX:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}"
[[ -x "$NVCC" ]] || fatal "no nvcc (set CUDACXX)"
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
      "$CARRY_DIR/flashinfer-headers.tar.xz" "$BUILD_DIR/carry" || fatal "could not unpack $CARRY_DIR/flashinfer-headers.tar.xz"
    LOCKSTEP_FLASHINFER_ROOT="$(cd "$BUILD_DIR/carry/flashinfer" && pwd)"
    export LOCKSTEP_FLASHINFER_ROOT
  fi
  if [[ ! -x bin/worker && -f "$CARRY_DIR/worker.xz" ]]; then
    mkdir -p bin
    "$PY" -c 'import lzma, sys; open(sys.argv[2], "wb").write(lzma.open(sys.argv[1]).read())' \
      "$CARRY_DIR/worker.xz" bin/worker || fatal "could not unpack $CARRY_DIR/worker.xz"
    chmod +x bin/worker
    (cd bin && sha256sum -c "$OLDPWD/$CARRY_DIR/SHA256SUMS" >/dev/null) ||
      fatal "bin/worker unpacked from $CARRY_DIR/worker.xz does not match $CARRY_DIR/SHA256SUMS"
  fi
  summary "carried: FlashInfer headers ${LOCKSTEP_FLASHINFER_ROOT:-none}, bin/worker $([[ -x bin/worker ]] && echo yes || echo no)"
fi

# --- The steps (each one function; a failure is recorded, not fatal, unless
# nothing after it could run). ---

step_build() {
  local fi_root="${LOCKSTEP_FLASHINFER_ROOT:-${LOCKSTEP_CUDA_HOME:-/opt/lockstep-cuda}/flashinfer}"
  [[ -f "$fi_root/include/flashinfer/attention/decode.cuh" ]] ||
    fatal "no FlashInfer headers at $fi_root (run scripts/install-cuda.sh --headers-only where there is network and carry the directory; set LOCKSTEP_FLASHINFER_ROOT)"
  run_limited 120 "$LOGS/configure.log" cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DENGINE_CUDA=ON -DENGINE_NCCL=ON -DCMAKE_CUDA_COMPILER="$NVCC" -DLOCKSTEP_FLASHINFER_ROOT="$fi_root" \
    "-DLOCKSTEP_CUDA_LIB_HINTS=$LIB_HINTS" "-DLOCKSTEP_CUDA_INCLUDE_HINTS=$INC_HINTS" \
    ${NCCL_ROOT:+-DLOCKSTEP_NCCL_ROOT=$NCCL_ROOT} \
    "-DLOCKSTEP_CUDA_GENCODE=-gencode=arch=compute_90a,code=sm_90a"
  ((RC == 0)) || { tail -n 30 "$LOGS/configure.log"; fatal "cmake configure: $WHY (log: configure.log)"; }
  run_limited 900 "$LOGS/build.log" cmake --build "$BUILD_DIR" -j "$(nproc)"
  ((RC == 0)) || { tail -n 40 "$LOGS/build.log"; fatal "build: $WHY (log: build.log)"; }
  summary "build: ok ($(elapsed)s)"
}

# Runs a test binary; fails loudly on a non-zero exit (with or without a FAIL
# line: a kernel fault aborts before any is printed), a signal, a timeout, a
# FAIL line, or a SKIP line (a device machine must have a device). Its
# "figure:" lines (agreement figures) go into the summary.
step_test() {
  local name="$1"; shift
  local exe="$BUILD_DIR/cuda/tests/$name" tag="$name${1:+ $*}"
  local log="$LOGS/$name${1:+${*//[^a-z0-9]/}}.log"
  [[ -x "$exe" ]] || { failed "$tag: test binary $exe is missing (build incomplete?)"; return; }
  local t0=$SECONDS nfail
  run_limited "$TEST_TIMEOUT" "$log" "$exe" "$@"
  if ((RC != 0)); then
    echo "--- last lines of $(basename "$log"):" >&2
    tail -n 25 "$log" >&2 || true
    nfail="$(grep -c '^FAIL' "$log" || true)"
    failed "$tag: $WHY${nfail:+, $nfail FAIL lines}$([[ "$nfail" == 0 ]] && echo ' (no FAIL line: crashed or aborted)')"
  elif grep -q '^SKIP' "$log"; then
    cat "$log" >&2
    failed "$tag skipped: no CUDA device visible on the device machine"
  elif grep -q '^FAIL' "$log"; then
    grep -m 20 '^FAIL' "$log" >&2 || true
    failed "$tag reported failures (exit status 0 but FAIL lines)"
  else
    summary "PASS $tag ($((SECONDS - t0))s): $(tail -n 1 "$log")"
  fi
  grep '^figure:' "$log" | sed "s/^figure:/  $name:/" >>"$SUMMARY" || true
}

step_bench() {
  local exe="$BUILD_DIR/cuda/bench/cuda_bench"
  [[ -x "$exe" ]] || { failed "benchmark binary $exe is missing"; return; }
  run_limited 240 "$LOGS/bench.log" "$exe" "$LOGS/bench.tsv"
  if ((RC != 0)); then
    tail -n 20 "$LOGS/bench.log" >&2 || true
    failed "cuda_bench: $WHY (log: bench.log; rows measured before it stopped are kept)"
  elif grep -q '^SKIP' "$LOGS/bench.log"; then
    failed "cuda_bench skipped: no CUDA device visible on the device machine"
  fi
}

step_graph_bench() {
  local exe="$BUILD_DIR/cuda/bench/cuda_graph_bench"
  [[ -x "$exe" ]] || { failed "benchmark binary $exe is missing"; return; }
  run_limited 120 "$LOGS/graph-bench.log" "$exe" "$LOGS/bench.tsv"
  if ((RC != 0)); then
    tail -n 20 "$LOGS/graph-bench.log" >&2 || true
    failed "cuda_graph_bench: $WHY (log: graph-bench.log)"
  elif grep -q '^\(SKIP\|FAIL\)' "$LOGS/graph-bench.log"; then
    grep -m 5 '^\(SKIP\|FAIL\)' "$LOGS/graph-bench.log" >&2 || true
    failed "cuda_graph_bench: SKIP or FAIL lines (log: graph-bench.log)"
  fi
}

# The table, the headline figures and the measured profile for the twin
# (docs/twin.md, "A measured profile"), all from bench.tsv by
# cuda/bench/device_report.py; with bin/worker carried, the re-based llama-8b
# profile too. Run again after the SDPA step, with its columns.
step_report() {
  # (No rows: cuda_bench was skipped or failed, which is reported already.)
  [[ -s "$LOGS/bench.tsv" ]] || { summary "not made: tables and measured profile (no bench.tsv)"; return; }
  local sdpa=()
  [[ ! -s "$LOGS/sdpa.tsv" ]] || sdpa=(--sdpa "$LOGS/sdpa.tsv")
  run_limited 60 "$LOGS/table.txt" "$PY" cuda/bench/device_report.py table "$LOGS/bench.tsv" "${sdpa[@]}"
  ((RC == 0)) || { cat "$LOGS/table.txt" >&2; failed "device_report.py table: $WHY (log: table.txt)"; }
  [[ "${1:-}" != table-only ]] || return 0
  run_limited 60 "$LOGS/headline.txt" "$PY" cuda/bench/device_report.py headline "$LOGS/bench.tsv"
  if ((RC == 0)); then cat "$LOGS/headline.txt" >>"$SUMMARY"; else cat "$LOGS/headline.txt" >&2; failed "device_report.py headline: $WHY"; fi
  local gpu_name
  gpu_name="$(head -n 1 "$LOGS/device.txt" | cut -d, -f1)"
  run_limited 60 "$LOGS/measured.log" "$PY" cuda/bench/device_report.py measured "$LOGS/bench.tsv" "$LOGS/measured.json" "$gpu_name"
  if ((RC != 0)); then
    cat "$LOGS/measured.log" >&2
    failed "measured twin profile: $WHY (log: measured.log)"
    return
  fi
  summary "twin: $(tail -n 1 "$LOGS/measured.log")"
  if [[ -x bin/worker ]]; then
    local gpu
    gpu="$("$PY" -c 'import json,sys; print(json.load(open(sys.argv[1]))["gpu"])' "$LOGS/measured.json")"
    run_limited 60 "$LOGS/twin-profile.json" bin/worker twin-profile --gpu "$gpu" --model llama-8b --measured "$LOGS/measured.json"
    if ((RC == 0)); then summary "twin profile re-based on this card: twin-profile.json (in the archive)"
    else cat "$LOGS/twin-profile.json" >&2; failed "twin-profile --measured: $WHY"; fi
  fi
}

# SmolLM2-135M (GGUF) on the CUDA engine against the CPU engine, greedy,
# through the worker: the fraction of generated tokens before each prompt's
# first divergence. Needs bin/worker (no Go here) and the model (no network).
step_smollm2() {
  if [[ ! -x bin/worker ]]; then DEFERRED+=("SmolLM2 check: bin/worker was not carried (build it with a CUDA libengine)"); return; fi
  if [[ ! -f "$MODEL_GGUF" ]]; then DEFERRED+=("SmolLM2 check: no model at $MODEL_GGUF (carry it and set MODEL_GGUF, or SMOLLM2=0)"); return; fi
  local prompts="$LOGS/smollm2-prompts.jsonl" engine
  "$PY" - "$prompts" <<'PY' || { failed "SmolLM2: could not write the prompts"; return; }
import json, sys
texts = ["The capital of France is", "def fibonacci(n):", "Photosynthesis is the process by which",
         "Once upon a time, in a small village,", "The three laws of thermodynamics are",
         "In 1969, the first humans", "A good night's sleep helps", "To make a cup of tea, first"]
with open(sys.argv[1], "w") as f:
    for t in texts: f.write(json.dumps({"prompt": t, "max_tokens": 48}) + "\n")
PY
  for engine in cpu cuda; do
    run_limited 180 "$LOGS/smollm2-$engine.log" bin/worker run --engine "$engine" --model "$MODEL_GGUF" \
      --prompts "$prompts" --pages 512 --requests-out "$LOGS/smollm2-$engine.jsonl" --report json
    if ((RC != 0)); then
      tail -n 15 "$LOGS/smollm2-$engine.log" >&2 || true
      failed "SmolLM2 on the $engine engine: $WHY (log: smollm2-$engine.log)"
      return
    fi
  done
  if "$PY" - "$LOGS/smollm2-cpu.jsonl" "$LOGS/smollm2-cuda.jsonl" >"$LOGS/smollm2-agreement.txt" <<'PY'; then
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
    summary "PASS SmolLM2 $(tail -n 1 "$LOGS/smollm2-agreement.txt")"
  else
    cat "$LOGS/smollm2-agreement.txt" >&2
    failed "SmolLM2 CUDA vs CPU greedy agreement below 90%: $(tail -n 1 "$LOGS/smollm2-agreement.txt")"
  fi
}

# The same attention shapes through every PyTorch SDPA backend (the fastest
# shown and named in the table); then the table again with its columns.
step_sdpa() {
  [[ -s "$LOGS/bench.tsv" ]] || { summary "not run: PyTorch SDPA (no bench.tsv to take the shapes from)"; return; }
  run_limited 150 "$LOGS/sdpa.log" env PYTHONUNBUFFERED=1 "$PY" cuda/bench/sdpa_bench.py "$LOGS/bench.tsv" "$LOGS/sdpa.tsv"
  if ((RC != 0)); then
    tail -n 20 "$LOGS/sdpa.log" >&2 || true
    failed "sdpa_bench: $WHY (log: sdpa.log; the shapes timed before it stopped are in the table)"
  fi
  [[ ! -s "$LOGS/sdpa.tsv" ]] || step_report table-only
}

step_cpu_tests() {
  run_limited 180 "$LOGS/ctest-cpu.log" ctest --test-dir "$BUILD_DIR" --output-on-failure -j 8 -E '^(cuda_|device_check|carry_size)'
  if ((RC == 0)); then summary "PASS native CPU tests: $(grep -m 1 'tests passed' "$LOGS/ctest-cpu.log" || echo ok)"
  else tail -n 30 "$LOGS/ctest-cpu.log" >&2; failed "CPU tests: $WHY (log: ctest-cpu.log)"; fi
}

# The plan: "name|need in seconds|function", in the order the first device
# run must return them. What was not asked for is said once.
PLAN=()
NOT_ASKED=()
if [[ "${SKIP_BUILD:-0}" != 1 ]]; then PLAN+=("build (sm_90a)|60|step_build"); fi
PLAN+=("test cuda_kernels_test|15|step_test cuda_kernels_test"
       "test cuda_e2e_test|20|step_test cuda_e2e_test"
       "test cuda_graphs_test|10|step_test cuda_graphs_test")
if [[ -x "$BUILD_DIR/cuda/tests/cuda_nccl_test" || "${SKIP_BUILD:-0}" != 1 ]]; then
  PLAN+=("test cuda_nccl_test|10|step_test cuda_nccl_test" "test cuda_nccl_test --ranks 2|15|step_test cuda_nccl_test --ranks 2")
fi
PLAN+=("benchmark cuda_bench|60|step_bench"
       "benchmark cuda_graph_bench|30|step_graph_bench"
       "tables and measured twin profile|5|step_report")
if [[ "$SMOLLM2" == 1 ]]; then PLAN+=("SmolLM2 CUDA vs CPU (greedy)|60|step_smollm2"); else NOT_ASKED+=("SmolLM2 check (SMOLLM2=0)"); fi
if [[ "$SDPA" == 1 ]]; then PLAN+=("PyTorch SDPA on the same shapes|45|step_sdpa"); else NOT_ASKED+=("PyTorch SDPA (SDPA=0)"); fi
if [[ "${SKIP_BUILD:-0}" != 1 ]]; then PLAN+=("native CPU tests (same build)|45|step_cpu_tests"); fi
if [[ "$FULL" == 1 ]]; then PLAN+=("test cuda_kernels_test --full|90|step_test cuda_kernels_test --full"); else NOT_ASKED+=("the long kernel sweep cuda_kernels_test --full (FULL=0)"); fi
((${#NOT_ASKED[@]} == 0)) || summary "not asked: $(IFS=';'; echo "${NOT_ASKED[*]}" | sed 's/;/; /g')"

for entry in "${PLAN[@]}"; do PENDING+=("${entry%%|*}"); done
for entry in "${PLAN[@]}"; do
  IFS='|' read -r name need fn <<<"$entry"
  PENDING=("${PENDING[@]:1}")
  left="$(budget_left)"
  if ((left < need)); then
    SKIPPED+=("$name")
    summary "SKIPPED (budget): $name (needs ~${need}s, ${left}s of BUDGET=${BUDGET}s left)"
    echo "== [$(elapsed)s] SKIPPED (budget): $name (needs ~${need}s, ${left}s left)"
    checkpoint
    continue
  fi
  step "$name"
  checkpoint "$name"
  $fn
  checkpoint
done

if ((${#DEFERRED[@]} > 0)); then
  for d in "${DEFERRED[@]}"; do summary "NOT RUN: $d"; done
  failed "${#DEFERRED[@]} required check(s) could not run (see NOT RUN above)"
fi
if ((${#SKIPPED[@]} > 0)); then
  failed "${#SKIPPED[@]} step(s) skipped for the budget: $(IFS=';'; echo "${SKIPPED[*]}" | sed 's/;/; /g') (raise BUDGET or run them alone)"
fi
((${#FAILURES[@]} == 0)) || exit 1
step "done in $(elapsed)s; every correctness test passed"
