#!/usr/bin/env bash
# Installs a CUDA 13 compiler and the libraries the CUDA backend links against
# (cudart, cuBLAS/cuBLASLt, NCCL) from NVIDIA's PyPI wheels into a fixed
# prefix, for compile-and-link checks on machines without a GPU or a system
# CUDA toolkit (CI, developer machines).
#
#   scripts/install-cuda.sh            # installs into $LOCKSTEP_CUDA_HOME
#   eval "$(scripts/install-cuda.sh --env)"   # also exports the paths
#
# Idempotent: a prefix whose stamp matches the pinned set is reused as is.
# The wheels put everything under <site>/nvidia/cu13/{bin,include,lib} (NCCL
# under nvidia/nccl/); this script adds the unversioned library names the
# linker needs (libcudart.so, libcublas.so, libcublasLt.so, libnccl.so) and a
# small env file with the paths CMake needs:
#   CUDACXX / CMAKE_CUDA_COMPILER   <prefix>/cuda/bin/nvcc
#   CUDAToolkit_ROOT                <prefix>/cuda
#   LOCKSTEP_NCCL_ROOT              <prefix>/nccl
#
# The versions are pinned to the CUDA 13.0 line, the one the H200 machines'
# driver (580) and nvcc (13.0) speak, so that what CI compiles is what the
# device check compiles there.
set -euo pipefail

PREFIX="${LOCKSTEP_CUDA_HOME:-/opt/lockstep-cuda}"
PYTHON="${PYTHON:-python3}"

# Pinned set (check with `pip index versions NAME`). Change them together.
PINS=(
  nvidia-cuda-nvcc==13.0.88
  nvidia-cuda-crt==13.0.88
  nvidia-nvvm==13.0.88
  nvidia-cuda-runtime==13.0.96
  nvidia-cuda-cccl==13.0.85
  nvidia-cublas==13.0.2.14
  nvidia-nccl-cu13==2.28.9
)
STAMP_TEXT="${PINS[*]}"

print_env() {
  cat "$PREFIX/env.sh"
}

if [[ -f "$PREFIX/.stamp" && "$(cat "$PREFIX/.stamp")" == "$STAMP_TEXT" && -x "$PREFIX/cuda/bin/nvcc" ]]; then
  echo "install-cuda: reusing $PREFIX" >&2
else
  echo "install-cuda: installing ${PINS[*]} into $PREFIX" >&2
  rm -rf "$PREFIX.tmp"
  mkdir -p "$PREFIX.tmp"
  # --no-deps: the pins are the whole set; their own dependency metadata pulls
  # in meta-packages (cuda-toolkit, ...) that we do not want. --target keeps
  # the install out of every Python environment.
  "$PYTHON" -m pip install --quiet --disable-pip-version-check --no-deps --no-compile \
    --target "$PREFIX.tmp/site" "${PINS[@]}"
  rm -rf "$PREFIX"
  mv "$PREFIX.tmp" "$PREFIX"
  site="$PREFIX/site/nvidia"
  [[ -x "$site/cu13/bin/nvcc" ]] || { echo "install-cuda: nvcc not found under $site/cu13/bin" >&2; exit 1; }
  # Stable paths that do not depend on the wheels' internal layout.
  ln -sfn "$site/cu13" "$PREFIX/cuda"
  ln -sfn "$site/nccl" "$PREFIX/nccl"
  # The wheels ship only versioned sonames (libcudart.so.13, ...); the linker
  # looks for the unversioned development names.
  for dir in "$PREFIX/cuda/lib" "$PREFIX/nccl/lib"; do
    for lib in "$dir"/lib*.so.[0-9]*; do
      [[ -e "$lib" ]] || continue
      base="$(basename "$lib")"
      dev="${base%%.so.*}.so"
      [[ -e "$dir/$dev" ]] || ln -s "$base" "$dir/$dev"
    done
  done
  # CMake's FindCUDAToolkit looks for lib64/ beside bin/; the wheels use lib/.
  [[ -e "$PREFIX/cuda/lib64" ]] || ln -s lib "$PREFIX/cuda/lib64"
  cat >"$PREFIX/env.sh" <<EOF
export LOCKSTEP_CUDA_HOME="$PREFIX"
export CUDACXX="$PREFIX/cuda/bin/nvcc"
export CUDAToolkit_ROOT="$PREFIX/cuda"
export LOCKSTEP_NCCL_ROOT="$PREFIX/nccl"
export PATH="$PREFIX/cuda/bin:\$PATH"
EOF
  echo "$STAMP_TEXT" >"$PREFIX/.stamp"
fi

"$PREFIX/cuda/bin/nvcc" --version | tail -n 2 >&2
if [[ "${1:-}" == "--env" ]]; then print_env; fi
