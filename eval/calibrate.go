package eval

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/lockstep-ai/lockstep/report"
	"github.com/lockstep-ai/lockstep/scheduler/costfit"
)

// calibrate fits A's logs as `worker calibrate` does and writes its plot.
func (ev *Evaluation) calibrate(logs string, m int64, plotPath string) *fitOutcome {
	f := &fitOutcome{logs: logs, plot: filepath.Base(plotPath)}
	files, err := report.ExpandLogPaths([]string{logs})
	if err != nil {
		f.err = err
		return f
	}
	read, err := report.ReadCalibrationLogs(files)
	if err != nil {
		f.err = err
		return f
	}
	recs := read.Records
	opt := costfit.DefaultOptions()
	opt.MaxNumTokens = m
	if f.result, f.err = costfit.Fit(recs, opt); f.err != nil {
		return f
	}
	var b strings.Builder
	f.result.Format(&b) //nolint:errcheck // a strings.Builder does not fail
	f.text = b.String()
	if err := report.WriteCalibrationPlot(plotPath, f.result); err != nil {
		f.err = fmt.Errorf("calibration plot: %w", err)
	}
	return f
}

// cpuCheck runs A–D on the CPU engine at small scale: real compute, real
// time, two in-process ranks, one run at a time (the wall clock is the
// measure).
func (ev *Evaluation) cpuCheck() error {
	e := ev.opt
	base := []string{"--engine", "cpu", "--model", "tiny", "--ranks", "2", "--trace", e.Trace, "--limit", "160",
		"--length-scale", "0.05", "--max-num-tokens", "256", "--tokens-per-page", "16", "--max-batch-size", "32",
		"--arrival-scale", "0"}
	logs := filepath.Join(e.Out, "iter", "A-context-cpu.{rank}.jsonl")
	ctx := append(slices.Clone(base), "--context-only")
	if _, err := ev.runAll("tiny", []job{{config: "A", workload: "context", load: "all-at-once", args: ctx, iterLog: logs}}, 1); err != nil {
		return err
	}
	ev.cpuFit = ev.calibrate(logs, 256, filepath.Join(e.Out, "calibration-cpu.png"))
	if ev.cpuFit.err != nil {
		ev.cpuNote = fmt.Sprintf("The CPU engine's logs gave no fit this time (%v): B and C are skipped on the CPU engine", ev.cpuFit.err)
	}
	var jobs []job
	for _, c := range []string{"A", "B", "C", "D"} {
		args, env, ok := ev.configure(c, base, ev.cpuFit)
		if !ok {
			continue
		}
		if c == "D" {
			// The CPU runs are short: refit often enough to publish.
			args = append(args, "--config", ev.cpuCalibConfig())
		}
		jobs = append(jobs, job{config: c, workload: "aggregated", load: "all-at-once", args: args, env: env})
	}
	_, err := ev.runAll("tiny", jobs, 1)
	return err
}

// cpuCalibConfig writes the small-run calibrator settings of the CPU check.
func (ev *Evaluation) cpuCalibConfig() string {
	p := filepath.Join(ev.opt.Out, "logs", "cpu-ctx-cost.yaml")
	os.WriteFile(p, []byte("scheduler:\n  ctx_cost:\n    min_samples: 32\n    window: 256\n    refresh_interval: 32\n"), 0o644) //nolint:errcheck // the run reports a missing file
	return p
}
