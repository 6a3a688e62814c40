#!/usr/bin/env bash
# Device check for an H200 (or any sm_90 GPU) machine: builds the engine and
# the CUDA tests there with the machine's nvcc, runs the kernel and
# end-to-end tests (failing loudly on any failure, and on a SKIP: a device
# machine must have a device), measures the card's two ceilings and prints
# the benchmark table last. Budget: under 8 minutes.
#
# The machine has no Go and no network: CUDA 13 nvcc, CMake, ninja and a
# python3 with PyTorch (whose nvidia-* wheels provide cuBLAS and NCCL).
#
#   scripts/device-check.sh            # writes logs and bench.tsv under $OUT (or build-device/)
#   FULL=0 scripts/device-check.sh     # skip the long kernel cases (--full)
set -euo pipefail
cd "$(dirname "$0")/.."
START=$SECONDS
BUILD_DIR="${BUILD_DIR:-build-device}"
LOGS="${OUT:-$BUILD_DIR}"
mkdir -p "$LOGS"
FULL="${FULL:-1}"
PY="${PYTHON:-python3}"

fail() { echo "DEVICE-CHECK FAILED: $*" >&2; exit 1; }
step() { echo "== [$((SECONDS - START))s] $*"; }

step "device"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || fail "nvidia-smi found no GPU"
NVCC="${CUDACXX:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}"
[[ -x "$NVCC" ]] || fail "no nvcc (set CUDACXX)"
"$NVCC" --version | tail -n 2

# cuBLAS and NCCL: the toolkit's if present, else PyTorch's nvidia wheels.
NV_SITE="$("$PY" -c 'import nvidia, os; print(os.path.dirname(list(nvidia.__path__)[0]) + "/nvidia")' 2>/dev/null || true)"
LIB_HINTS="" INC_HINTS="" NCCL_ROOT=""
if [[ -n "$NV_SITE" && -d "$NV_SITE" ]]; then
  for lib in libcublas.so.* libcublasLt.so.* libcudart.so.* libnccl.so.*; do
    f="$(find "$NV_SITE" -name "$lib" -print -quit 2>/dev/null || true)"
    [[ -n "$f" ]] && LIB_HINTS="$LIB_HINTS;$(dirname "$f")"
  done
  for h in cublas_v2.h nccl.h; do
    f="$(find "$NV_SITE" -name "$h" -print -quit 2>/dev/null || true)"
    [[ -n "$f" ]] && INC_HINTS="$INC_HINTS;$(dirname "$f")"
  done
  f="$(find "$NV_SITE" -name 'libnccl.so.*' -print -quit 2>/dev/null || true)"
  [[ -n "$f" ]] && NCCL_ROOT="$(dirname "$(dirname "$f")")"
fi
LIB_HINTS="${LIB_HINTS#;}"
INC_HINTS="${INC_HINTS#;}"
echo "library hints: ${LIB_HINTS:-none}; NCCL: ${NCCL_ROOT:-toolkit}"
export LD_LIBRARY_PATH="${LIB_HINTS//;/:}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

step "build (sm_90)"
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release -DENGINE_CUDA=ON -DENGINE_NCCL=ON \
  -DCMAKE_CUDA_COMPILER="$NVCC" \
  "-DLOCKSTEP_CUDA_LIB_HINTS=$LIB_HINTS" "-DLOCKSTEP_CUDA_INCLUDE_HINTS=$INC_HINTS" \
  ${NCCL_ROOT:+-DLOCKSTEP_NCCL_ROOT=$NCCL_ROOT} \
  "-DLOCKSTEP_CUDA_GENCODE=-gencode=arch=compute_90,code=sm_90" >"$LOGS/configure.log" 2>&1 ||
  { tail -30 "$LOGS/configure.log"; fail "cmake configure"; }
cmake --build "$BUILD_DIR" -j "$(nproc)" >"$LOGS/build.log" 2>&1 || { tail -40 "$LOGS/build.log"; fail "build"; }

# Runs a test binary; fails on a non-zero exit, a FAIL line or a SKIP line.
run_test() {
  local name="$1"; shift
  local log="$LOGS/$name.log"
  step "test $name $*"
  if ! timeout 300 "$BUILD_DIR/cuda/tests/$name" "$@" >"$log" 2>&1; then
    grep -E 'FAIL|error' "$log" | head -40
    tail -5 "$log"
    fail "$name $*"
  fi
  grep -q '^SKIP' "$log" && { cat "$log"; fail "$name skipped: no CUDA device visible on the device machine"; }
  grep -E '^FAIL' "$log" && fail "$name reported failures"
  tail -1 "$log"
}
run_test cuda_kernels_test
run_test cuda_e2e_test
run_test cuda_nccl_test
step "native CPU tests (same build)"
ctest --test-dir "$BUILD_DIR" --output-on-failure -E '^cuda_' >"$LOGS/ctest-cpu.log" 2>&1 || { tail -30 "$LOGS/ctest-cpu.log"; fail "CPU tests"; }
if [[ "$FULL" == 1 ]]; then run_test cuda_kernels_test --full; fi

step "benchmarks"
timeout 240 "$BUILD_DIR/cuda/bench/cuda_bench" "$LOGS/bench.tsv" >"$LOGS/bench.log" 2>&1 || { tail -20 "$LOGS/bench.log"; fail "cuda_bench"; }
PYTHONUNBUFFERED=1 timeout 150 "$PY" cuda/bench/sdpa_bench.py "$LOGS/bench.tsv" >"$LOGS/table.txt" 2>"$LOGS/sdpa.log" ||
  { tail -20 "$LOGS/sdpa.log"; echo "(PyTorch comparison failed; our numbers:)"; cat "$LOGS/bench.tsv"; fail "sdpa_bench"; }
step "measured twin profile"
# The twin's cost model re-based on this card (docs/twin.md, "Measured
# profiles"): achieved GEMM rate (the matmul ceiling), prefill attention
# rate (median of the chunk rows of 2k tokens and more), decode attention
# bandwidth (median of the decode rows at 4k context and more), and the
# step overhead left when the llama-8b "decode 64 x 2k" iteration's weight
# and KV reads at those rates are taken away. With bin/worker carried to
# the machine it also writes the re-based llama-8b profile.
GPU_NAME="$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
"$PY" - "$LOGS/bench.tsv" "$LOGS/measured.json" "$GPU_NAME" <<'PY' || fail "measured profile"
import json, sys, statistics, datetime
tsv, out, name = sys.argv[1], sys.argv[2], sys.argv[3]
rows = [l.rstrip("\n").split("\t") for l in open(tsv) if l.strip()]
ceil = {r[1]: float(r[2]) for r in rows if r[0] == "ceiling"}
chunk = [float(r[4]) for r in rows if r[0] == "chunk" and r[3] != "skipped" and int(r[1]) >= 2048]
decode = [float(r[4]) for r in rows if r[0] == "decode" and r[3] != "skipped" and int(r[2]) >= 4096]
iters = {r[1]: float(r[2]) for r in rows if r[0] == "iteration"}
gpu = next((g for g in ("gb300", "b200", "h200", "h100") if g in name.lower().replace(" ", "")), name.lower())
m = {"version": 1, "gpu": gpu,
     "source": f"scripts/device-check.sh on {name}, {datetime.date.today().isoformat()} (our CUDA engine's kernels)",
     "gemm_tflops": ceil["matmul"], "prefill_attention_tflops": statistics.median(chunk),
     "decode_attention_gbps": statistics.median(decode), "gemm_weight_gbps": ceil["copy"]}
# llama-8b: bf16 weights of 8.03e9 parameters; KV of 64 sequences × 2048
# tokens × 32 layers × 8 heads × 128 dims × 2 (K, V) × 2 bytes.
weights, kv = 8.03e9 * 2, 64 * 2048 * 32 * 8 * 128 * 2 * 2
it = iters.get("decode 64 x 2k", 0.0)
m["step_overhead_ms"] = round(max(0.01, it - weights / (ceil["copy"] * 1e6) - kv / (m["decode_attention_gbps"] * 1e6)), 3)
json.dump(m, open(out, "w"), indent=2)
print(json.dumps(m))
PY
if [[ -x bin/worker ]]; then
  bin/worker twin-profile --gpu "$("$PY" -c 'import json,sys; print(json.load(open(sys.argv[1]))["gpu"])' "$LOGS/measured.json")" \
    --model llama-8b --measured "$LOGS/measured.json" >"$LOGS/twin-profile.json" || fail "twin-profile --measured"
  echo "twin profile re-based on this card: $LOGS/twin-profile.json"
fi
step "done in $((SECONDS - START))s; every correctness test passed"
echo
cat "$LOGS/table.txt"
