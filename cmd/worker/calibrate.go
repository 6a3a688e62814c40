package main

// `worker calibrate [flags] FILE...`: the offline context-cost fit of
// router-and-calibration.md §8 over per-rank iteration logs (executor.md
// §13), printed exactly as §8.3 says (docs/calibration.md). Exit status: 0 on
// success; 2 when no monopoly span exists (and for bad flags); 1 when an
// input cannot be read or the data give no usable fit.

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"

	"github.com/lockstep-ai/lockstep/report"

	"github.com/lockstep-ai/lockstep/internal/usage"

	"github.com/lockstep-ai/lockstep/scheduler/costfit"
)

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

	files, err := report.ExpandLogPaths(fs.Args())
	if err != nil {
		return err
	}
	for _, f := range files {
		if *plotPath != "" && report.SameFile(*plotPath, f) {
			return usage.Errorf("--plot %q is one of the iteration logs read: writing it would destroy it", *plotPath)
		}
	}
	logs, err := report.ReadCalibrationLogs(files)
	if err != nil {
		return err
	}
	for _, w := range logs.Warnings {
		fmt.Fprintf(stderr, "worker calibrate: warning: %s\n", w)
	}
	recs, logM := logs.Records, logs.MaxNumTokens
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
		if err := report.WriteCalibrationPlot(*plotPath, res); err != nil {
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
		return res.FormatYAML(stdout)
	}
	return res.Format(stdout)
}
