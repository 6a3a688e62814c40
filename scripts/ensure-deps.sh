#!/usr/bin/env bash
# Installs the build tools lockstep needs when they are missing (Debian/Ubuntu,
# as root or with sudo): a C++17 compiler, CMake, Ninja and Open MPI. Go 1.26 must be on
# PATH already (https://go.dev/dl); Go modules come from the module proxy.
set -euo pipefail
missing=()
command -v cmake >/dev/null || missing+=(cmake)
command -v ninja >/dev/null || missing+=(ninja-build)
command -v g++ >/dev/null || missing+=(g++)
command -v make >/dev/null || missing+=(make)
# Open MPI: the engine's MPI communicator (ENGINE_MPI) and the mpirun tests.
command -v mpirun >/dev/null || missing+=(openmpi-bin)
command -v mpicc >/dev/null || missing+=(libopenmpi-dev)
if ((${#missing[@]})); then
  echo "ensure-deps: installing ${missing[*]}" >&2
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}"
fi
command -v go >/dev/null || { echo "ensure-deps: Go 1.26 is required on PATH" >&2; exit 1; }
# The Python clients of the integration tests (openai, msgspec, pyzmq; pinned in
# scripts/ensure-pyclient.sh): installed when missing, quickly when present. Where they cannot
# be installed (no network), the tests that need them skip with a message; under CI
# (LOCKSTEP_REQUIRE_MODEL=1) they fail instead.
if command -v python3 >/dev/null; then
  scripts/ensure-pyclient.sh >/dev/null ||
    echo "ensure-deps: the Python test clients could not be installed (scripts/ensure-pyclient.sh); their tests will skip outside CI" >&2
fi
