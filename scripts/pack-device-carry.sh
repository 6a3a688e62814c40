#!/usr/bin/env bash
# Packs what scripts/device-check.sh needs from a machine with network and Go
# into device-carry/ (git-ignored), small enough for the device tool's 64 MiB
# carry limit (the tree itself is ~5 MB):
#   device-carry/flashinfer-headers.tar.xz  FlashInfer, CUTLASS, CCCL and curand
#                                           headers (56 MB unpacked, ~3 MB)
#   device-carry/worker.xz                  bin/worker linked against the CUDA
#                                           libengine of build-cuda (~13 MB)
#   device-carry/SHA256SUMS                 what device-check verifies after unpacking
# device-check.sh unpacks them (with python3's lzma: no xz needed there) when
# LOCKSTEP_FLASHINFER_ROOT is unset and bin/worker is missing. The SmolLM2 GGUF
# (98 MB) does not fit; the device check's SmolLM2 step needs MODEL_GGUF there.
# Last, scripts/carry-size.sh measures what the device run would carry (the
# tree and device-carry/) and fails above 60 MiB (the tool's limit is 64).
#
#   scripts/pack-device-carry.sh     # then the device run of docs/cuda.md
#                                    # ("Device check": carry ["device-carry"])
#   REUSE_BUILD=1 ...                # use BUILD_DIR as it is (CI, right after
#                                    # scripts/ci-cuda-compile.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR="${BUILD_DIR:-build-cuda}"
OUTDIR=device-carry
eval "$(scripts/install-cuda.sh --env)"
# Brings the CUDA build up to date (incremental after the first time).
if [[ "${REUSE_BUILD:-0}" == 1 ]]; then
  [[ -f "$BUILD_DIR/native/libengine.a" ]] || { echo "pack-device-carry: REUSE_BUILD=1 but no $BUILD_DIR/native/libengine.a" >&2; exit 1; }
else
  BUILD_DIR="$BUILD_DIR" scripts/ci-cuda-compile.sh >&2
fi
rm -rf "$OUTDIR"
mkdir -p "$OUTDIR"
tree="$(mktemp -d)"
trap 'rm -rf "$tree"' EXIT
# The worker, built against this CUDA library (as ci-cuda-compile.sh does).
git ls-files -z | tar --null -cf - -T - | tar -xf - -C "$tree"
mkdir -p "$tree/build" && ln -s "$(cd "$BUILD_DIR" && pwd)/native" "$tree/build/native"
(cd "$tree" && CGO_CFLAGS="-O2 -Wno-deprecated-declarations" go build -tags native -ldflags "-s -w" -o "$tree/worker" ./cmd/worker)
python3 - "$tree/worker" "$OUTDIR/worker.xz" "$LOCKSTEP_FLASHINFER_ROOT" "$OUTDIR/flashinfer-headers.tar.xz" <<'PY'
import lzma, sys, tarfile
worker, worker_xz, fi_root, fi_xz = sys.argv[1:]
with open(worker, "rb") as f, lzma.open(worker_xz, "wb", preset=6) as g:
    g.write(f.read())
with tarfile.open(fi_xz, "w:xz") as t:
    t.add(fi_root, arcname="flashinfer")
PY
(cd "$tree" && sha256sum worker) >"$OUTDIR/SHA256SUMS"
# Round trip, the way device-check.sh unpacks it.
mkdir -p "$tree/check"
python3 -c 'import lzma, sys; open(sys.argv[2], "wb").write(lzma.open(sys.argv[1]).read())' "$OUTDIR/worker.xz" "$tree/check/worker"
(cd "$tree/check" && sha256sum -c "$OLDPWD/$OUTDIR/SHA256SUMS" >/dev/null) ||
  { echo "pack-device-carry: worker.xz does not unpack to the worker" >&2; exit 1; }
python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1], "r:xz").extractall(sys.argv[2])' "$OUTDIR/flashinfer-headers.tar.xz" "$tree/check"
[[ -f "$tree/check/flashinfer/include/flashinfer/attention/decode.cuh" ]] ||
  { echo "pack-device-carry: the header archive lacks flashinfer/include/flashinfer/attention/decode.cuh" >&2; exit 1; }
echo "pack-device-carry: $(du -sh "$OUTDIR" | cut -f1) in $OUTDIR/ ($(cd "$OUTDIR" && du -h -- * | awk '{printf "%s%s %s", (NR > 1 ? ", " : ""), $1, $2}'))"
scripts/carry-size.sh "$OUTDIR"
