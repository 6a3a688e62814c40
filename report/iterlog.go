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
	for _, path := range files {
		if err := scanFile(path, fn); err != nil {
			return err
		}
	}
	return nil
}

func scanFile(path string, fn func(path string, line int, text []byte) error) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 1<<16), maxLogLine)
	line := 0
	for sc.Scan() {
		line++
		text := bytes.TrimSpace(sc.Bytes())
		if len(text) == 0 {
			continue
		}
		if err := fn(path, line, text); err != nil {
			return err
		}
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("%s:%d: %w", path, line+1, err)
	}
	return nil
}

// Keys says which keys of a record were present (not absent, not null)
// where the record type cannot tell: a zero rank and a missing one decode
// alike, and older workers wrote no gen_kv_tokens.
type Keys struct {
	Rank, Iter, GenKVTokens bool
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
	}
	if err := json.Unmarshal(b, &raw); err != nil {
		return rec, Keys{}, err
	}
	set := func(m json.RawMessage) bool { return len(m) > 0 && string(m) != "null" }
	return rec, Keys{Rank: set(raw.Rank), Iter: set(raw.Iter), GenKVTokens: set(raw.GenKVTokens)}, nil
}

// ReadCalibrationRecords reads the records the context-cost fit needs from
// every file (blank lines skipped). logM is the max_num_tokens the records
// agree on, or 0 when they do not say or disagree. An error names the file
// and line and what is wrong there.
func ReadCalibrationRecords(files []string) (recs []costfit.Record, logM int64, err error) {
	logM = -1
	err = ScanIterLogs(files, func(path string, line int, text []byte) error {
		rec, m, err := ParseCalibrationLine(text)
		if err != nil {
			return fmt.Errorf("%s:%d: %w", path, line, err)
		}
		switch {
		case logM == -1:
			logM = m
		case logM != m:
			logM = 0
		}
		recs = append(recs, rec)
		return nil
	})
	if err != nil {
		return nil, 0, err
	}
	return recs, max(logM, 0), nil
}

// ParseCalibrationLine decodes and checks one record for the fit; m is its
// max_num_tokens (0 when it has none).
func ParseCalibrationLine(b []byte) (costfit.Record, int64, error) {
	l, keys, err := DecodeIterRecord(b)
	if err != nil {
		return costfit.Record{}, 0, fmt.Errorf("not an iteration-log record: %w", err)
	}
	switch {
	case !keys.Rank || !keys.Iter:
		return costfit.Record{}, 0, errors.New(`a record needs "rank" and "iter" (is this an iteration log written by --iter-log?)`)
	case len(l.CtxRequestIDs) != len(l.CtxKVStart):
		return costfit.Record{}, 0, fmt.Errorf("ctx_request_ids has %d entries but ctx_kv_start %d", len(l.CtxRequestIDs), len(l.CtxKVStart))
	case l.NumCtxRequests < 0 || l.CtxTokens < 0 || l.CtxCachedKVTokens < 0 || l.CostS < 0:
		return costfit.Record{}, 0, errors.New("num_ctx_requests, ctx_tokens, ctx_cached_kv_tokens and cost_s must be ≥ 0")
	case slices.ContainsFunc(l.CtxKVStart, func(kv int) bool { return kv < 0 }):
		return costfit.Record{}, 0, errors.New("ctx_kv_start entries must be ≥ 0")
	}
	var kv []int64
	if l.CtxKVStart != nil {
		kv = make([]int64, len(l.CtxKVStart))
		for i, v := range l.CtxKVStart {
			kv[i] = int64(v)
		}
	}
	r := costfit.Record{Rank: l.Rank, Iter: l.Iter, NumCtxRequests: l.NumCtxRequests,
		CtxRequestIDs: l.CtxRequestIDs, CtxKVStart: kv, CtxTokens: int64(l.CtxTokens),
		CtxCachedKVTokens: int64(l.CtxCachedKVTokens), CostS: l.CostS}
	if l.DeviceMS != nil {
		r.DeviceMS = *l.DeviceMS
	}
	var m int64
	if l.MaxNumTokens != nil {
		m = int64(*l.MaxNumTokens)
	}
	return r, m, nil
}
