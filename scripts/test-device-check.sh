#!/usr/bin/env bash
# Test of scripts/device-check.sh on a machine without a GPU (ctest runs it as
# device_check_script): a fake nvidia-smi and nvcc, and a fake build directory
# whose test and benchmark binaries misbehave the way a kernel fault, a hang
# or a slow step does. Cases:
#   - a test binary exiting 2 / SIGSEGV / hanging / printing FAIL with exit 0 /
#     printing SKIP, and a missing benchmark: exit non-zero, a "DEVICE-CHECK
#     FAILED" line naming the binary, the summary printed last;
#   - everything passing: exit 0, the tables, headline figures and measured
#     profile made from the fake benchmarks' TSV by cuda/bench/device_report.py;
#   - a step that overruns the budget: it is stopped at the budget, the rest
#     is skipped and named, exit non-zero, within the budget;
#   - the check killed with SIGKILL mid-way: $OUT already holds the summary of
#     the finished steps (and the step it died in) and a readable archive.
# Every case leaves only the check's known files in $OUT (the device machine
# returns at most 8).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
WORK="$(mktemp -d)"
trap '[[ -n "${KEEP:-}" ]] || rm -rf "$WORK"' EXIT
failures=0

mkdir -p "$WORK/bin"
cat >"$WORK/bin/nvidia-smi" <<'EOF'
#!/bin/sh
echo "NVIDIA H200 (fake), 143771 MiB, 580.00"
EOF
cat >"$WORK/bin/nvcc" <<'EOF'
#!/bin/sh
echo "Cuda compilation tools, release 13.0 (fake)"; echo "Build cuda_13.0 (fake)"
EOF
chmod +x "$WORK/bin/nvidia-smi" "$WORK/bin/nvcc"

# What the fake cuda_bench writes: the rows cuda/bench/bench_kernels.cu
# writes, with H200-like figures.
FAKE_TSV="$WORK/fake-bench.tsv"
python3 - "$FAKE_TSV" <<'PY'
import sys
rows = ["ceiling\tcopy\t4300.0\tGB/s", "ceiling\tmatmul\t780.0\tTFLOP/s"]
for kernel, groups in (("flashinfer", (4, 8)), ("handwritten", (4,))):
    for g in groups:
        for b in (1, 16, 64, 256):
            for ctx in (1024, 8192, 32768):
                gbs = 3500.0 if kernel == "flashinfer" else 1900.0
                ms = b * ctx * 8 * 128 * 4 / (gbs * 1e6)
                rows.append(f"decode\t{kernel}\t{g}\t{b}\t{ctx}\t{ms:.4f}\t{gbs:.1f}\t{100 * gbs / 4300:.1f}")
        for chunk in (512, 2048, 8192):
            for depth in (0, 8192, 32768):
                tf = 450.0 if kernel == "flashinfer" else 120.0
                flops = 4.0 * 128 * 8 * g * (chunk * depth + chunk * (chunk + 1) / 2)
                rows.append(f"prefill\t{kernel}\t{g}\t{chunk}\t{depth}\t{flops / (tf * 1e9):.4f}\t{tf:.1f}\t{100 * tf / 780:.1f}")
rows += ["iteration\tdecode 64 x 2k\t9.500\tms", "iteration\tchunk 8k\t60.000\tms"]
# The per-kernel rows (bench_kernels.cu: cuBLAS GEMMs of llama-8b's two
# shapes, the batch-1 attention kernels, RMSNorm of 1 and 4096 rows): a
# 1-token GEMM of 0.006 ms + its bf16 weights at ~4 000 GB/s, attention's
# fixed 0.0118 ms, element-wise 0.0031 ms + bytes at ~2 580 GB/s.
for n, ms in ((6144, 0.0186), (28672, 0.0647)):
    rows.append(f"gemm\t1\t4096\t{n}\t{ms:.4f}")
    rows.append(f"gemm\t256\t4096\t{n}\t{ms * 3:.4f}")
rows += ["fixed\tdecode\t0.0118", "fixed\tchunk\t0.0152",
         "elementwise\t1\t24576\t0.0031", "elementwise\t4096\t100663296\t0.0421"]
# FlashInfer's MLA kernel (DeepSeek-V3 geometry): one decode row, one prefill row, one error row.
rows += ["mla\tdecode\tflashinfer\t128\t64\t8192\t0.4000\t1509.9\t35.1",
         "mla\tprefill\tflashinfer\t128\t512\t8192\t1.2000\t261.5\t33.5",
         "mla\tdecode\tflashinfer\t128\t256\t32768\terror\tplan refused"]
open(sys.argv[1], "w").write("\n".join(rows) + "\n")
PY

# fake_build DIR KERNELS_BODY [GRAPHS_BODY]: a build directory whose
# cuda_kernels_test (and cuda_graphs_test) run the bodies; the other tests
# pass and the benchmarks write the fake rows.
fake_build() {
  local dir="$1" body="$2" graphs="${3:-echo \"3 passed, 0 failed\"}"
  mkdir -p "$dir/cuda/tests" "$dir/cuda/bench"
  printf '#!/usr/bin/env bash\n%s\n' "$body" >"$dir/cuda/tests/cuda_kernels_test"
  printf '#!/usr/bin/env bash\n%s\n' "$graphs" >"$dir/cuda/tests/cuda_graphs_test"
  printf '#!/bin/sh\necho "figure: fake agreement 99%%"\necho "3 passed, 0 failed"\n' >"$dir/cuda/tests/cuda_e2e_test"
  printf '#!/bin/sh\necho "3 passed, 0 failed"\n' >"$dir/cuda/tests/cuda_nccl_test"
  printf '#!/bin/sh\ncp "%s" "$1"\necho "cuda_bench: wrote $1"\n' "$FAKE_TSV" >"$dir/cuda/bench/cuda_bench"
  cat >"$dir/cuda/bench/cuda_graph_bench" <<'EOF'
#!/bin/sh
printf 'hostgraph\t64\teager\t210.0\t9000.0\t8.9\nhostgraph\t64\tgraphs\t40.0\t8800.0\t8.7\n' >>"$1"
EOF
  chmod +x "$dir"/cuda/tests/* "$dir"/cuda/bench/*
}

# run_check NAME ENV...: device-check.sh on NAME's fake build (set up by the
# caller); sets RC and LOG.
run_check() {
  local name="$1"; shift
  RC=0
  LOG="$WORK/$name.log"
  env PATH="$WORK/bin:$PATH" PYTHON=python3 CUDACXX="$WORK/bin/nvcc" SKIP_BUILD=1 SMOLLM2=0 SDPA=0 TEST_TIMEOUT=5 \
    CARRY_DIR="$WORK/no-carry" BUILD_DIR="$WORK/$name/build" OUT="$WORK/$name/out" "$@" \
    "$ROOT/scripts/device-check.sh" >"$LOG" 2>&1 || RC=$?
}

# out_files_ok OUT: $OUT holds only the check's files, summary.txt and the
# archive among them.
out_files_ok() {
  local out="$1" f
  for f in "$out"/* "$out"/.[!.]*; do
    [[ -e "$f" ]] || continue
    case "$(basename "$f")" in summary.txt | table.txt | bench.tsv | device-check.tar.gz) ;; *) echo "unexpected file in \$OUT: $(basename "$f")"; return 1 ;; esac
  done
  [[ -s "$out/summary.txt" && -s "$out/device-check.tar.gz" ]] || { echo "summary.txt or device-check.tar.gz missing"; return 1; }
  tar -tzf "$out/device-check.tar.gz" >/dev/null || { echo "device-check.tar.gz is not a readable archive"; return 1; }
}

report() {
  local name="$1" why="$2" detail="$3"
  if [[ -n "$why" ]]; then
    echo "FAIL $name: $why (exit status $RC); output:"
    sed 's/^/    /' "$LOG"
    failures=$((failures + 1))
  else
    echo "ok   $name: $detail"
  fi
}

# expect_failure NAME BODY PATTERN: device-check.sh with cuda_kernels_test
# running BODY must exit non-zero and print PATTERN.
expect_failure() {
  local name="$1" body="$2" pattern="$3" why=""
  fake_build "$WORK/$name/build" "$body"
  run_check "$name"
  local out="$WORK/$name/out"
  if ((RC == 0)); then why="exited 0"
  elif ! grep -q "DEVICE-CHECK FAILED: .*$pattern" "$LOG"; then why="no 'DEVICE-CHECK FAILED: ...$pattern' line"
  elif ! why="$(out_files_ok "$out")"; then :
  elif ! tail -n 3 "$LOG" | grep -q 'RESULT: FAIL'; then why="the last lines are not the summary's RESULT: FAIL"
  fi
  report "$name" "$why" "$(grep -m 1 'DEVICE-CHECK FAILED' "$LOG" || true)"
}

# The issue's case: a kernel fault makes the binary exit 2 with no FAIL line.
expect_failure exit2 'echo "running attention cases"; exit 2' \
  'cuda_kernels_test: exit status 2, 0 FAIL lines (no FAIL line: crashed or aborted)'
# A segfault (signal 11), a hang past the timeout, FAIL lines with exit 0, a SKIP.
expect_failure segv 'kill -SEGV $$' 'cuda_kernels_test: killed by signal 11 (SIGSEGV)'
expect_failure hang 'sleep 60' 'cuda_kernels_test: timed out after 5s'
expect_failure fail_exit0 'echo "FAIL decode D=128"; exit 0' 'cuda_kernels_test reported failures'
expect_failure skip 'echo "SKIP: no CUDA device"; exit 0' 'cuda_kernels_test skipped'
# The tests pass but the benchmark is missing: the script still fails loudly.
name=no_bench
fake_build "$WORK/$name/build" 'echo "10 passed, 0 failed"'
rm "$WORK/$name/build/cuda/bench/cuda_bench"
run_check "$name"
why=""
if ((RC == 0)); then why="exited 0"
elif ! grep -q 'DEVICE-CHECK FAILED: benchmark binary .*cuda_bench is missing' "$LOG"; then why="no 'benchmark binary ... missing' line"
elif ! why="$(out_files_ok "$WORK/$name/out")"; then :
fi
report "$name" "$why" "$(grep -m 1 'DEVICE-CHECK FAILED' "$LOG" || true)"

# Everything passes: exit 0, and the figures made from the benchmarks' rows.
name=pass
fake_build "$WORK/$name/build" 'echo "10 passed, 0 failed"'
run_check "$name"
out="$WORK/$name/out"
why=""
if ((RC != 0)); then why="exited $RC"
elif ! why="$(out_files_ok "$out")"; then :
elif ! grep -q 'RESULT: PASS' "$out/summary.txt"; then why="no RESULT: PASS in summary.txt"
elif ! grep -q 'FlashInfer GQA 4:1: decode 64 x 8k .* = 81.4% of copy' "$out/summary.txt"; then why="no FlashInfer decode headline"
elif ! grep -q 'FlashInfer GQA 8:1: .*prefill 8k over 32k .* = 57.7% of matmul' "$out/summary.txt"; then why="no FlashInfer prefill headline"
elif ! grep -q 'host us per decode iteration, batch 64: 210 eager, 40 with graphs' "$out/summary.txt"; then why="no host-time headline"
elif ! grep -q 'cuda_e2e_test: fake agreement 99%' "$out/summary.txt"; then why="the e2e test's figure is not in the summary"
elif ! grep -q '"decode_attention_gbps": 3500.0' "$out/summary.txt"; then why="the measured profile is not the FlashInfer rows' median"
elif ! grep -q '"gemm_kernel_ms": 0.006' "$out/summary.txt" || ! grep -q '"gemm_weight_gbps": 4003.2' "$out/summary.txt"; then
  why="the measured profile lacks the GEMM kernel cost and streaming rate solved from the two 1-token GEMMs"
elif ! grep -q '"attention_kernel_ms": 0.0118' "$out/summary.txt"; then why="the measured profile lacks the attention kernels' fixed cost"
elif ! grep -q '"elementwise_kernel_ms": 0.0031' "$out/summary.txt" || ! grep -q '"elementwise_gbps": 2580.5' "$out/summary.txt"; then
  why="the measured profile lacks the element-wise kernel cost and rate"
elif ! grep -q 'not asked: .*cuda_kernels_test --full (FULL=0)' "$out/summary.txt"; then why="the summary does not say the long sweep was not asked"
elif ! grep -q 'FlashInfer (production)' "$out/table.txt" || ! grep -q 'GQA 8:1' "$out/table.txt"; then why="table.txt lacks the FlashInfer tables"
elif ! grep -q 'MLA attention (FlashInfer' "$out/table.txt" || ! grep -q 'error (plan refused)' "$out/table.txt"; then why="table.txt lacks the MLA rows"
elif ! tar -xzOf "$out/device-check.tar.gz" ./measured.json | grep -q '"prefill_attention_tflops": 450.0'; then why="no measured.json in the archive"
fi
report "$name" "$why" "$(grep -m 1 'FlashInfer GQA 4:1' "$out/summary.txt" 2>/dev/null || true)"

# A step that overruns the budget: stopped at the budget, the rest skipped and
# named, exit non-zero, all within the budget (plus the kill grace). (20 s:
# the kernel test needs 15 s of budget to start.)
name=budget
fake_build "$WORK/$name/build" 'sleep 60'
t0=$SECONDS
run_check "$name" BUDGET=20 RESERVE=2 TEST_TIMEOUT=300
took=$((SECONDS - t0))
out="$WORK/$name/out"
why=""
if ((RC == 0)); then why="exited 0"
elif ! grep -q 'DEVICE-CHECK FAILED: cuda_kernels_test: overran the budget' "$LOG"; then why="no 'overran the budget' failure"
elif ! grep -q 'SKIPPED (budget): test cuda_e2e_test' "$out/summary.txt"; then why="the summary does not name the skipped e2e test"
elif ! grep -q 'SKIPPED (budget): benchmark cuda_bench' "$out/summary.txt"; then why="the summary does not name the skipped benchmark"
elif ! grep -q 'FAILED: .* step(s) skipped for the budget' "$out/summary.txt"; then why="no failure line for the skipped steps"
elif ((took > 20 + 10)); then why="took ${took}s with BUDGET=20"
elif ! why="$(out_files_ok "$out")"; then :
fi
report "$name" "$why" "stopped in ${took}s; $(grep -c 'SKIPPED (budget)' "$out/summary.txt" 2>/dev/null || true) steps skipped"

# SIGKILL mid-way (the device tool's limit): $OUT already holds the summary of
# the finished steps, the step in progress, and a readable archive.
name=sigkill
fake_build "$WORK/$name/build" 'echo "10 passed, 0 failed"' 'sleep 60'
out="$WORK/$name/out"
LOG="$WORK/$name.log"
RC=0
setsid env PATH="$WORK/bin:$PATH" PYTHON=python3 CUDACXX="$WORK/bin/nvcc" SKIP_BUILD=1 SMOLLM2=0 SDPA=0 TEST_TIMEOUT=120 \
  CARRY_DIR="$WORK/no-carry" BUILD_DIR="$WORK/$name/build" OUT="$out" "$ROOT/scripts/device-check.sh" >"$LOG" 2>&1 &
pid=$!
for _ in $(seq 1 300); do
  grep -q 'RUNNING: test cuda_graphs_test' "$out/summary.txt" 2>/dev/null && break
  sleep 0.1
done
# Everything in the check's session at once (the device tool kills the whole
# command; timeout(1) puts its children in process groups of their own).
sid="$(ps -o sid= -p "$pid" | tr -d ' ' || true)"
why=""
if [[ "$sid" != "$pid" ]]; then
  why="device-check.sh (pid $pid) does not lead its own session (sid '$sid')"
  kill -KILL "$pid" 2>/dev/null || true
else
  # shellcheck disable=SC2046
  kill -KILL $(ps -o pid= --sid "$sid") 2>/dev/null || true
fi
wait "$pid" 2>/dev/null || RC=$?
if [[ -n "$why" ]]; then :
elif ((RC != 137)); then why="not killed by SIGKILL (exit status $RC)"
elif ! grep -q 'PASS cuda_kernels_test' "$out/summary.txt" || ! grep -q 'PASS cuda_e2e_test' "$out/summary.txt"; then
  why="\$OUT/summary.txt lacks the finished steps"
elif ! grep -q 'RUNNING: test cuda_graphs_test' "$out/summary.txt"; then why="\$OUT/summary.txt does not name the step in progress"
elif ! grep -q 'NOT YET RUN: .*benchmark cuda_bench' "$out/summary.txt"; then why="\$OUT/summary.txt does not name the steps to come"
elif grep -q 'RESULT:' "$out/summary.txt"; then why="a killed check wrote a RESULT line?"
elif ! why="$(out_files_ok "$out")"; then :
fi
report "$name" "$why" "killed during the graphs test; \$OUT/summary.txt: $(grep -c '^PASS' "$out/summary.txt" 2>/dev/null || true) PASS lines"

if ((failures > 0)); then
  echo "test-device-check: $failures case(s) failed"
  exit 1
fi
echo "test-device-check: all cases passed"
