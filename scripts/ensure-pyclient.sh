#!/usr/bin/env bash
# ensure-pyclient.sh: the official openai Python client, msgspec and pyzmq
# (pinned; the serving and KV event integration tests), installed
# from the package registry into DIR (default build/pyclient) for the serving
# integration test. Prints the interpreter to run it with: DIR's venv, or,
# where the venv module is missing (Debian without python3-venv), python3
# with the package installed by pip --target (the test sets PYTHONPATH from
# the second line printed).
set -euo pipefail
cd "$(dirname "$0")/.."
DIR="${1:-build/pyclient}"
PY="${PYTHON:-python3}"
VERSION=3.51.0
# The KV event consumer (tests/kv_events_consumer.py): vLLM's own decoding
# stack, msgspec and pyzmq (pure wheels for CPython 3.8+ on x86-64/arm64).
MSGSPEC=0.19.0
PYZMQ=26.4.0
PKGS=("openai==$VERSION" "msgspec==$MSGSPEC" "pyzmq==$PYZMQ")
ok() {
  "$@" -c "import openai, msgspec, zmq, sys; sys.exit(openai.__version__ != '$VERSION' or msgspec.__version__ != '$MSGSPEC' or zmq.__version__ != '$PYZMQ')" 2>/dev/null
}
abs() { echo "$(cd "$1" && pwd)"; }
if [ -x "$DIR/bin/python" ] && ok "$DIR/bin/python"; then
  echo "$(abs "$DIR")/bin/python"; exit 0
fi
if [ -d "$DIR/site" ] && PYTHONPATH="$DIR/site" ok "$PY"; then
  echo "$PY"; echo "$(abs "$DIR")/site"; exit 0
fi
rm -rf "$DIR"
if "$PY" -m venv "$DIR" >&2 2>/dev/null; then
  "$DIR/bin/pip" install --quiet --disable-pip-version-check --only-binary=:all: "${PKGS[@]}" >&2
  echo "$(abs "$DIR")/bin/python"
else
  rm -rf "$DIR"
  mkdir -p "$DIR/site"
  "$PY" -m pip install --quiet --disable-pip-version-check --only-binary=:all: --target "$DIR/site" "${PKGS[@]}" >&2
  echo "$PY"; echo "$(abs "$DIR")/site"
fi
