package main

import (
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"sync"

	"go.uber.org/zap"
)

// selectLogRanks parses TLLM_PROFILE_LOG_RANKS (executor.md §13.1): unset or
// empty → rank 0; "all" → every rank; otherwise a comma-separated list of
// ranks (spaces ignored; entries that are not non-negative integers are
// ignored with one warning).
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
		var bad []string
		for _, f := range strings.Split(v, ",") {
			f = strings.TrimSpace(f)
			n, err := strconv.Atoi(f)
			if err != nil || n < 0 {
				bad = append(bad, strconv.Quote(f))
				continue
			}
			if n < ranks {
				sel[n] = true
			}
		}
		if len(bad) > 0 {
			warning = "TLLM_PROFILE_LOG_RANKS: ignoring entries that are not non-negative integers: " + strings.Join(bad, ", ")
		}
	}
	return sel, warning
}

// lockedWriter serialises whole records from several in-process ranks.
type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l lockedWriter) Write(b []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(b)
}

// openIterLogs opens one writer per selected rank ("{rank}" in path is
// replaced by the rank; ranks sharing a path share one file). Unselected
// ranks get nil. path "" disables the log; "-" is standard error. only >= 0
// opens that rank's log alone (one rank per process): several processes
// then need "{rank}" in the path, or they would truncate each other's file.
func openIterLogs(path string, ranks int, sel string, only int, log *zap.Logger) ([]io.Writer, func(), error) {
	out := make([]io.Writer, ranks)
	if path == "" {
		return out, func() {}, nil
	}
	chosen, warn := selectLogRanks(sel, ranks)
	if warn != "" {
		log.Warn(warn)
	}
	if only >= 0 {
		n := 0
		for _, c := range chosen {
			if c {
				n++
			}
		}
		if n > 1 && path != "-" && !strings.Contains(path, "{rank}") {
			return nil, nil, fmt.Errorf("--iter-log %q: %d processes would write one file; put {rank} in the path", path, n)
		}
		for r := range chosen {
			chosen[r] = chosen[r] && r == only
		}
	}
	files := map[string]lockedWriter{}
	var closers []*os.File
	closeAll := func() {
		for _, f := range closers {
			f.Close()
		}
	}
	for r := 0; r < ranks; r++ {
		if !chosen[r] {
			continue
		}
		p := strings.ReplaceAll(path, "{rank}", strconv.Itoa(r))
		if w, ok := files[p]; ok {
			out[r] = w
			continue
		}
		var w io.Writer = os.Stderr
		if p != "-" {
			f, err := os.Create(p)
			if err != nil {
				closeAll()
				return nil, nil, fmt.Errorf("--iter-log: %w", err)
			}
			closers = append(closers, f)
			w = f
		}
		lw := lockedWriter{mu: &sync.Mutex{}, w: w}
		files[p] = lw
		out[r] = lw
	}
	return out, closeAll, nil
}
