#!/usr/bin/env bash
# CI check of the CUDA and NCCL code: compile and link only (CI has no GPU).
#
# Installs the pinned CUDA 13 toolchain from PyPI wheels (install-cuda.sh),
# configures a separate build directory with ENGINE_CUDA=ON ENGINE_NCCL=ON for
# sm_90 and sm_100 machine code plus compute_90 PTX, builds libengine.a, the
# CUDA tests and the benchmark (which link cudart, cuBLAS/cuBLASLt and NCCL),
# and runs the CUDA tests, which print "SKIP: no CUDA device" here.
# About 5 minutes on 2 cores after the first install (~1 GiB of wheels plus
# the FlashInfer headers): the FlashInfer attention units (decode for head
# dims 64/128, causal paged prefill for 64/128 x query tiles 16/64/128, at
# three targets each) are most of it.
#
#   BUILD_DIR   build directory (default build-cuda)
#   JOBS        parallel compile jobs (default 2)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR="${BUILD_DIR:-build-cuda}"
JOBS="${JOBS:-2}"

eval "$(scripts/install-cuda.sh --env)"

cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DENGINE_CUDA=ON -DENGINE_NCCL=ON \
  -DCMAKE_CUDA_COMPILER="$CUDACXX" -DCUDAToolkit_ROOT="$CUDAToolkit_ROOT" \
  -DLOCKSTEP_NCCL_ROOT="$LOCKSTEP_NCCL_ROOT" \
  "-DLOCKSTEP_CUDA_GENCODE=-gencode=arch=compute_90,code=sm_90;-gencode=arch=compute_100,code=sm_100;-gencode=arch=compute_90,code=compute_90"
cmake --build "$BUILD_DIR" -j "$JOBS"

# The archive must hold the CUDA backend, and the test binaries must have
# resolved the CUDA libraries (link only: nothing runs on a device here).
# (grep without -q: an early exit would SIGPIPE nm and trip pipefail.)
syms="$(nm -C "$BUILD_DIR/native/libengine.a")"
for sym in 'lockstep::make_cuda_backend' 'lockstep::FlashInferAttention::run' 'lockstep::open_nccl_comm' \
  'flashinfer::BatchDecodeWithPagedKVCacheDispatched<128u' 'flashinfer::BatchPrefillWithPagedKVCacheDispatched<true, 64u, 64u'; do
  grep -F "$sym" >/dev/null <<<"$syms" || { echo "ci-cuda-compile: libengine.a lacks $sym" >&2; exit 1; }
done
for exe in cuda/tests/cuda_kernels_test cuda/tests/cuda_e2e_test cuda/tests/cuda_nccl_test cuda/bench/cuda_bench; do
  [[ -x "$BUILD_DIR/$exe" ]] || { echo "ci-cuda-compile: $exe was not linked" >&2; exit 1; }
done
LD_LIBRARY_PATH="$CUDAToolkit_ROOT/lib:$LOCKSTEP_NCCL_ROOT/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
  ctest --test-dir "$BUILD_DIR" --output-on-failure -R '^cuda_'

# The Go worker links the CUDA-enabled library too: cgo links
# build/native/libengine_link.so, so build a copy of the tree whose
# build/native is this build's, and ask the binary which backends it has.
if command -v go >/dev/null; then
  tree="$(mktemp -d)"
  trap 'rm -rf "$tree"' EXIT
  git ls-files -z | tar --null -cf - -T - | tar -xf - -C "$tree"
  mkdir -p "$tree/build" && ln -s "$PWD/$BUILD_DIR/native" "$tree/build/native"
  (cd "$tree" && CGO_CFLAGS="-O2 -Wno-deprecated-declarations" go build -tags native -o "$tree/worker" ./cmd/worker)
  # (Not `tee /dev/stderr`: reopening stderr truncates a log file it points to.)
  info="$(LD_LIBRARY_PATH="$CUDAToolkit_ROOT/lib:$CUDAToolkit_ROOT/lib64:$LOCKSTEP_NCCL_ROOT/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
    "$tree/worker" info)"
  echo "$info" >&2
  grep 'native: cpu, cuda' >/dev/null <<<"$info" ||
    { echo "ci-cuda-compile: the worker linked against the CUDA library does not report the cuda backend" >&2; exit 1; }
fi
echo "ci-cuda-compile: CUDA and NCCL code compiled and linked (sm_90, sm_100, compute_90 PTX), worker links it"
