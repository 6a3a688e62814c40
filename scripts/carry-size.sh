#!/usr/bin/env bash
# Measures what a device run would carry, the way the device tool counts it
# (docs/cuda.md, "Device check"): the working tree (tracked files and
# untracked files git does not ignore, and shared/ if the checkout has one)
# plus the ignored paths named in `carry` (the arguments), in bytes as
# stored. Prints the sizes and fails when the total exceeds LIMIT_MIB
# (default 60: the tool refuses more than 64 MiB, and a margin keeps the
# check from failing on the device side for a few added files).
#
#   scripts/carry-size.sh device-carry        # what pack-device-carry.sh runs
#   LIMIT_MIB=64 scripts/carry-size.sh DIR... # another limit
set -euo pipefail
cd "$(dirname "$0")/.."
LIMIT_MIB="${LIMIT_MIB:-60}"
[[ "$LIMIT_MIB" =~ ^[0-9]+$ ]] || { echo "carry-size: LIMIT_MIB must be a whole number, got '$LIMIT_MIB'" >&2; exit 2; }
for d in "$@"; do
  [[ -e "$d" ]] || { echo "carry-size: $d does not exist (run scripts/pack-device-carry.sh first)" >&2; exit 2; }
done
git ls-files -z --cached --others --exclude-standard | python3 -c '
import os, sys
limit_mib = int(sys.argv[1])
carried = sys.argv[2:]
seen = set()
def size(paths):
    total = 0
    for p in paths:
        p = os.path.normpath(p)
        if p in seen or not os.path.lexists(p) or os.path.isdir(p) and not os.path.islink(p):
            continue
        seen.add(p)
        total += os.lstat(p).st_size
    return total
def files(top):
    if os.path.isfile(top) or os.path.islink(top):
        return [top]
    return [os.path.join(d, f) for d, _, fs in os.walk(top) for f in fs]
tree = size(p for p in sys.stdin.read().split("\0") if p)
if os.path.isdir("shared"):
    tree += size(files("shared"))
parts = [(c, size(files(c))) for c in carried]
total = tree + sum(b for _, b in parts)
mib = lambda b: f"{b / 2**20:.1f} MiB"
print("carry-size: tree " + mib(tree) + "".join(f" + {c} {mib(b)}" for c, b in parts) + f" = {mib(total)}"
      f" (the device tool carries at most 64 MiB; limit here {limit_mib} MiB)")
if total > limit_mib * 2**20:
    print(f"carry-size: {mib(total)} exceeds {limit_mib} MiB: carry less (or compress more)", file=sys.stderr)
    sys.exit(1)
' "$LIMIT_MIB" "$@"
