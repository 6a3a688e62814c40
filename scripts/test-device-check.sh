#!/usr/bin/env bash
# Test of scripts/device-check.sh on a machine without a GPU (ctest runs it as
# device_check_script): a fake nvidia-smi and nvcc, and a fake build directory
# whose test binaries misbehave the way a kernel fault does. device-check.sh
# must exit non-zero with a "DEVICE-CHECK FAILED" message naming the binary,
# and leave at most two files in $OUT (the device machine returns 8).
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

# fake_build DIR BODY: a build directory whose cuda_kernels_test runs BODY
# (the other tests pass).
fake_build() {
  local dir="$1" body="$2"
  mkdir -p "$dir/cuda/tests" "$dir/cuda/bench"
  printf '#!/usr/bin/env bash\n%s\n' "$body" >"$dir/cuda/tests/cuda_kernels_test"
  for t in cuda_e2e_test cuda_graphs_test cuda_nccl_test; do
    printf '#!/bin/sh\necho "3 passed, 0 failed"\n' >"$dir/cuda/tests/$t"
  done
  chmod +x "$dir"/cuda/tests/*
}

# expect_failure NAME BODY PATTERN: device-check.sh with cuda_kernels_test
# running BODY must exit non-zero and print PATTERN.
expect_failure() {
  local name="$1" body="$2" pattern="$3"
  local build="$WORK/$name/build" out="$WORK/$name/out" rc=0
  fake_build "$build" "$body"
  mkdir -p "$out"
  PATH="$WORK/bin:$PATH" PYTHON=/bin/false CUDACXX="$WORK/bin/nvcc" SKIP_BUILD=1 SMOLLM2=0 TEST_TIMEOUT=5 \
    CARRY_DIR="$WORK/no-carry" \
    BUILD_DIR="$build" OUT="$out" "$ROOT/scripts/device-check.sh" >"$WORK/$name.log" 2>&1 || rc=$?
  local why=""
  if ((rc == 0)); then why="exited 0"
  elif ! grep -q "DEVICE-CHECK FAILED: .*$pattern" "$WORK/$name.log"; then why="no 'DEVICE-CHECK FAILED: ...$pattern' line"
  elif (($(find "$out" -type f | wc -l) > 2)); then why="more than 2 files in \$OUT: $(ls "$out")"
  elif [[ ! -s "$out/summary.txt" || ! -s "$out/device-check.tar.gz" ]]; then why="summary.txt or device-check.tar.gz missing"
  elif ! tail -n 3 "$WORK/$name.log" | grep -q 'RESULT: FAIL'; then why="the last lines are not the summary's RESULT: FAIL"
  fi
  if [[ -n "$why" ]]; then
    echo "FAIL $name: $why (exit status $rc); output:"
    sed 's/^/    /' "$WORK/$name.log"
    failures=$((failures + 1))
  else
    echo "ok   $name: $(grep -m 1 'DEVICE-CHECK FAILED' "$WORK/$name.log")"
  fi
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
expect_failure no_bench 'echo "10 passed, 0 failed"' 'benchmark binary .*cuda_bench is missing'

if ((failures > 0)); then
  echo "test-device-check: $failures case(s) failed"
  exit 1
fi
echo "test-device-check: all cases passed"
