#!/usr/bin/env bash
# CI check of the CUDA and NCCL code: compile and link only (CI has no GPU).
#
# Installs the pinned CUDA 13 toolchain from PyPI wheels (install-cuda.sh),
# configures a separate build directory with ENGINE_CUDA=ON ENGINE_NCCL=ON for
# sm_90, sm_90a and sm_100 machine code plus compute_90 PTX, builds
# libengine.a, the CUDA tests and the benchmarks (which link cudart,
# cuBLAS/cuBLASLt and NCCL), and runs the CUDA tests, which print "SKIP: no
# CUDA device" here.
#
# sm_90a is what scripts/device-check.sh builds on the H200 (its only
# target), so every unit -- FlashInfer's, the engine's, the tests' and the
# benchmarks' -- is compiled for it here too: FlashInfer and CUTLASS headers
# take other paths under __CUDA_ARCH_FEAT_SM90_ALL, and a unit that fails
# only there must fail in CI, not in the device run's budget. It is one more
# -gencode on the same build (each unit still compiles once on the host side;
# the units compile in parallel, JOBS at a time), not a second build.
# About 5 minutes on 2 cores after the first install (~1 GiB of wheels plus
# the FlashInfer headers): the FlashInfer attention units (decode for head
# dims 64/128, causal paged prefill for 64/128 x query tiles 16/64/128) are
# most of it.
#
#   BUILD_DIR   build directory (default build-cuda)
#   JOBS        parallel compile jobs (default: the number of CPUs)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR="${BUILD_DIR:-build-cuda}"
JOBS="${JOBS:-$(nproc)}"

eval "$(scripts/install-cuda.sh --env)"

cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DENGINE_CUDA=ON -DENGINE_NCCL=ON \
  -DCMAKE_CUDA_COMPILER="$CUDACXX" -DCUDAToolkit_ROOT="$CUDAToolkit_ROOT" \
  -DLOCKSTEP_NCCL_ROOT="$LOCKSTEP_NCCL_ROOT" \
  "-DLOCKSTEP_CUDA_GENCODE=-gencode=arch=compute_90,code=sm_90;-gencode=arch=compute_90a,code=sm_90a;-gencode=arch=compute_100,code=sm_100;-gencode=arch=compute_90,code=compute_90"
cmake --build "$BUILD_DIR" -j "$JOBS"

# The archive must hold the CUDA backend, and the test binaries must have
# resolved the CUDA libraries (link only: nothing runs on a device here).
# (grep without -q: an early exit would SIGPIPE nm and trip pipefail.)
syms="$(nm -C "$BUILD_DIR/native/libengine.a")"
for sym in 'lockstep::make_cuda_backend' 'lockstep::FlashInferAttention::run' 'lockstep::open_nccl_comm' \
  'flashinfer::BatchDecodeWithPagedKVCacheDispatched<128u' 'flashinfer::BatchPrefillWithPagedKVCacheDispatched<true, 64u, 64u'; do
  grep -F "$sym" >/dev/null <<<"$syms" || { echo "ci-cuda-compile: libengine.a lacks $sym" >&2; exit 1; }
done
for exe in cuda/tests/cuda_kernels_test cuda/tests/cuda_e2e_test cuda/tests/cuda_graphs_test \
  cuda/tests/cuda_nccl_test cuda/bench/cuda_bench cuda/bench/cuda_graph_bench; do
  [[ -x "$BUILD_DIR/$exe" ]] || { echo "ci-cuda-compile: $exe was not linked" >&2; exit 1; }
done
# Every CUDA unit was compiled for sm_90a (the device check's target): each
# nvcc command of the build names it. (The pinned toolchain has no cuobjdump
# to read the objects back.)
nvcc_units="$(ninja -C "$BUILD_DIR" -t commands | grep -c -- '-x cu -c' || true)"
without="$(ninja -C "$BUILD_DIR" -t commands | grep -- '-x cu -c' | grep -v -c -- 'code=sm_90a' || true)"
((nvcc_units > 0 && without == 0)) ||
  { echo "ci-cuda-compile: $without of $nvcc_units CUDA units are not compiled for sm_90a" >&2; exit 1; }
echo "ci-cuda-compile: all $nvcc_units CUDA units compiled for sm_90a (and sm_90, sm_100, compute_90 PTX)"
LD_LIBRARY_PATH="$CUDAToolkit_ROOT/lib:$LOCKSTEP_NCCL_ROOT/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
  ctest --test-dir "$BUILD_DIR" --output-on-failure -R '^cuda_'

# The Go worker links the CUDA-enabled library too: cgo links
# build/native/libengine_link.so, so build a copy of the tree whose
# build/native is this build's, and ask the binary which backends it has.
if command -v go >/dev/null; then
  tree="$(mktemp -d)"
  trap 'rm -rf "$tree"' EXIT
  git ls-files -z | tar --null -cf - -T - | tar -xf - -C "$tree"
  mkdir -p "$tree/build" && ln -s "$(cd "$BUILD_DIR" && pwd)/native" "$tree/build/native"
  (cd "$tree" && CGO_CFLAGS="-O2 -Wno-deprecated-declarations" go build -tags native -o "$tree/worker" ./cmd/worker)
  # (Not `tee /dev/stderr`: reopening stderr truncates a log file it points to.)
  info="$(LD_LIBRARY_PATH="$CUDAToolkit_ROOT/lib:$CUDAToolkit_ROOT/lib64:$LOCKSTEP_NCCL_ROOT/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
    "$tree/worker" info)"
  echo "$info" >&2
  grep 'native: cpu, cuda' >/dev/null <<<"$info" ||
    { echo "ci-cuda-compile: the worker linked against the CUDA library does not report the cuda backend" >&2; exit 1; }
fi
echo "ci-cuda-compile: CUDA and NCCL code compiled and linked (sm_90, sm_90a, sm_100, compute_90 PTX), worker links it"
