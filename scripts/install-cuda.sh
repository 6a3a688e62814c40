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
#
# FlashInfer (the attention kernels, header-only) goes into <prefix>/flashinfer
# with its own stamp, from wheels pinned by version and sha256; only headers
# are extracted (about 55 MB):
#   include/              flashinfer-python's flashinfer/data/include
#   cutlass/include, cutlass/tools/util/include   its CUTLASS (the sm_90a FA3 path)
#   cccl/                 nvidia-cuda-cccl 13.2's include/cccl: FlashInfer needs newer
#                         CCCL than nvcc 13.0 ships; it goes FIRST on the include path
#   curand/include/       nvidia-curand's headers (CUTLASS utilities include curand_kernel.h)
#   LOCKSTEP_FLASHINFER_ROOT=<prefix>/flashinfer   (in the env file)
#   scripts/install-cuda.sh --headers-only   installs only these (for carrying to
#                                            a device machine without network)
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

# FlashInfer and the headers it needs: "name==version sha256" of each wheel.
FI_WHEELS=(
  "flashinfer-python==0.7.2.post1 bfdc18b9e1e4d8d0730fe4343dc0e284cd0c160086de80f99888bc4867922d49"
  "nvidia-cuda-cccl==13.2.86 35da671cf0cecd3539da214a11bb8e7634366c9e950da9c5feecf6c490a65b20"
  "nvidia-curand==10.4.5.25 22bb226a857e5888fe6b54ae465fc4371296bcff13a35f79e19691bcf454f529"
)
FI_STAMP="${FI_WHEELS[*]}"

# Installs the FlashInfer headers into $PREFIX/flashinfer unless its stamp
# matches. pip verifies every wheel against its pinned sha256
# (--require-hashes); only header trees are extracted.
install_flashinfer() {
  local dest="$PREFIX/flashinfer"
  if [[ -f "$dest/.stamp" && "$(cat "$dest/.stamp")" == "$FI_STAMP" ]]; then
    echo "install-cuda: reusing $dest" >&2
    return
  fi
  echo "install-cuda: installing FlashInfer headers into $dest" >&2
  local tmp
  tmp="$(mktemp -d)"
  local req="$tmp/requirements.txt" w
  for w in "${FI_WHEELS[@]}"; do echo "${w% *} --hash=sha256:${w#* }" >>"$req"; done
  "$PYTHON" -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
    --require-hashes -r "$req" -d "$tmp/wheels"
  rm -rf "$dest.tmp"
  mkdir -p "$dest.tmp"
  "$PYTHON" - "$tmp/wheels" "$dest.tmp" <<'PY'
import glob, os, sys, zipfile
wheels, dest = sys.argv[1], sys.argv[2]
# (wheel name prefix, path prefix inside the wheel, destination directory)
trees = [("flashinfer_python", "flashinfer/data/include/", "include"),
         ("flashinfer_python", "flashinfer/data/cutlass/include/", "cutlass/include"),
         ("flashinfer_python", "flashinfer/data/cutlass/tools/util/include/", "cutlass/tools/util/include"),
         ("nvidia_cuda_cccl", "nvidia/cu13/include/cccl/", "cccl"),
         ("nvidia_curand", "nvidia/cu13/include/", "curand/include")]
for wheel_prefix, inner, out in trees:
    found = glob.glob(os.path.join(wheels, wheel_prefix + "-*.whl"))
    if len(found) != 1:
        sys.exit(f"install-cuda: expected one {wheel_prefix} wheel, found {found}")
    n = 0
    with zipfile.ZipFile(found[0]) as z:
        for name in z.namelist():
            if name.startswith(inner) and not name.endswith("/"):
                target = os.path.join(dest, out, name[len(inner):])
                os.makedirs(os.path.dirname(target), exist_ok=True)
                with z.open(name) as src, open(target, "wb") as dst:
                    dst.write(src.read())
                n += 1
    if n == 0:
        sys.exit(f"install-cuda: {found[0]} has nothing under {inner}")
PY
  [[ -f "$dest.tmp/include/flashinfer/attention/decode.cuh" && -f "$dest.tmp/curand/include/curand_kernel.h" ]] ||
    { echo "install-cuda: FlashInfer headers incomplete in $dest.tmp" >&2; exit 1; }
  echo "$FI_STAMP" >"$dest.tmp/.stamp"
  rm -rf "$dest"
  mv "$dest.tmp" "$dest"
  rm -rf "$tmp"
}

if [[ "${1:-}" == "--headers-only" ]]; then
  mkdir -p "$PREFIX"
  install_flashinfer
  echo "export LOCKSTEP_FLASHINFER_ROOT=\"$PREFIX/flashinfer\""
  exit 0
fi

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
install_flashinfer
grep -q LOCKSTEP_FLASHINFER_ROOT "$PREFIX/env.sh" ||
  echo "export LOCKSTEP_FLASHINFER_ROOT=\"$PREFIX/flashinfer\"" >>"$PREFIX/env.sh"

"$PREFIX/cuda/bin/nvcc" --version | tail -n 2 >&2
if [[ "${1:-}" == "--env" ]]; then print_env; fi
