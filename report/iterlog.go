package report

// Readers of the per-rank iteration logs (--iter-log, executor.md §13): the
// input of `worker calibrate`, `worker twin-profile --fit` and the
// evaluation's calibration. Every reader decodes the executor's own record
// type, executor.IterRecord, so a field renamed there is renamed here.

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/lockstep-ai/lockstep/executor"
	"github.com/lockstep-ai/lockstep/scheduler/costfit"
)

// RankPlaceholder is the iteration log's per-rank path placeholder
// (--iter-log 'DIR/iter.{rank}.jsonl').
const RankPlaceholder = "{rank}"

// maxLogLine bounds one JSON line (a deep batch lists many request ids).
const maxLogLine = 64 << 20

// ExpandLogPaths turns arguments into files: an argument containing {rank}
// matches every file whose placeholder part is a non-negative integer
// (ordered by rank); other arguments are taken as they are. A pattern that
// matches nothing is an error naming it.
func ExpandLogPaths(args []string) ([]string, error) {
	var files []string
	for _, a := range args {
		if !strings.Contains(a, RankPlaceholder) {
			files = append(files, a)
			continue
		}
		found, err := rankFiles(a)
		if err != nil {
			return nil, err
		}
		files = append(files, found...)
	}
	return files, nil
}

// rankFiles lists the files a {rank} pattern matches, by rank.
func rankFiles(pattern string) ([]string, error) {
	parts := strings.Split(pattern, RankPlaceholder)
	globParts := make([]string, len(parts))
	reParts := make([]string, len(parts))
	for i, p := range parts {
		globParts[i] = escapeGlob(p)
		reParts[i] = regexp.QuoteMeta(p)
	}
	matches, err := filepath.Glob(strings.Join(globParts, "*"))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", pattern, err)
	}
	re := regexp.MustCompile("^" + strings.Join(reParts, `(\d+)`) + "$")
	type ranked struct {
		rank int
		path string
	}
	var found []ranked
	for _, f := range matches {
		sub := re.FindStringSubmatch(f)
		if sub == nil || !sameGroups(sub[1:]) {
			continue
		}
		r, err := strconv.Atoi(sub[1])
		if err != nil {
			continue
		}
		found = append(found, ranked{r, f})
	}
	if len(found) == 0 {
		return nil, fmt.Errorf("%s: no file matches (the {rank} part must be a rank number, e.g. %s)", pattern,
			strings.ReplaceAll(pattern, RankPlaceholder, "0"))
	}
	slices.SortFunc(found, func(x, y ranked) int { return x.rank - y.rank })
	out := make([]string, len(found))
	for i, f := range found {
		out[i] = f.path
	}
	return out, nil
}

// escapeGlob quotes filepath.Match's metacharacters in a literal path part.
func escapeGlob(s string) string {
	var b strings.Builder
	for _, c := range s {
		if strings.ContainsRune(`*?[\`, c) {
			b.WriteByte('\\')
		}
		b.WriteRune(c)
	}
	return b.String()
}

// sameGroups reports whether every {rank} occurrence matched the same number.
func sameGroups(g []string) bool {
	for _, s := range g {
		if s != g[0] {
			return false
		}
	}
	return true
}

// ScanIterLogs calls fn with every non-blank line of files, in order, with
// its file and 1-based line number. fn's error stops the scan and is
// returned as it is; a read error is returned as "FILE:LINE: error".
func ScanIterLogs(files []string, fn func(path string, line int, text []byte) error) error {
	return ScanIterLogsTolerant(files, fn, nil)
}

// ScanIterLogsTolerant is ScanIterLogs, except that when truncated is not
// nil a file's last line that has no newline and that fn refuses (what a
// killed run leaves behind) is handed to truncated instead of stopping the
// scan.
func ScanIterLogsTolerant(files []string, fn func(path string, line int, text []byte) error,
	truncated func(path string, line int, err error)) error {
	for _, path := range files {
		if err := scanFile(path, fn, truncated); err != nil {
			return err
		}
	}
	return nil
}

func scanFile(path string, fn func(path string, line int, text []byte) error, truncated func(string, int, error)) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	rd := bufio.NewReaderSize(f, 1<<16)
	line := 0
	var long []byte
	for {
		chunk, err := rd.ReadSlice('\n')
		if err == bufio.ErrBufferFull {
			// A line longer than the buffer: gather it, within the bound.
			long = append(long, chunk...)
			if len(long) > maxLogLine {
				return fmt.Errorf("%s:%d: a line longer than %d bytes", path, line+1, maxLogLine)
			}
			continue
		}
		if err != nil && err != io.EOF {
			return fmt.Errorf("%s:%d: %w", path, line+1, err)
		}
		text := chunk
		if long != nil {
			text = append(long, chunk...)
			long = nil
		}
		if len(text) > 0 {
			line++
		}
		terminated := bytes.HasSuffix(text, []byte("\n"))
		if t := bytes.TrimSpace(text); len(t) > 0 {
			if ferr := fn(path, line, t); ferr != nil {
				if !terminated && err == io.EOF && truncated != nil {
					truncated(path, line, ferr)
					return nil
				}
				return ferr
			}
		}
		if err == io.EOF {
			return nil
		}
	}
}

// Keys says which keys of a record were present (not absent, not null)
// where the record type cannot tell: a zero rank and a missing one decode
// alike, older workers wrote no gen_kv_tokens, and workers before issue
// 24 no iter_ms (their host_ms was the iteration's wall time, not its
// host CPU time).
type Keys struct {
	Rank, Iter, GenKVTokens, IterMS bool
}

// DecodeIterRecord decodes one iteration-log line.
func DecodeIterRecord(b []byte) (executor.IterRecord, Keys, error) {
	var rec executor.IterRecord
	if err := json.Unmarshal(b, &rec); err != nil {
		return rec, Keys{}, err
	}
	var raw struct {
		Rank        json.RawMessage `json:"rank"`
		Iter        json.RawMessage `json:"iter"`
		GenKVTokens json.RawMessage `json:"gen_kv_tokens"`
		IterMS      json.RawMessage `json:"iter_ms"`
	}
	if err := json.Unmarshal(b, &raw); err != nil {
		return rec, Keys{}, err
	}
	set := func(m json.RawMessage) bool { return len(m) > 0 && string(m) != "null" }
	return rec, Keys{Rank: set(raw.Rank), Iter: set(raw.Iter), GenKVTokens: set(raw.GenKVTokens), IterMS: set(raw.IterMS)}, nil
}

// CalibrationLogs is what the context-cost fit reads from iteration logs.
type CalibrationLogs struct {
	Records []costfit.Record
	// MaxNumTokens is the max_num_tokens the records agree on; 0 when they
	// do not say or disagree.
	MaxNumTokens int64
	// Warnings are what the fit's user should know before trusting it:
	// ranks missing from the logs, records of an older worker, a
	// truncated last line.
	Warnings []string
}

// ReadCalibrationLogs reads the records the context-cost fit needs from
// every file (blank lines skipped). An error names the file and line and
// what is wrong there; a file's truncated last line (a killed run) is
// skipped with a warning.
func ReadCalibrationLogs(files []string) (CalibrationLogs, error) {
	var out CalibrationLogs
	logM := int64(-1)
	legacy := 0
	err := ScanIterLogsTolerant(files, func(path string, line int, text []byte) error {
		cl, err := ParseCalibrationLine(text)
		if err != nil {
			return fmt.Errorf("%s:%d: %w", path, line, err)
		}
		switch {
		case logM == -1:
			logM = cl.MaxNumTokens
		case logM != cl.MaxNumTokens:
			logM = 0
		}
		if cl.Legacy {
			legacy++
		}
		out.Records = append(out.Records, cl.Record)
		return nil
	}, func(path string, line int, _ error) {
		out.Warnings = append(out.Warnings, fmt.Sprintf("%s:%d: the last line is cut short (was the run killed?); it is skipped", path, line))
	})
	if err != nil {
		return CalibrationLogs{}, err
	}
	out.MaxNumTokens = max(logM, 0)
	if legacy > 0 {
		out.Warnings = append(out.Warnings, fmt.Sprintf("%d records have no fleet_device_ms (written by an older worker): "+
			"their iteration time is taken as device_ms + wait_ms", legacy))
	}
	out.Warnings = append(out.Warnings, missingRanks(out.Records)...)
	return out, nil
}

// missingRanks warns when the logs cannot show the lockstep: one rank
// alone (its iterations never wait for a slower one: waste 0 %, gain
// 1.00×), or rank numbers with gaps.
func missingRanks(recs []costfit.Record) []string {
	seen := map[int]bool{}
	top := -1
	for _, r := range recs {
		seen[r.Rank] = true
		top = max(top, r.Rank)
	}
	switch {
	case len(seen) == 0:
		return nil
	case len(seen) == 1:
		return []string{fmt.Sprintf("the logs hold rank %d only: the fit needs every rank's log to see the lockstep "+
			"(the waste and gain of one rank are 0 %% and 1.00×); run with TLLM_PROFILE_LOG_RANKS=all and pass 'DIR/iter.{rank}.jsonl'", top)}
	}
	var missing []string
	for r := 0; r < top; r++ {
		if !seen[r] {
			missing = append(missing, strconv.Itoa(r))
		}
	}
	if len(missing) == 0 {
		return nil
	}
	return []string{fmt.Sprintf("the logs hold ranks up to %d but not rank %s: the lockstep figures leave those ranks out",
		top, strings.Join(missing, ", "))}
}

// CalibrationLine is one iteration-log record as the fit reads it.
type CalibrationLine struct {
	costfit.Record
	// MaxNumTokens is the record's max_num_tokens (0 when it has none).
	MaxNumTokens int64
	// Legacy: the record has no fleet_device_ms (an older worker's); its
	// iteration time is device_ms + wait_ms.
	Legacy bool
}

// ParseCalibrationLine decodes and checks one record for the fit. The
// record's iteration time (costfit.Record.DeviceMS, the fit's T(it)) is
// fleet_device_ms, the fleet's time for the forward.
func ParseCalibrationLine(b []byte) (CalibrationLine, error) {
	l, keys, err := DecodeIterRecord(b)
	if err != nil {
		return CalibrationLine{}, fmt.Errorf("not an iteration-log record: %w", err)
	}
	switch {
	case !keys.Rank || !keys.Iter:
		return CalibrationLine{}, errors.New(`a record needs "rank" and "iter" (is this an iteration log written by --iter-log?)`)
	case len(l.CtxRequestIDs) != len(l.CtxKVStart):
		return CalibrationLine{}, fmt.Errorf("ctx_request_ids has %d entries but ctx_kv_start %d", len(l.CtxRequestIDs), len(l.CtxKVStart))
	case l.NumCtxRequests < 0 || l.CtxTokens < 0 || l.CtxCachedKVTokens < 0 || l.CostS < 0:
		return CalibrationLine{}, errors.New("num_ctx_requests, ctx_tokens, ctx_cached_kv_tokens and cost_s must be ≥ 0")
	case slices.ContainsFunc(l.CtxKVStart, func(kv int) bool { return kv < 0 }):
		return CalibrationLine{}, errors.New("ctx_kv_start entries must be ≥ 0")
	}
	var kv []int64
	if l.CtxKVStart != nil {
		kv = make([]int64, len(l.CtxKVStart))
		for i, v := range l.CtxKVStart {
			kv[i] = int64(v)
		}
	}
	out := CalibrationLine{Record: costfit.Record{Rank: l.Rank, Iter: l.Iter, NumCtxRequests: l.NumCtxRequests,
		CtxRequestIDs: l.CtxRequestIDs, CtxKVStart: kv, CtxTokens: int64(l.CtxTokens),
		CtxCachedKVTokens: int64(l.CtxCachedKVTokens), CostS: l.CostS}}
	switch {
	case l.FleetDeviceMS != nil:
		out.DeviceMS = *l.FleetDeviceMS
	case l.DeviceMS != nil:
		out.DeviceMS, out.Legacy = *l.DeviceMS+max(l.WaitMS, 0), true
	}
	if l.MaxNumTokens != nil {
		out.MaxNumTokens = int64(*l.MaxNumTokens)
	}
	return out, nil
}
