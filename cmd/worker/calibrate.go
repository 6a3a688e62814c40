package main

// `worker calibrate [flags] FILE...`: the offline context-cost fit of
// router-and-calibration.md §8 over per-rank iteration logs (executor.md
// §13), printed exactly as §8.3 says (docs/calibration.md). Exit status: 0 on
// success; 2 when no monopoly span exists (and for bad flags); 1 when an
// input cannot be read or the data give no usable fit.

import (
	"bufio"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/lockstep-ai/lockstep/internal/usage"

	"github.com/lockstep-ai/lockstep/scheduler/costfit"
)

// rankPlaceholder is the iteration log's per-rank path placeholder
// (--iter-log 'DIR/iter.{rank}.jsonl').
const rankPlaceholder = "{rank}"

// maxLogLine bounds one JSON line (a deep batch lists many request ids).
const maxLogLine = 64 << 20

func runCalibrate(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("calibrate", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), `usage: worker calibrate [flags] FILE...

Fits kv_cost_offset and kv_depth_threshold for equal-cost chunking from the
iteration logs of a run with equal-cost chunking off (docs/calibration.md).
FILE is a JSON Lines iteration log; one argument may contain {rank}
('DIR/iter.{rank}.jsonl') to read every rank's file.

flags:
`)
		fs.PrintDefaults()
	}
	def := costfit.DefaultOptions()
	m := fs.Int64("max-num-tokens", def.MaxNumTokens, "M, the token budget of the logged run")
	pct := fs.Float64("kv-depth-threshold-percentile", def.Percentile, "percentile p of the midpoint depths that becomes kv_depth_threshold")
	minSpan := fs.Int("min-span", def.MinSpan, "shortest run of monopoly iterations that counts as a span")
	warmup := fs.Int64("warmup-iters", def.WarmupIters, "iterations below this are left out of the threshold, waste and gain")
	asYAML := fs.Bool("yaml", false, "print the result as a config snippet (scheduler.equal_cost) instead of the report")
	asJSON := fs.Bool("json", false, "print every figure of the result as one JSON object instead of the report")
	plotPath := fs.String("plot", "", "also write the calibration plot to this PNG file")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return usage.Wrap(err)
	}
	if fs.NArg() == 0 {
		return usage.Errorf("no iteration log given (usage: worker calibrate [flags] FILE... or 'DIR/iter.{rank}.jsonl')")
	}
	if *asYAML && *asJSON {
		return usage.Errorf("--yaml and --json are exclusive")
	}
	opt := costfit.Options{MaxNumTokens: *m, Percentile: *pct, MinSpan: *minSpan, WarmupIters: *warmup}

	files, err := expandLogPaths(fs.Args())
	if err != nil {
		return err
	}
	recs, logM, err := readIterLogs(files)
	if err != nil {
		return err
	}
	if len(recs) == 0 {
		return fmt.Errorf("no iteration-log records in %s (was the run started with --iter-log and TLLM_PROFILE_LOG_RANKS=all?)",
			strings.Join(files, ", "))
	}
	if logM > 0 && logM != opt.MaxNumTokens {
		fmt.Fprintf(stderr, "worker calibrate: warning: the logs record max_num_tokens %d but the fit uses M = %d; pass --max-num-tokens %d\n",
			logM, opt.MaxNumTokens, logM)
	}
	res, err := costfit.Fit(recs, opt)
	switch {
	case errors.Is(err, costfit.ErrNoSpan), errors.Is(err, costfit.ErrOptions):
		return usage.Wrap(err) // exit 2, as §8.3 specifies for "no monopoly span"
	case err != nil:
		return err
	}
	if *plotPath != "" {
		if err := writeCalibrationPlot(*plotPath, res); err != nil {
			return fmt.Errorf("--plot %s: %w", *plotPath, err)
		}
	}
	switch {
	case *asJSON:
		b, err := json.Marshal(res)
		if err != nil {
			return fmt.Errorf("encoding the result: %w", err)
		}
		_, err = stdout.Write(append(b, '\n'))
		return err
	case *asYAML:
		return writeCalibrationYAML(stdout, res)
	}
	return res.Format(stdout)
}

// writeCalibrationYAML prints the fit as a config snippet for worker run's
// --config file (docs/config.md), with the figures it rests on as comments.
func writeCalibrationYAML(w io.Writer, r *costfit.Result) error {
	_, err := fmt.Fprintf(w, `# worker calibrate: %d monopoly samples in %d spans over %d ranks;
# slope %.3f us per KV token at N=%d, intercept %.1f ms, kv_cost_offset range [%.0f, %.0f],
# kv_depth_threshold = p%v of the midpoint depths (%.0f).
scheduler:
  equal_cost:
    kv_cost_offset: %d
    kv_depth_threshold: %d
`, len(r.Samples), len(r.Spans), r.Ranks, 1000*r.SlopeMS, r.Options.MaxNumTokens, r.InterceptMS,
		r.OffsetLo, r.OffsetHi, r.Options.Percentile, r.ThresholdRaw, r.Offset, r.Threshold)
	return err
}

// expandLogPaths turns the arguments into files: an argument containing
// {rank} matches every file whose placeholder part is a non-negative integer
// (ordered by rank); other arguments are taken as they are. A pattern that
// matches nothing is an error naming it.
func expandLogPaths(args []string) ([]string, error) {
	var files []string
	for _, a := range args {
		if !strings.Contains(a, rankPlaceholder) {
			files = append(files, a)
			continue
		}
		parts := strings.Split(a, rankPlaceholder)
		globParts := make([]string, len(parts))
		reParts := make([]string, len(parts))
		for i, p := range parts {
			globParts[i] = escapeGlob(p)
			reParts[i] = regexp.QuoteMeta(p)
		}
		matches, err := filepath.Glob(strings.Join(globParts, "*"))
		if err != nil {
			return nil, fmt.Errorf("%s: %w", a, err)
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
			return nil, fmt.Errorf("%s: no file matches (the {rank} part must be a rank number, e.g. %s)", a,
				strings.ReplaceAll(a, rankPlaceholder, "0"))
		}
		slices.SortFunc(found, func(x, y ranked) int { return x.rank - y.rank })
		for _, f := range found {
			files = append(files, f.path)
		}
	}
	return files, nil
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

// iterLogLine is what the fit reads from one iteration-log record
// (executor.IterRecord); other fields are ignored.
type iterLogLine struct {
	Rank              *int     `json:"rank"`
	Iter              *int64   `json:"iter"`
	DeviceMS          *float64 `json:"device_ms"`
	NumCtxRequests    int      `json:"num_ctx_requests"`
	CtxTokens         int64    `json:"ctx_tokens"`
	CtxRequestIDs     []uint64 `json:"ctx_request_ids"`
	CtxKVStart        []int64  `json:"ctx_kv_start"`
	CtxCachedKVTokens int64    `json:"ctx_cached_kv_tokens"`
	CostS             float64  `json:"cost_s"`
	MaxNumTokens      *int64   `json:"max_num_tokens"`
}

// readIterLogs parses every file's JSON Lines (blank lines skipped). logM is
// the max_num_tokens the records agree on, or 0 when they do not say or
// disagree. An error names the file and line and what is wrong there.
func readIterLogs(files []string) (recs []costfit.Record, logM int64, err error) {
	logM = -1
	for _, path := range files {
		f, err := os.Open(path)
		if err != nil {
			return nil, 0, err
		}
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 0, 1<<16), maxLogLine)
		line := 0
		for sc.Scan() {
			line++
			text := strings.TrimSpace(sc.Text())
			if text == "" {
				continue
			}
			rec, m, err := parseIterLogLine([]byte(text))
			if err != nil {
				f.Close()
				return nil, 0, fmt.Errorf("%s:%d: %w", path, line, err)
			}
			switch {
			case logM == -1:
				logM = m
			case logM != m:
				logM = 0
			}
			recs = append(recs, rec)
		}
		err = sc.Err()
		f.Close()
		if err != nil {
			return nil, 0, fmt.Errorf("%s:%d: %w", path, line+1, err)
		}
	}
	return recs, max(logM, 0), nil
}

// parseIterLogLine decodes and checks one record.
func parseIterLogLine(b []byte) (costfit.Record, int64, error) {
	var l iterLogLine
	if err := json.Unmarshal(b, &l); err != nil {
		return costfit.Record{}, 0, fmt.Errorf("not an iteration-log record: %w", err)
	}
	switch {
	case l.Rank == nil || l.Iter == nil:
		return costfit.Record{}, 0, errors.New(`a record needs "rank" and "iter" (is this an iteration log written by --iter-log?)`)
	case len(l.CtxRequestIDs) != len(l.CtxKVStart):
		return costfit.Record{}, 0, fmt.Errorf("ctx_request_ids has %d entries but ctx_kv_start %d", len(l.CtxRequestIDs), len(l.CtxKVStart))
	case l.NumCtxRequests < 0 || l.CtxTokens < 0 || l.CtxCachedKVTokens < 0 || l.CostS < 0:
		return costfit.Record{}, 0, errors.New("num_ctx_requests, ctx_tokens, ctx_cached_kv_tokens and cost_s must be ≥ 0")
	case slices.ContainsFunc(l.CtxKVStart, func(kv int64) bool { return kv < 0 }):
		return costfit.Record{}, 0, errors.New("ctx_kv_start entries must be ≥ 0")
	}
	r := costfit.Record{Rank: *l.Rank, Iter: *l.Iter, NumCtxRequests: l.NumCtxRequests,
		CtxRequestIDs: l.CtxRequestIDs, CtxKVStart: l.CtxKVStart, CtxTokens: l.CtxTokens,
		CtxCachedKVTokens: l.CtxCachedKVTokens, CostS: l.CostS}
	if l.DeviceMS != nil {
		r.DeviceMS = *l.DeviceMS
	}
	var m int64
	if l.MaxNumTokens != nil {
		m = *l.MaxNumTokens
	}
	return r, m, nil
}
