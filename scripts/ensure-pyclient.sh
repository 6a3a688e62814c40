#!/usr/bin/env bash
# ensure-pyclient.sh: a Python virtual environment with the official openai
# client (pinned) for the serving integration test. Prints the interpreter.
#   scripts/ensure-pyclient.sh [DIR]     (default build/pyclient)
set -euo pipefail
cd "$(dirname "$0")/.."
DIR="${1:-build/pyclient}"
PY="${PYTHON:-python3}"
if [ ! -x "$DIR/bin/python" ] || ! "$DIR/bin/python" -c 'import openai, sys; sys.exit(openai.__version__ != "3.51.0")' 2>/dev/null; then
  rm -rf "$DIR"
  "$PY" -m venv "$DIR" >&2
  "$DIR/bin/pip" install --quiet --disable-pip-version-check openai==3.51.0 >&2
fi
echo "$(cd "$DIR" && pwd)/bin/python"
