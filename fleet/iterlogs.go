package fleet

import (
	"fmt"
	"strconv"
	"strings"
)

// selectLogRanks parses TLLM_PROFILE_LOG_RANKS (executor.md §13.1): unset or
// empty → rank 0; "all" → every rank; otherwise a comma-separated list of
// ranks (spaces ignored). Entries that are not non-negative integers, and
// ranks outside the world of ranks, are ignored with one warning: the spec
// asks for a warning rather than an error, and a list written for a larger
// deployment should not stop a smaller one.
func selectLogRanks(v string, ranks int) (sel []bool, warning string) {
	sel = make([]bool, ranks)
	v = strings.TrimSpace(v)
	switch {
	case v == "":
		sel[0] = true
	case v == "all":
		for i := range sel {
			sel[i] = true
		}
	default:
		var bad, outside []string
		for _, f := range strings.Split(v, ",") {
			f = strings.TrimSpace(f)
			n, err := strconv.Atoi(f)
			switch {
			case err != nil || n < 0:
				bad = append(bad, strconv.Quote(f))
			case n >= ranks:
				outside = append(outside, f)
			default:
				sel[n] = true
			}
		}
		var parts []string
		if len(bad) > 0 {
			parts = append(parts, "ignoring entries that are not non-negative integers: "+strings.Join(bad, ", "))
		}
		if len(outside) > 0 {
			parts = append(parts, fmt.Sprintf("ignoring ranks outside the world of %d (ranks 0–%d): %s",
				ranks, ranks-1, strings.Join(outside, ", ")))
		}
		if len(parts) > 0 {
			warning = "TLLM_PROFILE_LOG_RANKS=" + strconv.Quote(v) + ": " + strings.Join(parts, "; ")
			if !anySelected(sel) {
				warning += "; no rank writes an iteration log"
			}
		}
	}
	return sel, warning
}

func anySelected(sel []bool) bool {
	for _, s := range sel {
		if s {
			return true
		}
	}
	return false
}

// iterLogPaths maps each selected rank to its --iter-log path ("{rank}"
// replaced by the rank; "" for ranks not logged by this process). only >= 0
// keeps that rank alone (one rank per process): several processes then need
// "{rank}" in the path, or they would truncate each other's file.
func iterLogPaths(path string, chosen []bool, only int) ([]string, error) {
	out := make([]string, len(chosen))
	if path == "" {
		return out, nil
	}
	if only >= 0 {
		n := 0
		for _, c := range chosen {
			if c {
				n++
			}
		}
		if n > 1 && path != "-" && !strings.Contains(path, "{rank}") {
			return nil, fmt.Errorf("--iter-log %q: %d processes would write one file; put {rank} in the path", path, n)
		}
	}
	for r, c := range chosen {
		if c && (only < 0 || r == only) {
			out[r] = strings.ReplaceAll(path, "{rank}", strconv.Itoa(r))
		}
	}
	return out, nil
}
