#!/usr/bin/env bash
# Test of scripts/carry-size.sh (ctest carry_size_script): a carry that fits
# passes and prints every part's size; one over the limit (a 61 MiB sparse
# file, counted at its length: what a copy moves) fails naming the limit; a
# bad limit or a missing carry is a usage error.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
failures=0
fail() { echo "FAIL $*"; failures=$((failures + 1)); }

mkdir -p "$WORK/small" "$WORK/big/sub"
head -c $((1 << 20)) /dev/zero >"$WORK/small/one-mib"
truncate -s 61M "$WORK/big/sub/sparse"

rc=0; out="$("$ROOT/scripts/carry-size.sh" "$WORK/small" 2>&1)" || rc=$?
if ((rc != 0)); then fail "small carry: exit $rc: $out"
elif ! grep -q "carry-size: tree [0-9.]* MiB + $WORK/small 1.0 MiB = [0-9.]* MiB" <<<"$out"; then fail "small carry: output '$out'"
else echo "ok   small carry: $out"; fi

rc=0; out="$("$ROOT/scripts/carry-size.sh" "$WORK/small" "$WORK/big" 2>&1)" || rc=$?
if ((rc != 1)); then fail "61 MiB carry: exit $rc (want 1): $out"
elif ! grep -q "exceeds 60 MiB" <<<"$out"; then fail "61 MiB carry: no 'exceeds 60 MiB' in '$out'"
else echo "ok   61 MiB carry refused: $(tail -n 1 <<<"$out")"; fi

rc=0; out="$(LIMIT_MIB=100 "$ROOT/scripts/carry-size.sh" "$WORK/big" 2>&1)" || rc=$?
((rc == 0)) || fail "61 MiB carry under LIMIT_MIB=100: exit $rc: $out"

rc=0; out="$(LIMIT_MIB=lots "$ROOT/scripts/carry-size.sh" "$WORK/small" 2>&1)" || rc=$?
((rc == 2)) && grep -q "LIMIT_MIB must be a whole number" <<<"$out" || fail "bad LIMIT_MIB: exit $rc: $out"
rc=0; out="$("$ROOT/scripts/carry-size.sh" "$WORK/absent" 2>&1)" || rc=$?
((rc == 2)) && grep -q "does not exist" <<<"$out" || fail "missing carry: exit $rc: $out"

if ((failures > 0)); then
  echo "test-carry-size: $failures case(s) failed"
  exit 1
fi
echo "test-carry-size: all cases passed"
